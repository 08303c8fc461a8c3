"""Fresh problems of the shipped model's task: a generator stream no other split draws from, minus
every question (by text) of the problems the shipped model and its graphs have seen.

    python -m specfold.tiny.fresh --seed 0 --n 200 --out fresh.jsonl   # or: specfold bench --tasks tiny_fresh

The splits of the shipped `tiny` (trained with `specfold train-tiny --seed 0`, `choices` task):
- held-out: `specfold/tiny/model/heldout.jsonl` (500 problems, stream "heldout-0");
- training: 6400 steps x 32 problems = the first 204,800 problems of `data.TrainStream(0, held-out)`
  (stream "train-0"; a resumed run restores the stream's state, so its legs draw one sequence);
- tokenizer: 20,000 problems of stream "tokenizer-0";
- calibration: the shipped Spiffy graphs' prompts (stream "spiffy-calibration", 50 used) and the
  depth sweep's (stream "depth-sweep", benchmarks/depth_sweep.py); the first 2000 of each are excluded.

Fresh problems come from stream f"fresh-{seed}" (`choices.make_problem`), distinct by question text.

Invariants: `fresh(seed, n)` is a pure function of (seed, n) and `fresh(seed, m) == fresh(seed, n)[:m]`
for m <= n; no fresh question is in `excluded()` (built by replaying every stream above); the
exclusion set is built once per process (about 10 s of CPU).
"""
from __future__ import annotations

import argparse
import functools
import random
import sys
from pathlib import Path

from specfold.tiny import choices as C
from specfold.tiny import data as D

HELDOUT = Path(__file__).resolve().parent / "model" / "heldout.jsonl"  # the shipped model's held-out set

TRAIN_SEED = 0
TRAIN_PROBLEMS = 6400 * 32  # the shipped schedule: 6400 steps, batch 32 (BENCHMARKS.md, tiny/README.md)
TOKENIZER_PROBLEMS = 20000
CALIBRATION_STREAMS = ("spiffy-calibration", "depth-sweep")
CALIBRATION_PROBLEMS = 2000  # per stream: more than any calibration drew (50)


def _heldout() -> set[str]:
    rows = D.load_jsonl(HELDOUT)
    return {r["question"] for r in rows} | {p["question"] for p in C.heldout(TRAIN_SEED)}


def _first(rng: random.Random, n: int, held: set[str]) -> set[str]:
    """The questions of the first `n` non-held-out problems of `rng`'s stream, duplicates counted, as
    train.py's tokenizer sample and tiny/graphs.py's calibration prompts draw them (a larger `n`
    draws a superset)."""
    out: set[str] = set()
    kept = 0
    while kept < n:
        q = C.make_problem(rng)["question"]
        if q not in held:
            out.add(q)
            kept += 1
    return out


@functools.lru_cache(maxsize=1)
def excluded() -> frozenset[str]:
    """Every question of the held-out, training, tokenizer and calibration sets (see the docstring)."""
    held = _heldout()
    train = C.train_stream(TRAIN_SEED, held)
    out = set(held) | {next(train)["question"] for _ in range(TRAIN_PROBLEMS)}
    out |= _first(random.Random(f"tokenizer-{TRAIN_SEED}"), TOKENIZER_PROBLEMS, held)
    for name in CALIBRATION_STREAMS:
        out |= _first(random.Random(name), CALIBRATION_PROBLEMS, held)
    return frozenset(out)


def fresh(seed: int = 0, n: int = 200) -> list[dict]:
    """`n` problems of the `choices` task from stream f"fresh-{seed}", distinct by question text, none
    of them in `excluded()`; each `{"question", "answer", "facts"}` like a held-out record."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    skip = excluded()
    rng = random.Random(f"fresh-{seed}")
    seen: set[str] = set()
    out: list[dict] = []
    while len(out) < n:
        p = C.make_problem(rng)
        q = p["question"]
        if q not in skip and q not in seen:
            seen.add(q)
            out.append(p)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specfold.tiny.fresh", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0, help="the fresh stream's seed (default 0)")
    ap.add_argument("--n", type=int, default=200, help="problems (default 200)")
    ap.add_argument("--out", required=True, help="JSON Lines file to write (read by --tasks tiny --data FILE)")
    a = ap.parse_args(argv)
    if a.n < 1:
        ap.error(f"--n must be >= 1, got {a.n}")
    D.save_jsonl(fresh(a.seed, a.n), a.out)
    print(f"wrote {a.n} fresh problems (stream fresh-{a.seed}) to {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
