"""The machine's ceiling for replicas: P independent engine processes (no Ray, no HTTP) at once.

    PYTHONPATH=$PWD python benchmarks/engine_processes.py --model /tmp/tiny-w05b --processes 1,2 \
        --concurrency 16 --requests 64 --max-tokens 64 [--pin] [--repeats 2] [--json out.json]

What two Ray Serve replicas of one thread each could at best do on this machine, against one:
for each P, P processes of this tree each load the model with one torch thread, warm up, wait
until all are ready, then run a closed loop at the same moment: `concurrency / P` requests in the
engine at a time (a finished request is replaced at once by the next prompt; the split of 16
clients over P replicas), `requests / P` requests each. The chat prompts are the held-out
questions of the tiny model (greedy), as benchmarks/ray_serve_load.py sends them. Throughput =
all requests / (last finish - first start). `--pin`: process i runs on core i (taskset) instead of
wherever the kernel puts it. `--same-batch`: every process keeps `concurrency` requests in flight
(and runs `requests`), so the ratio shows the cores alone, without the smaller batch per process.
Prints one markdown row per run, and each P's best against the best P=1 run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(a: argparse.Namespace) -> int:
    """One engine process: load, warm up, say ready, wait for 'go', run the closed loop, print JSON."""
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT))
    from specfold import LLM
    from specfold.engine.engine import Engine
    from specfold.params import EngineConfig, SamplingParams
    lines = (ROOT / "specfold/tiny/model/heldout.jsonl").read_text().splitlines()[:32]
    questions = [json.loads(x)["question"] for x in lines]
    llm = LLM(a.model)
    tok = llm.tokenizer
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}])) for q in questions]
    sp = SamplingParams(max_new_tokens=a.max_tokens, temperature=0.0)

    def run(inflight: int, total: int) -> dict:
        eng = Engine(llm, EngineConfig(max_num_seqs=inflight, max_waiting=total))
        todo = iter(range(a.offset, a.offset + total))
        t0, c0 = time.time(), time.process_time()
        start, lat, toks, done = {}, [], 0, 0
        for _ in range(inflight):
            i = next(todo, None)
            if i is not None:
                start[eng.add_request(prompts[i % len(prompts)], sp)] = time.perf_counter()
        while eng.has_unfinished():
            for d in eng.step():
                if d.finished:
                    lat.append(time.perf_counter() - start.pop(d.request_id))
                    toks += len(d.output.token_ids)
                    done += 1
                    i = next(todo, None)
                    if i is not None:
                        start[eng.add_request(prompts[i % len(prompts)], sp)] = time.perf_counter()
        return {"t0": t0, "t1": time.time(), "cpu_s": time.process_time() - c0, "requests": done, "tokens": toks,
                "lat": lat, "steps": eng.steps}

    run(a.inflight, a.inflight)  # warm-up
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps(run(a.inflight, a.total)), flush=True)
    return 0


def once(a: argparse.Namespace, p: int) -> dict:
    inflight = a.concurrency if a.same_batch else a.concurrency // p
    total = a.requests if a.same_batch else a.requests // p
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    procs = []
    for i in range(p):
        cmd = [sys.executable, __file__, "--child", "--model", a.model, "--max-tokens", str(a.max_tokens),
               "--inflight", str(inflight), "--total", str(total), "--offset", str(i * total)]
        if a.pin:
            cmd = ["taskset", "-c", str(i % os.cpu_count()), *cmd]
        procs.append(subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    for pr in procs:
        if pr.stdout.readline().strip() != "ready":
            raise RuntimeError("an engine process failed to start")
    for pr in procs:
        pr.stdin.write("go\n")
        pr.stdin.flush()
    outs = [json.loads(pr.stdout.readline()) for pr in procs]
    for pr in procs:
        pr.wait()
    wall = max(o["t1"] for o in outs) - min(o["t0"] for o in outs)
    lat = sorted(x for o in outs for x in o["lat"])
    n = sum(o["requests"] for o in outs)
    return {"processes": p, "inflight": inflight, "requests": n, "wall_s": wall, "req_per_s": n / wall,
            "out_tok_per_s": sum(o["tokens"] for o in outs) / wall, "p50_s": lat[len(lat) // 2],
            "cpu_ms_per_req": 1000 * sum(o["cpu_s"] for o in outs) / n,
            "per_process_wall_s": [round(o["t1"] - o["t0"], 2) for o in outs], "pin": a.pin,
            "load1": os.getloadavg()[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--processes", default="1,2")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--pin", action="store_true")
    ap.add_argument("--same-batch", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--inflight", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--total", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--offset", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a)
    counts = [int(x) for x in a.processes.split(",")]
    rows = []
    print("| processes | in flight each | requests | req/s | output tok/s | p50 s | CPU ms/request | walls s | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    for _ in range(a.repeats):
        for p in counts:
            r = once(a, p)
            rows.append(r)
            print(f"| {p} | {r['inflight']} | {r['requests']} | {r['req_per_s']:.2f} | {r['out_tok_per_s']:.0f} | "
                  f"{r['p50_s']:.2f} | {r['cpu_ms_per_req']:.0f} | {r['per_process_wall_s']} | {r['load1']:.1f} |",
                  flush=True)
    best = {p: max(r["req_per_s"] for r in rows if r["processes"] == p) for p in counts}
    if 1 in best:
        for p in counts:
            print(f"{p} process(es): best {best[p]:.2f} req/s = {best[p] / best[1]:.2f}x one")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
