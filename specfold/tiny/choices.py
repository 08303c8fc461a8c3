"""The `choices` task: two-step word problems whose worked solutions have real choice points.

Each problem is `{"question": str, "answer": str}`; the answer is a worked solution ending with the
GSM8K final line `#### <answer>`. The arithmetic is small (two `+`/`-` changes, operands 1..10,
every intermediate and final result in 0..30), but the worked solution is drawn from many valid
continuations, the way a real LM's answer is:

    question: Mia has 7 shells. She finds 5 more shells. Later she sells 3 shells.
              How many shells does Mia have now?
    answers:  Mia has 7 shells. She finds 5 more shells: 7+5=12. She sells 3 shells: 12-3=9.
              So Mia has 9 shells now.
              #### 9
              At first she has 7 shells. The net change is 5-3=2. 7+2=9. She ends with 9.
              #### 9
              Mia has 7 shells. 7-3=4. After she finds 5 shells, she has 4+5=9. So Mia has 9 shells now.
              #### 9

Choice points of the answer (see `answer_program`): two phrasings of the restated start; the
strategy (the changes in story order, in reverse order, or their net change first), which decides
the intermediate numbers; three phrasings of different lengths for every step, with or without the
amount restated; the order of the summands of the net strategy's additions; two closing sentences.
Names and objects come from pools of 40 and 30 and the question has varied phrasing, so no name,
object or number sits at a fixed template position.

The answer is written by `answer_program(facts, chooser)`, which asks `chooser.choose(options,
weights)` at each choice point. A `Sampler` draws with a `random.Random`; `enumerate_answers(facts)`
replays the program over every path and returns every possible answer with its probability (used by
the tests and by `specfold.tiny.oracle`, the Bayes-optimal denoiser of this task).

Held-out set and training stream: `specfold.tiny.data.heldout` / `TrainStream` with this module's
`make_problem` (same seeding, so the same invariants: disjoint by question text, resumable).

Invariant: every answer's final line is `#### v` with v the true result, and
`specfold.tiny.data.final_answer` parses it; `enumerate_answers` sums to probability 1.
"""
from __future__ import annotations

import random
from typing import Sequence

from specfold.tiny import data as D

NAMES = [("Tom", "he"), ("Anna", "she"), ("Ben", "he"), ("Mia", "she"), ("Sam", "he"),
         ("Lily", "she"), ("Max", "he"), ("Emma", "she"), ("Leo", "he"), ("Zoe", "she"),
         ("Jack", "he"), ("Lucy", "she"), ("Omar", "he"), ("Nina", "she"), ("Paul", "he"),
         ("Rosa", "she"), ("Ivan", "he"), ("Kate", "she"), ("Hugo", "he"), ("Ella", "she"),
         ("Adam", "he"), ("Sara", "she"), ("Luke", "he"), ("Ruth", "she"), ("Noah", "he"),
         ("Ava", "she"), ("Eli", "he"), ("Ida", "she"), ("Finn", "he"), ("Maya", "she"),
         ("Carl", "he"), ("Jane", "she"), ("Dan", "he"), ("Amy", "she"), ("Raj", "he"),
         ("Lena", "she"), ("Tim", "he"), ("Cleo", "she"), ("Owen", "he"), ("Iris", "she")]
OBJECTS = ["apples", "books", "marbles", "pens", "cards", "stickers", "coins", "toys", "shells",
           "cookies", "stamps", "balls", "pencils", "rocks", "beads", "candles", "cups", "hats",
           "kites", "leaves", "nuts", "plums", "ribbons", "seeds", "shirts", "socks", "spoons",
           "tickets", "tiles", "eggs"]
ADD_VERBS = ["gets", "buys", "finds", "wins", "receives", "picks up"]
SUB_VERBS = ["gives away", "loses", "sells", "drops", "uses", "trades away"]
MAX_OPERAND = 10
MAX_VALUE = 30


# ----------------------------------------------------------------------------------- choosers
class Sampler:
    """Draws each choice at random (weights relative)."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def choose(self, options: Sequence, weights: Sequence[float] | None = None):
        return self.rng.choices(options, weights)[0]


class _Replay:
    """Follows a fixed path of option indices, extending it with 0s; records sizes and probability."""

    def __init__(self, path: list[int]):
        self.path, self.sizes, self.i, self.prob = path, [], 0, 1.0

    def choose(self, options: Sequence, weights: Sequence[float] | None = None):
        w = list(weights) if weights is not None else [1.0] * len(options)
        if self.i == len(self.path):
            self.path.append(0)
        k = self.path[self.i]
        self.sizes.append(len(options))
        self.prob *= w[k] / sum(w)
        self.i += 1
        return options[k]


def enumerate_answers(facts: dict) -> dict[str, float]:
    """Every answer `answer_program(facts, .)` can write, with its probability (they sum to 1)."""
    out: dict[str, float] = {}
    path: list[int] = []
    while True:
        r = _Replay(path)
        text = answer_program(facts, r)
        out[text] = out.get(text, 0.0) + r.prob
        path = r.path[: r.i]
        j = len(path) - 1
        while j >= 0 and path[j] == r.sizes[j] - 1:
            j -= 1
        if j < 0:
            return out
        path = path[:j] + [path[j] + 1]


# ------------------------------------------------------------------------------------- facts
def sample_facts(rng: random.Random) -> dict:
    """The problem's content: who, what, the start and the two changes (op, amount, verb)."""
    name, pron = rng.choice(NAMES)
    obj = rng.choice(OBJECTS)
    a, ops, nums, _ = D.draw_numbers(rng, MAX_OPERAND, MAX_VALUE)
    verbs = [rng.choice(ADD_VERBS if op == "+" else SUB_VERBS) for op in ops]
    return {"name": name, "pron": pron, "obj": obj, "start": a,
            "changes": [[op, n, verb] for op, n, verb in zip(ops, nums, verbs)]}


