"""The paged KV cache (issue 41): concurrency at a fixed memory budget, prefix caching, peak KV bytes.

    python benchmarks/paged_kv.py [--base DIR] [--requests 64] [--system 600] [--runs runs/widened]
        [--out benchmarks/results/paged_kv.json]

One run, side by side, on the tiny model widened to the Qwen2.5-0.5B width (a cost proxy, float32,
one thread; SPEC §9), vanilla decoding under its native rule, every request added at t = 0:
- concurrency: 64 requests of mixed lengths (prompts 16-256 random tokens, 16-48 new tokens).
  `main` is the engine before paging (`--base`: a checkout of the commit before this work, run in
  its own process), which reserves prompt + max_new_tokens + one block per request; `paged, ample`
  has that memory; `paged, 1/4` has a quarter of it (kv_cache_memory), with prefix caching off (every
  resume prefills again) and on (the default: a resumed request finds its own blocks unless they
  were evicted). Completed requests/s on the process CPU clock, preemptions, and the peak KV bytes
  the requests held.
- prefix caching: 64 requests sharing a `--system`-token system prompt (+ 8-40 own tokens, 16 new),
  caching off and on: median time to first token (TTFT, from t = 0, process CPU clock) and
  completed requests/s.
Each measurement runs in a fresh process (`--one`), one after the other.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def workload(kind: str, n: int, system: int, vocab: int, bad: set) -> list[tuple[list[int], int]]:
    rng = random.Random(0)
    tok = lambda k: [t for t in (rng.randrange(vocab) for _ in range(3 * k)) if t not in bad][:k]  # noqa: E731
    if kind == "mixed":
        return [(tok(rng.randint(16, 256)), rng.choice((16, 32, 48))) for _ in range(n)]
    sys_prompt = tok(system)
    return [(sys_prompt + tok(rng.randint(8, 40)), 16) for _ in range(n)]


def one(args) -> dict:
    """One measurement in this process (the engine of whichever tree is first on sys.path)."""
    import torch
    from specfold import LLM, EngineConfig, SamplingParams
    torch.set_num_threads(1)
    llm = LLM(args.model, dtype="float32")
    s = llm.spec
    jobs = workload(args.kind, args.requests, args.system, s.vocab_size, {s.mask_token_id, *s.stop_token_ids})
    N = s.block_size
    per_pos = 2 * s.num_layers * s.num_kv_heads * s.head_dim * 4
    reservation = sum(len(p) + n + N for p, n in jobs) * per_pos  # what the engine before paging reserved
    kw = dict(max_num_seqs=args.requests)
    if args.memory:
        kw["kv_cache_memory"] = int(reservation * args.memory)
    if args.caching is not None:
        kw["enable_prefix_caching"] = args.caching == "on"
    eng = llm.engine(EngineConfig(**kw))
    eng.run_one(jobs[0][0][:32], SamplingParams(max_new_tokens=N))  # warm-up (and the cost model)
    pool = getattr(eng, "pool", None)
    if pool is not None and hasattr(pool, "peak"):
        pool.peak = pool.used_blocks
    c0, w0 = time.process_time(), time.perf_counter()
    ids = [eng.add_request(p, SamplingParams(max_new_tokens=n, seed=i)) for i, (p, n) in enumerate(jobs)]
    first, done, tokens = {}, {}, {}
    while eng.has_unfinished():
        for d in eng.step():
            if d.new_token_ids and d.request_id not in first:
                first[d.request_id] = time.process_time() - c0
            if d.finished:
                done[d.request_id] = time.process_time() - c0
                tokens[d.request_id] = d.output.token_ids
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    kv = getattr(eng, "kv", None)
    peak = pool.peak * pool.block_bytes if pool is not None and hasattr(pool, "peak") else reservation
    return {"requests_per_s": len(jobs) / cpu, "cpu_seconds": cpu, "wall_seconds": wall,
            "median_ttft_s": statistics.median(first.get(i, done[i]) for i in ids),
            "preemptions": kv.preemptions if kv else 0, "prefix_cache_hits": kv.hits if kv else 0,
            "peak_kv_bytes": peak, "reservation_bytes": reservation,
            "kv_cache_memory": kw.get("kv_cache_memory"), "tokens": [tokens[i] for i in ids]}


RUNS = [  # (section, label, tree, kind, memory share, prefix caching)
    ("concurrency", "main (reserves every request's maximum)", "base", "mixed", None, None),
    ("concurrency", "paged, ample memory", "paged", "mixed", None, "off"),
    ("concurrency", "paged, 1/4 of main's reservation", "paged", "mixed", 0.25, "off"),
    ("concurrency", "paged, 1/4, prefix caching on (the default)", "paged", "mixed", 0.25, "on"),
    ("prefix", "paged, prefix caching off", "paged", "shared", None, "off"),
    ("prefix", "paged, prefix caching on", "paged", "shared", None, "on"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="", help="a checkout of the engine before paging (main's row)")
    ap.add_argument("--model", default="", help="the checkpoint (default: tiny widened to 0.5B under --runs)")
    ap.add_argument("--runs", default="runs/widened")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--system", type=int, default=600)
    ap.add_argument("--out", default="benchmarks/results/paged_kv.json")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--kind", default="mixed", help=argparse.SUPPRESS)
    ap.add_argument("--memory", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--caching", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a)))
        return
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from provenance import header, write_result
    head = header()
    if not a.model:
        from widened import widened_folder
        a.model, _ = widened_folder("tiny", "0.5b", None, Path(a.runs))
    out = {"model": a.model, "requests": a.requests, "system": a.system, "runs": {}}
    for section, label, tree, kind, mem, caching in RUNS:
        if tree == "base" and not a.base:
            continue
        argv = [sys.executable, __file__, "--one", "--model", a.model, "--kind", kind, "--requests", str(a.requests),
                "--system", str(a.system)]
        argv += ["--memory", str(mem)] if mem else []
        argv += ["--caching", caching] if caching else []
        env = dict(os.environ, PYTHONPATH=a.base if tree == "base" else str(ROOT), OMP_NUM_THREADS="1")
        r = json.loads(subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout)
        out["runs"].setdefault(section, {})[label] = r
        print(f"{section:12s} {label:42s} {r['requests_per_s']:.3f} req/s  median TTFT {r['median_ttft_s']:.2f} s  "
              f"peak KV {r['peak_kv_bytes'] / 2**20:.1f} MiB  preemptions {r['preemptions']}", file=sys.stderr)
    runs = out["runs"]
    c, p = runs["concurrency"], runs["prefix"]
    base = c.get("main (reserves every request's maximum)", c["paged, ample memory"])
    q = c["paged, 1/4 of main's reservation"]
    qon = c["paged, 1/4, prefix caching on (the default)"]
    off, on = p["paged, prefix caching off"], p["paged, prefix caching on"]
    out["summary"] = {
        "quarter_vs_main_requests_per_s": q["requests_per_s"] / base["requests_per_s"],
        "quarter_tokens_equal_main": q["tokens"] == base["tokens"],
        "quarter_cached_vs_main_requests_per_s": qon["requests_per_s"] / base["requests_per_s"],
        "quarter_cached_tokens_equal_main": qon["tokens"] == base["tokens"],
        "ttft_off_over_on": off["median_ttft_s"] / on["median_ttft_s"],
        "throughput_on_over_off": on["requests_per_s"] / off["requests_per_s"],
        "prefix_tokens_equal": on["tokens"] == off["tokens"],
        "peak_kv_over_reservation": q["peak_kv_bytes"] / base["reservation_bytes"],
    }
    print(json.dumps(out["summary"], indent=1), file=sys.stderr)
    write_result(a.out, head, out)


if __name__ == "__main__":
    main()
