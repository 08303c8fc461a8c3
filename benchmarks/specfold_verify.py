"""One verification batch of a 0.5B-shaped model, dense against folded, on this CPU.

The tiny model is too small for SpecFold to pay on a CPU (its forward is dominated by per-op
overhead, not FLOPs), so this measures the unit SpecFold actually speeds up, at a realistic width:
root + 7 drafts (a FreeDave-style chain, each draft fixing one more position of a 32-position block
with 16 masks) verified against a 100-token prefix cache, random Qwen2.5-0.5B-shaped weights.
Prints time per verification for dense and for folded verification at several δ, the fold ratio,
and the max logit difference against dense.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/specfold_verify.py --threads 1
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_core import QWEN25_05B, random_checkpoint  # noqa: E402

from specfold import LLM  # noqa: E402
from specfold.decoding.verify.dense import DenseVerifier  # noqa: E402
from specfold.decoding.verify.fold import FoldVerifier  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--deltas", default="0,0.05,0.1,0.2")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# one verification, random Qwen2.5-0.5B shape, float32, {a.threads} thread(s), commit {commit}, "
          f"{time.strftime('%Y-%m-%d')}\n")
    with tempfile.TemporaryDirectory() as tmp:
        llm = LLM(random_checkpoint(Path(tmp) / "m", QWEN25_05B), dtype="float32")
    m, M = llm.model, llm.spec.mask_token_id
    g = torch.Generator().manual_seed(0)
    P, N = 100, 32
    cache = m.new_cache(P + N)
    with torch.inference_mode():
        m(torch.randint(0, 50000, (1, P), generator=g), torch.arange(P), cache=cache, write_cache=True,
          logits_at=torch.tensor([P - 1]))
    root = torch.randint(0, 50000, (N,), generator=g)
    root[16:] = M
    branches, parents = [root], [-1]
    for j in range(7):
        d = branches[-1].clone()
        d[16 + j] = int(torch.randint(0, 50000, (1,), generator=g))
        branches.append(d)
        parents.append(j)
    toks = torch.stack(branches)
    pos, mask, out = torch.arange(P, P + N), torch.ones(N, N, dtype=torch.bool), torch.arange(16, 32)

    def timed(fn):
        ts = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            with torch.inference_mode():
                r = fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts), r

    dense = DenseVerifier(m)
    t_dense, ref = timed(lambda: dense(toks, parents, pos, cache, mask, out))
    print("| verifier | ms | vs dense | fold ratio | ffn fold ratio | max abs logit diff |")
    print("|---|---|---|---|---|---|")
    print(f"| dense (B+1 = 8 branches) | {t_dense * 1e3:.0f} | 1.00x | - | - | 0 |")
    for delta in (float(x) for x in a.deltas.split(",")):
        fv = FoldVerifier(m, delta)
        t, r = timed(lambda: fv(toks, parents, pos, cache, mask, out))
        rep = fv.report()
        print(f"| folded δ={delta} | {t * 1e3:.0f} | {t_dense / t:.2f}x | {rep['fold_ratio']:.2f} | "
              f"{rep['ffn_fold_ratio']:.2f} | {(r - ref).abs().max().item():.1e} |")


if __name__ == "__main__":
    main()
