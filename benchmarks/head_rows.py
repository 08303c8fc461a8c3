"""Where a FreeDave verification's cost goes at a real vocabulary (issue 23): layers against LM head,
the head over the union of every branch's rows against each branch's own rows.

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/head_rows.py [--checkpoint DIR] [--vocab 151936]
        [--depth 8] [--masked 16] [--prefix 64] [--reps 3]

The checkpoint (default: the 0.5B-width widened tiny model, made by benchmarks/widened.py) gets a
random LM head of `--vocab` rows in memory (Qwen2.5's 151,936 by default): a cost proxy, its tokens
mean nothing. One window of N positions after a prefix of `--prefix` cached positions, `--masked`
masks in it; the FreeDave chain of `--depth` branches fills one more position per branch (static rule,
k = 1), so branch j reads `masked - j` rows. Timed (process CPU seconds, best of `--reps`, one thread)
through `Transformer.forward_many`, as the runner calls it, plus the device read of the logits
(`read_rows`): vanilla's forward (1 branch, its masked rows); the verification with the head over the
union of rows for every branch (the old shared `logits_at`); with each branch's own rows (`head_rows`,
what the block program asks for now); and with no head at all (the layers alone).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from specfold import LLM  # noqa: E402
from specfold.decoding.readout import Read, read_rows  # noqa: E402
from specfold.models.forward import Forward  # noqa: E402


def cpu_time(fn, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        c0 = time.process_time()
        fn()
        best = min(best, time.process_time() - c0)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--masked", type=int, default=16)
    ap.add_argument("--prefix", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    ckpt = a.checkpoint
    if ckpt is None:
        from widened import widened_folder
        ckpt = widened_folder("tiny", "0.5b", None, ROOT / "runs" / "widened")[0]
    llm = LLM(ckpt, dtype="float32")
    m, spec = llm.model, llm.spec
    g = torch.Generator().manual_seed(0)
    m.lm_head = torch.nn.Linear(spec.hidden_size, a.vocab, bias=False)
    with torch.no_grad():
        m.lm_head.weight.normal_(0, 0.02, generator=g)
    N, P, D, k = spec.block_size, a.prefix, a.depth, min(a.masked, spec.block_size)
    cache = m.new_cache(P + N)
    none = torch.zeros(0, dtype=torch.long)
    with torch.inference_mode():
        m.forward_many([Forward(torch.randint(0, 600, (1, P), generator=g), torch.arange(P), cache, None, True, none)])
        root = torch.randint(0, 600, (N,), generator=g)
        masked = list(range(N - k, N))
        root[masked] = spec.mask_token_id
        branches = [root.clone()]
        for j in range(1, D):
            b = branches[-1].clone()
            b[masked[j - 1]] = 7
            branches.append(b)
        toks = torch.stack(branches)
        pos = torch.arange(P, P + N)
        own = torch.tensor([b * N + i for b in range(D) for i in masked[b:]])
        union = torch.tensor(masked)
        cases = {
            "vanilla (1 branch, own rows)": Forward(toks[:1], pos, cache, head_rows=union),
            f"verify {D} branches, head on the union ({D * k} rows)": Forward(toks, pos, cache, logits_at=union),
            f"verify {D} branches, head on each branch's own rows ({len(own)} rows)": Forward(toks, pos, cache, head_rows=own),
            f"verify {D} branches, layers only (no head)": Forward(toks, pos, cache, head_rows=none),
        }

        def run(f):
            out = m.forward_many([f])[0].logits
            if out.numel():
                read_rows(out.reshape(-1, out.shape[-1]), spec.mask_token_id, Read())
        times = {name: cpu_time(lambda f=f: run(f), a.reps) for name, f in cases.items()}
    van = times["vanilla (1 branch, own rows)"]
    print(f"{Path(ckpt).name}: hidden {spec.hidden_size}, {spec.num_layers} layers, vocab {a.vocab} (random head), "
          f"window {N}, {k} masked, prefix {P}; process CPU seconds, best of {a.reps}\n")
    print("| forward | CPU ms | × vanilla |\n|---|---|---|")
    for name, t in times.items():
        print(f"| {name} | {1000 * t:.0f} | {t / van:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
