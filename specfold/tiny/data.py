"""Seeded generator of easy two-step arithmetic word problems in GSM8K format.

Each problem is `{"question": str, "answer": str}`; the answer is a worked solution that writes every
intermediate computation explicitly and ends with a `#### <answer>` line, e.g.

    question: Tom has 7 apples. He gets 5 more apples. Then he gives away 3 apples.
              How many apples does Tom have now?
    answer:   Tom has 7 apples. He gets 5 more: 7+5=12. He gives away 3: 12-3=9.
              #### 9

Difficulty (see README.md): exactly two steps, each `+` or `-`, operands 1..10, every intermediate
and final result kept in 0..30 (never negative).

The streams are shared with the `choices` task (specfold.tiny.choices): `heldout` and `TrainStream`
take the task's `make_problem` (default: this module's).

Invariants:
- `heldout(seed)` is a pure function of the seed; `train_stream(seed, exclude)` never yields a question
  whose text is in `exclude` (the held-out set is disjoint from training by question text);
- the stream is driven by one `random.Random`, whose state can be saved and restored (resumable).
"""
from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Callable, Iterator

NAMES = [("Tom", "he"), ("Anna", "she"), ("Ben", "he"), ("Mia", "she"), ("Sam", "he"),
         ("Lily", "she"), ("Max", "he"), ("Emma", "she"), ("Leo", "he"), ("Zoe", "she"),
         ("Jack", "he"), ("Lucy", "she")]
OBJECTS = ["apples", "books", "marbles", "pens", "cards", "stickers", "coins", "toys",
           "shells", "cookies", "stamps", "balls"]
ADD = [("gets", "gets {n} more {obj}"), ("buys", "buys {n} more {obj}"),
       ("finds", "finds {n} more {obj}")]
SUB = [("gives away", "gives away {n} {obj}"), ("loses", "loses {n} {obj}"),
       ("sells", "sells {n} {obj}")]
MAX_OPERAND = 10
HELDOUT_SIZE = 500


def draw_numbers(rng: random.Random, max_operand: int = MAX_OPERAND,
                 max_value: int = 3 * MAX_OPERAND) -> tuple[int, list[str], list[int], list[int]]:
    """The start a and two changes (op, amount), operands 1..max_operand, drawn again until every
    running total is in 0..max_value -> (a, ops, amounts, running totals). Both tasks draw their
    numbers here (the same draws from `rng`, so their seeded streams are unchanged)."""
    while True:
        a = rng.randint(1, max_operand)
        ops = [rng.choice("+-") for _ in range(2)]
        nums = [rng.randint(1, max_operand) for _ in range(2)]
        vals, v = [], a
        for op, n in zip(ops, nums):
            v = v + n if op == "+" else v - n
            vals.append(v)
        if all(0 <= x <= max_value for x in vals):
            return a, ops, nums, vals


def make_problem(rng: random.Random) -> dict:
    name, pron = rng.choice(NAMES)
    obj = rng.choice(OBJECTS)
    a, ops, nums, vals = draw_numbers(rng)
    Pron = pron.capitalize()
    q_parts, a_parts = [f"{name} has {a} {obj}."], [f"{name} has {a} {obj}."]
    prev = a
    for i, (op, n, v) in enumerate(zip(ops, nums, vals)):
        verb, phrase = rng.choice(ADD if op == "+" else SUB)
        text = phrase.format(n=n, obj=obj)
        q_parts.append(f"{Pron} {text}." if i == 0 else f"Then {pron} {text}.")
        more = " more" if op == "+" else ""
        a_parts.append(f"{Pron} {verb} {n}{more}: {prev}{op}{n}={v}.")
        prev = v
    q_parts.append(f"How many {obj} does {name} have now?")
    return {"question": " ".join(q_parts), "answer": " ".join(a_parts) + f"\n#### {vals[-1]}"}


Maker = Callable[[random.Random], dict]


def heldout(seed: int, n: int = HELDOUT_SIZE, make: Maker | None = None) -> list[dict]:
    """`n` distinct problems (by question text) drawn from a stream separate from training's."""
    make = make or make_problem
    rng = random.Random(f"heldout-{seed}")
    seen: set[str] = set()
    out = []
    while len(out) < n:
        p = make(rng)
        if p["question"] not in seen:
            seen.add(p["question"])
            out.append(p)
    return out


class TrainStream:
    """Infinite seeded stream of training problems, skipping held-out questions; resumable."""

    def __init__(self, seed: int, exclude: set[str], make: Maker | None = None):
        self.rng = random.Random(f"train-{seed}")
        self.exclude = exclude
        self.make = make or make_problem

    def __iter__(self) -> Iterator[dict]:
        return self

    def __next__(self) -> dict:
        while True:
            p = self.make(self.rng)
            if p["question"] not in self.exclude:
                return p

    def state(self):
        return self.rng.getstate()

    def set_state(self, state) -> None:
        self.rng.setstate(state)


_EQUATION = re.compile(r"(\d+)([+-])(\d+)=(\d+)")


def equations(text: str) -> list[tuple[int, str, int, int]]:
    """Every `x+y=z` / `x-y=z` written in `text`."""
    return [(int(x), op, int(y), int(z)) for x, op, y, z in _EQUATION.findall(text)]


def well_formed(text: str) -> bool:
    """A worked solution: at least one equation, all of them right, and a numeric `#### n` line."""
    eqs = equations(text)
    fa = final_answer(text)
    return (bool(eqs) and all((x + y if op == "+" else x - y) == z for x, op, y, z in eqs)
            and fa is not None and fa.isdigit())


def final_answer(text: str) -> str | None:
    """The text after the last `####`, stripped (None when absent)."""
    if "####" not in text:
        return None
    return text.rsplit("####", 1)[1].strip().split("\n")[0].strip()


def save_jsonl(problems: list[dict], path: str | Path) -> None:
    with open(path, "w") as f:
        for p in problems:
            f.write(json.dumps(p) + "\n")


def load_jsonl(path: str | Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