def result(facts: dict) -> int:
    v = facts["start"]
    for op, n, _ in facts["changes"]:
        v = v + n if op == "+" else v - n
    return v


# --------------------------------------------------------------------------------- the texts
def question_program(f: dict, c) -> str:
    name, pron, obj, a = f["name"], f["pron"], f["obj"], f["start"]
    parts = [c.choose([f"{name} has {a} {obj}.", f"{name} owns {a} {obj}.",
                       f"{name} has a box with {a} {obj}."], [3, 1, 1])]
    for i, (op, n, verb) in enumerate(f["changes"]):
        more = c.choose([" more", ""]) if op == "+" else ""
        lead = pron.capitalize() if i == 0 else c.choose(["Then", "Later", "After that,"]) + f" {pron}"
        parts.append(f"{lead} {verb} {n}{more} {obj}.")
    parts.append(c.choose([f"How many {obj} does {name} have now?",
                           f"How many {obj} does {name} have at the end?"]))
    return " ".join(parts)


def _expr(c, x: int, op: str, y: int) -> str:
    """`x+y` or, for an addition, sometimes `y+x`."""
    if op == "+":
        return c.choose([f"{x}+{y}", f"{y}+{x}"], [4, 1])
    return f"{x}-{y}"


def _step(c, f: dict, change, prev: int) -> tuple[str, int]:
    """One change applied to the running total, in one of three phrasings."""
    op, n, verb = change
    pron = f["pron"]
    v = prev + n if op == "+" else prev - n
    e = f"{prev}{op}{n}={v}"
    more = " more" if op == "+" else ""
    obj = f["obj"]
    options = [f"{pron.capitalize()} {verb} {n}{more} {obj}: {e}.",
               f"After {pron} {verb} {n} {obj}, {pron} has {e}.",
               f"{e}."]
    weights = [6, 2, 2]
    return c.choose(options, weights), v


def _net(c, f: dict) -> list[str]:
    """The changes combined first, then applied once to the start."""
    (o1, n1, _), (o2, n2, _) = f["changes"]
    pron, a = f["pron"], f["start"]
    P = pron.capitalize()
    g = (n1 if o1 == "+" else 0) + (n2 if o2 == "+" else 0)
    l_ = (n1 if o1 == "-" else 0) + (n2 if o2 == "-" else 0)
    if o1 == o2:
        s = f"{_expr(c, n1, '+', n2)}={n1 + n2}"
        if o1 == "+":
            first = c.choose([f"{P} gets {s} more in all.", f"In all {pron} gains {s}."])
        else:
            first = c.choose([f"{P} loses {s} in all.", f"In all {pron} gives up {s}."])
        op, d = o1, n1 + n2
    elif g >= l_:
        d, op = g - l_, "+"
        first = c.choose([f"The net change is {g}-{l_}={d}.", f"{P} gains {g}-{l_}={d} in all."])
    else:
        d, op = l_ - g, "-"
        first = c.choose([f"The net loss is {l_}-{g}={d}.", f"{P} loses {l_}-{g}={d} in all."])
    v = a + d if op == "+" else a - d
    e = f"{_expr(c, a, op, d)}={v}"
    return [first, c.choose([f"{e}.", f"{P} has {e}.", f"So {e}."], [2, 1, 1])]


def answer_program(f: dict, c) -> str:
    """The worked solution; every choice goes through `c.choose`."""
    name, pron, obj, a = f["name"], f["pron"], f["obj"], f["start"]
    parts = []
    opening = c.choose([f"{name} has {a} {obj}.", f"At first {pron} has {a} {obj}."], [4, 1])
    if opening:
        parts.append(opening)
    ch = f["changes"]
    strategies, weights = ["story", "net"], [6, 2]
    rev_mid = a + ch[1][1] if ch[1][0] == "+" else a - ch[1][1]
    if 0 <= rev_mid <= MAX_VALUE:
        strategies.append("reverse")
        weights.append(2)
    strategy = c.choose(strategies, weights)
    if strategy == "net":
        parts += _net(c, f)
    else:
        order = ch if strategy == "story" else ch[::-1]
        v = a
        for change in order:
            text, v = _step(c, f, change, v)
            parts.append(text)
    v = result(f)
    closing = c.choose([f"So {name} has {v} {obj} now.", f"{pron.capitalize()} ends with {v}."], [4, 1])
    if closing:
        parts.append(closing)
    return " ".join(parts) + f"\n#### {v}"


def make_problem(rng: random.Random) -> dict:
    f = sample_facts(rng)
    c = Sampler(rng)
    return {"question": question_program(f, c), "answer": answer_program(f, c), "facts": f}


def heldout(seed: int, n: int = D.HELDOUT_SIZE) -> list[dict]:
    """`n` distinct held-out problems of this task (see `specfold.tiny.data.heldout`)."""
    return D.heldout(seed, n, make_problem)


def train_stream(seed: int, exclude: set[str]) -> D.TrainStream:
    return D.TrainStream(seed, exclude, make_problem)
