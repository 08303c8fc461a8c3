"""Host overhead of the engine (issue 19): time outside the model's forwards at batch 1, and output
tokens/s at 16 concurrent requests, for one source tree. `--vs OLD_TREE` runs this script on both
trees side by side (alternating, each in its own process, one thread, `--rounds` times) and prints
the ratios.

    python benchmarks/engine_overhead.py [--tree .] [--vs /path/to/old/checkout] [--rounds 2]
        [--n 6] [--max-new-tokens 64] [--out benchmarks/results/engine_overhead.json] [--note TEXT]

Each tree's process inherits this one's CPU affinity (pin it with `taskset -c N`).

"Inside the forwards" = time in `Transformer.forward_many` and `FoldVerifier.verify_many` (the model's
packed calls; eager K/V writes and the head of a reused commit are outside). Everything else of a
step (scheduling, rules, drafts, index tensors, reading scores back) is host overhead. Times are the
process CPU clock (one thread), so other jobs on the machine do not count; wall clock is recorded too.
Prompts: the tiny model's first held-out questions through its chat template.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import header, write_result  # noqa: E402

METHODS = ("vanilla", "freedave", "spiffy", "specfold")
RULES = ("native", "static")


def measure(tree: Path, n: int, max_new: int) -> dict:
    sys.path.insert(0, str(tree))
    import torch
    torch.set_num_threads(1)
    from specfold import LLM, EngineConfig, SamplingParams
    from specfold.decoding.verify.fold import FoldVerifier
    from specfold.models.transformer import Transformer
    inside = [0.0]

    def timed(fn):
        def wrapper(*a, **k):
            t0 = time.process_time()
            try:
                return fn(*a, **k)
            finally:
                inside[0] += time.process_time() - t0
        return wrapper
    Transformer.forward_many = timed(Transformer.forward_many)
    FoldVerifier.verify_many = timed(FoldVerifier.verify_many)
    llm = LLM("tiny", dtype="float32")
    rows = [json.loads(x) for x in (tree / "specfold" / "tiny" / "model" / "heldout.jsonl").read_text().splitlines()]
    qs = [r["question"] for r in rows]
    sp = SamplingParams(max_new_tokens=max_new, chat_template=True)
    out = {}
    for rule in RULES:
        for method in METHODS:
            cfg = EngineConfig(method=method, rule=None if rule == "native" else rule, max_num_seqs=16)
            for label, prompts, seqs in (("batch1", qs[:n], 1), ("c16", qs[:16], 16)):
                eng_cfg = cfg.replace(max_num_seqs=seqs)
                llm._engine = llm.engine(eng_cfg)
                llm.generate(prompts[:1], sp)  # warm up
                inside[0] = 0.0
                c0, w0 = time.process_time(), time.perf_counter()
                outs = llm.generate(prompts, sp)
                cpu, wall = time.process_time() - c0, time.perf_counter() - w0
                toks = sum(len(o.token_ids) for o in outs)
                out[f"{rule}/{method}/{label}"] = {"cpu_s": cpu, "wall_s": wall, "inside_s": inside[0],
                                                   "outside_frac": 1 - inside[0] / cpu, "tokens": toks,
                                                   "tokens_per_cpu_s": toks / cpu, "nfe": sum(o.stats.nfe for o in outs),
                                                   "ids": [o.token_ids for o in outs]}
    return out


def side_by_side(a: argparse.Namespace) -> None:
    head = header(a.note)
    runs: dict[str, list[dict]] = {"new": [], "old": []}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    for _ in range(a.rounds):
        for name, tree in (("old", a.vs), ("new", a.tree)):
            cmd = [sys.executable, __file__, "--tree", str(tree), "--n", str(a.n),
                   "--max-new-tokens", str(a.max_new_tokens), "--one"]
            res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(tree))
            if res.returncode:
                sys.exit(res.stderr[-2000:])
            runs[name].append(json.loads(res.stdout.splitlines()[-1]))
    best = {k: {c: min(r[c][m] for r in v) if m != "tokens_per_cpu_s" else max(r[c][m] for r in v)
                for c in v[0] for m in ("outside_frac", "tokens_per_cpu_s")} for k, v in runs.items()}
    table = {}
    for c in runs["new"][0]:
        same = runs["new"][0][c]["ids"] == runs["old"][0][c]["ids"]
        o, nw = runs["old"][0][c], runs["new"][0][c]
        table[c] = {"outside_old": min(r[c]["outside_frac"] for r in runs["old"]),
                    "outside_new": min(r[c]["outside_frac"] for r in runs["new"]),
                    "tok_s_ratio": max(r[c]["tokens_per_cpu_s"] for r in runs["new"]) /
                    max(r[c]["tokens_per_cpu_s"] for r in runs["old"]),
                    "same_tokens": same, "nfe_old": o["nfe"], "nfe_new": nw["nfe"]}
        t = table[c]
        print(f"{c:28s} outside {t['outside_old']:.3f} -> {t['outside_new']:.3f}   tokens/s x{t['tok_s_ratio']:.2f}"
              f"   same tokens {same}   nfe {t['nfe_old']} -> {t['nfe_new']}")
    del best
    old_commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=a.vs, capture_output=True, text=True).stdout.strip()
    write_result(a.out, head, {"vs": {"tree": str(a.vs), "commit": old_commit or None}, "table": table,
                               "rounds": a.rounds, "n": a.n, "max_new_tokens": a.max_new_tokens})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--vs", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--n", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="benchmarks/results/engine_overhead.json")
    ap.add_argument("--note", default="", help="what the run shared the machine with (the result's machine note)")
    a = ap.parse_args()
    if a.vs is not None:
        side_by_side(a)
        return
    print(json.dumps(measure(a.tree.resolve(), a.n, a.max_new_tokens)))


if __name__ == "__main__":
    main()
