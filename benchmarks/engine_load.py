"""Engine under load (issue 10): output tokens/s and p50/p95 latency at several concurrencies, per
method, sequential vs batched, full vs auto draft budget; memory per running request.

    python benchmarks/engine_load.py [--model tiny|DIR] [--methods vanilla,freedave,spiffy,specfold]
        [--concurrency 1,4,16,64] [--requests 32] [--max-new-tokens 64] [--dtype float32]
        [--rule static] [--out benchmarks/results/engine_load.json]

Closed loop, in process: `c` clients each keep one request in the engine (a finished request is
replaced at once by the next prompt) until `max(requests, c)` requests are done. Latency = add to
finish (queueing included). Times are on the process CPU clock (`time.process_time`, one thread):
on a shared machine the wall clock also counts other jobs' time slices; wall-clock figures are in
the JSON too (`wall_*`). Modes:
- sequential: `max_num_seqs=1`, the other c-1 requests wait (the pre-engine behaviour: one request
  at a time behind a lock); run up to `--max-sequential` clients (beyond, only the queue grows);
- batched: `max_num_seqs=c`, every draft of the method verified (`draft_budget=64`);
- auto: batched with `draft_budget="auto"` (speculative methods only).
The token match rate compares every request's tokens with the sequential run's (float32/bf16
rounding may differ with the batch; float64 is tested exact). Memory per running request = the
engine's tensor bytes / running requests, maximum over steps.

Prompts: the tiny model's held-out questions (chat template) when the model has a tokenizer, else
random token ids (a widened random-weight model is a proxy: speed only). Spiffy on a model without a
shipped graph uses `--graph`, else a FreeDave-shaped chain graph (named in the output).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from provenance import header, write_result  # noqa: E402 (benchmarks/, this script's folder)
from specfold import LLM, EngineConfig, SamplingParams  # noqa: E402
from specfold.decoding.drafts.graph import DraftGraph, GraphError  # noqa: E402

TINY_HELDOUT = ROOT / "specfold" / "tiny" / "model" / "heldout.jsonl"
METHODS = {"vanilla": {}, "freedave": dict(draft_depth=8), "spiffy": dict(branches=7),
           "specfold": dict(drafts="spiffy", branches=7, delta=0.1)}


def prompts(llm: LLM, n: int) -> list[list[int]]:
    if llm.tokenizer is not None and TINY_HELDOUT.is_file():
        rows = [json.loads(x) for x in TINY_HELDOUT.read_text().splitlines() if x.strip()]
        qs = [r["question"] for r in rows]
        out = []
        for i in range(n):
            try:
                out.append(llm.encode(qs[i % len(qs)], SamplingParams(chat_template=True)))
            except Exception:  # no chat template: the plain text
                out.append(llm.encode(qs[i % len(qs)], SamplingParams()))
        return out
    rng = random.Random(0)
    V = llm.spec.vocab_size
    bad = {llm.spec.mask_token_id, *llm.spec.stop_token_ids}
    return [[t for t in (rng.randrange(V) for _ in range(rng.randint(40, 80))) if t not in bad] for _ in range(n)]


def config_for(llm: LLM, method: str, graph, rule: str | None) -> tuple[EngineConfig, str]:
    kw = dict(METHODS[method])
    if rule == "static":
        kw["tokens_per_step"] = 1
    cfg = EngineConfig(method=method, graph=graph, rule=rule, draft_budget=64, **kw)
    note = ""
    if method in ("spiffy", "specfold") and graph is None:
        try:
            llm.engine(cfg)
        except GraphError:
            cfg = cfg.replace(graph=DraftGraph.chain(cfg.branches))
            note = "chain graph (no shipped graph for this model)"
    return cfg, note


def run(llm: LLM, cfg: EngineConfig, ps: list[list[int]], c: int, max_new: int) -> dict:
    eng = llm.engine(cfg)
    todo = list(range(len(ps)))
    lat, cpu_lat, added, toks, nfe, mem = {}, {}, {}, {}, 0, 0
    t0, c0 = time.perf_counter(), time.process_time()
    while todo or eng.has_unfinished():
        while todo and len(eng.running) + len(eng.waiting) < c:
            i = todo.pop(0)
            added[i] = time.process_time()
            eng.add_request(ps[i], SamplingParams(max_new_tokens=max_new, seed=0), request_id=str(i))
        deltas = eng.step()
        if eng.running:
            mem = max(mem, eng.memory_bytes() / len(eng.running))
        for d in deltas:
            if d.finished:
                o = d.output
                i = int(o.request_id)
                lat[i], toks[i] = o.stats.seconds, o.token_ids
                cpu_lat[i] = time.process_time() - added[i]
                nfe += o.stats.nfe
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    ls, cl = sorted(lat.values()), sorted(cpu_lat.values())
    n_tok = sum(len(t) for t in toks.values())
    return {"tokens_per_s": n_tok / cpu, "p50_s": _q(cl, 0.5), "p95_s": _q(cl, 0.95),
            "wall_tokens_per_s": n_tok / wall, "wall_p50_s": _q(ls, 0.5), "wall_p95_s": _q(ls, 0.95),
            "wall_s": wall, "cpu_s": cpu, "tokens": n_tok, "requests": len(ls), "steps": eng.steps,
            "tokens_per_forward": n_tok / nfe if nfe else 0.0, "mem_per_request_kib": mem / 1024, "ids": toks}


def _q(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def markdown(rows: list[dict]) -> str:
    """The BENCHMARKS.md table: one line per (method, concurrency, mode), plus the ratios to c=1."""
    base = {(r["method"], r["mode"]): r for r in rows if r["concurrency"] == 1}
    out = ["| method | clients | mode | tokens/s | p50 s | p95 s | tok/s vs c=1 | p95 vs c=1 | tokens/forward | KiB/request | match |",
           "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        b = base.get((r["method"], r["mode"] if r["mode"] != "sequential" else "sequential"))
        ratio = f"{r['tokens_per_s'] / b['tokens_per_s']:.2f}x" if b else ""
        p95 = f"{r['p95_s'] / b['p95_s']:.2f}x" if b else ""
        out.append(f"| {r['method']} | {r['concurrency']} | {r['mode']} | {r['tokens_per_s']:.1f} | {r['p50_s']:.2f} | "
                   f"{r['p95_s']:.2f} | {ratio} | {p95} | {r['tokens_per_forward']:.2f} | "
                   f"{r['mem_per_request_kib']:.0f} | {r['token_match']:.2f} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--methods", default="vanilla,freedave,spiffy,specfold")
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--graph", default=None)
    ap.add_argument("--max-sequential", type=int, default=16,
                    help="run the sequential mode up to this concurrency (beyond: the same service, more queueing)")
    ap.add_argument("--rule", default=None, help="unmask rule (default: the model's; static = k=1)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "engine_load.json"))
    ap.add_argument("--note", default="", help="what the run shared the machine with (the result's machine note)")
    a = ap.parse_args(argv)
    head = header(a.note, None if argv is None else [__file__, *argv])
    torch.set_num_threads(a.threads)
    llm = LLM(a.model, dtype=a.dtype)
    concs = [int(x) for x in a.concurrency.split(",")]
    ps_all = prompts(llm, max([a.requests] + concs))
    rows = []
    refs: dict = {}
    for method in a.methods.split(","):
        cfg, note = config_for(llm, method, a.graph, a.rule)
        for c in concs:
            ps = ps_all[: max(a.requests, c)]
            modes = [("batched", cfg.replace(max_num_seqs=c))]
            if c <= a.max_sequential:
                modes.insert(0, ("sequential", cfg.replace(max_num_seqs=1)))
            if method != "vanilla":
                modes.append(("auto", cfg.replace(max_num_seqs=c, draft_budget="auto")))
            for mode, mc in modes:
                r = run(llm, mc, ps, c, a.max_new_tokens)
                ids = r.pop("ids")
                ref = refs.setdefault(method, ids)  # the first run (c=1, one request at a time)
                r["token_match"] = sum(ids[i] == ref[i] for i in ids if i in ref) / sum(1 for i in ids if i in ref)
                rows.append(dict(method=method, concurrency=c, mode=mode, note=note, **r))
                print(f"{method:>9} c={c:<3} {mode:>10}: {r['tokens_per_s']:7.1f} tok/s  p50 {r['p50_s']:.3f} s  "
                      f"p95 {r['p95_s']:.3f} s  {r['tokens_per_forward']:.2f} tok/fwd  "
                      f"{r['mem_per_request_kib']:.0f} KiB/req  match {r['token_match']:.2f}", flush=True)
    meta = {"model": a.model, "dtype": a.dtype, "rule": a.rule, "requests": a.requests, "max_new_tokens": a.max_new_tokens,
            "threads": a.threads, "torch": torch.__version__}
    write_result(a.out, head, {"meta": meta, "rows": rows})
    print(markdown(rows))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
