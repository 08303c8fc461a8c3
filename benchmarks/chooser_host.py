"""The draft-budget chooser's own host time per engine step (issue 23), inside the engine.

    OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/chooser_host.py          # this tree
    PYTHONPATH=/path/to/other/tree OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/chooser_host.py

Times `BudgetChooser.choose`, `observe` and `end_step` (engine/budget.py) with `time.perf_counter`
around each call, inside real engine steps (so with the caches that the forwards leave cold), and
divides by the engine steps and by their time. `tiny`, auto budgets, problems 16+ of the fresh
stream `fresh-3`, 48 new tokens, chat template, greedy; batch 1 = 6 problems one at a time, batch 16
= 16 at once; per cell the best of 3 runs after a warm-up. Run it once per tree to compare trees:
the script imports `specfold` from PYTHONPATH (else from this checkout).
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from specfold import LLM, DecodeParams  # noqa: E402
from specfold.engine import budget as B  # noqa: E402
from specfold.engine import engine as E  # noqa: E402
from specfold.tiny.fresh import fresh  # noqa: E402

METHODS = {"freedave": dict(method="freedave", draft_depth=8), "spiffy": dict(method="spiffy", branches=7),
           "specfold": dict(method="specfold", drafts="spiffy", branches=7)}
RULES = {"native": {}, "static": dict(rule="static", tokens_per_step=1)}
seconds: dict[str, float] = {}
calls: dict[str, int] = {}


def timed(cls, name: str) -> None:
    f = getattr(cls, name)

    def g(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - t
            calls[name] = calls.get(name, 0) + 1
    setattr(cls, name, g)


def main() -> int:
    torch.set_num_threads(1)
    for n in ("choose", "observe", "end_step"):
        timed(B.BudgetChooser, n)
    timed(E.Engine, "step")
    llm = LLM("tiny", dtype="float32")
    qs = [p["question"] for p in fresh(3, 32)][16:32]
    print(f"specfold from {Path(B.__file__).parents[2]}")
    print("| rule | batch | method | chooser µs/step | share of step time |\n|---|---|---|---|---|")
    for rule, rkw in RULES.items():
        for batch in (1, 16):
            for m, mkw in METHODS.items():
                p = DecodeParams(chat_template=True, max_new_tokens=48, draft_budget="auto", **rkw, **mkw)
                llm.generate(qs[:2], p)
                best = None
                for _ in range(3):
                    seconds.clear()
                    calls.clear()
                    if batch == 1:
                        for q in qs[:6]:
                            llm.generate([q], p)
                    else:
                        llm.generate(qs[:batch], p)
                    host = sum(seconds.get(n, 0.0) for n in ("choose", "observe", "end_step"))
                    x = (host / calls["step"] * 1e6, 100 * host / seconds["step"])
                    best = x if best is None or x[0] < best[0] else best
                print(f"| {rule} | {batch} | {m} | {best[0]:.0f} | {best[1]:.1f} % |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
