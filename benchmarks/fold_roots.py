"""Where a batch step's root-only verifications cost less (issue 23): in the dense call or in the
step's folded call. BENCHMARKS "Draft budgets" (g).

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/fold_roots.py [--model tiny] [--rounds 2]

Runs SpecFold (static rule, budget 0) on 16 fresh problems at once for 12 engine steps and keeps a
step's 16 root-only verification forwards (real prefixes, head rows and caches). Then, per round,
best of 7 on the process CPU clock, one thread:
- dense: the 16 in one `Transformer.forward_many`;
- folded: the 16 in one `FoldVerifier.verify_many`;
- split: 15 dense + 1 folded (two calls, as a step in which one request drafts ran before fold_roots);
- mixed: one folded call of the 15 and of a 2-branch verification of the 16th (root + one draft);
and prints each against the dense call. The cost model's calibration decides the same question on 8
synthetic root-only verifications (engine/cost.py `_roots_cheaper_folded`); its answer is printed too.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from specfold import LLM, EngineConfig, SamplingParams  # noqa: E402
from specfold.models.forward import Forward  # noqa: E402
from specfold.models.transformer import Transformer  # noqa: E402
from specfold.tiny.fresh import fresh  # noqa: E402


def best(fn, reps: int = 7) -> float:
    out = float("inf")
    for _ in range(reps):
        t = time.process_time()
        fn()
        out = min(out, time.process_time() - t)
    return out


def step_forwards(llm: LLM, eng) -> list[Forward]:
    """16 root-only verification forwards of one engine step (the last such step of 12)."""
    kept: list[list[Forward]] = []
    real = Transformer.forward_many

    def spy(self, fws):
        if len(fws) == 16 and all(f.kind == "verify" for f in fws):
            kept.append(list(fws))
        return real(self, fws)
    sp = SamplingParams(max_new_tokens=48, chat_template=True)
    for q in [p["question"] for p in fresh(3, 32)][16:32]:
        eng.add_request(llm.encode(q, sp), sp)
    Transformer.forward_many = spy
    try:
        for _ in range(12):
            eng.step()
    finally:
        Transformer.forward_many = real
    if not kept:
        raise SystemExit("no step verified 16 roots at once")
    return kept[-1]


def with_draft(f: Forward) -> Forward:
    """`f` with one draft branch: its root with the last token changed."""
    d = f.tokens.clone()
    d[0, -1] = (d[0, -1] + 1) % 100
    N = f.tokens.shape[1]
    rows = torch.cat([f.head_rows, f.head_rows + N]) if f.head_rows is not None else None
    return Forward(torch.cat([f.tokens, d]), f.positions, f.cache, f.mask, False, None, f.head, [-1, 0], False,
                   "verify", rows)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(1)
    llm = LLM(a.model, dtype="float32")
    eng = llm.engine(EngineConfig(method="specfold", rule="static", draft_budget=0, max_num_seqs=16))
    fws = step_forwards(llm, eng)
    v, m = eng.runner.verifier, llm.model
    mixed = [with_draft(fws[0])] + fws[1:]
    with torch.inference_mode():
        for r in range(a.rounds):
            dense = best(lambda: m.forward_many(fws))
            folded = best(lambda: v.verify_many(fws))
            split = best(lambda: m.forward_many(fws[1:])) + best(lambda: v.verify_many(mixed[:1]))
            one = best(lambda: v.verify_many(mixed))
            print(f"{a.model} round {r}: dense {dense * 1e3:.2f} ms | folded {folded * 1e3:.2f} ms "
                  f"({folded / dense:.3f}x) | 15 dense + 1 folded with a draft {split * 1e3:.2f} ms "
                  f"({split / dense:.3f}x) | one folded call of the same {one * 1e3:.2f} ms ({one / dense:.3f}x)",
                  flush=True)
    auto = llm.engine(EngineConfig(method="specfold", rule="static", max_num_seqs=16))
    print(f"cost model: fold_roots = {auto.budget.cost.fold_roots}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
