"""Loopback load on the OpenAI server: requests/s, output tokens/s and p50/p95 latency vs concurrency.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/serve_load.py \
        --concurrency 1,4,16 --requests 64 --max-tokens 64 [--baseline COMMIT] [--direct]

Starts `specfold serve --model tiny` of this tree (the engine server) as a subprocess on a free port
and, with `--baseline COMMIT`, also the server of that commit's tree (e.g. 3a3fd80: one request at a
time behind a lock) in the same run; each level runs on every server back to back. Each client sends chat requests (held-out
questions of the tiny model, greedy) one after another; `c` clients run concurrently; the same
`--requests` total per level. Clients and server share the machine: on a 1-core pin the client side
costs server time too. `--direct` adds the same requests through an in-process Engine (no HTTP, all
queued at once, so its latencies include the queue wait): the engine's own throughput, to separate
it from the server's. Prints one markdown row per (server, concurrency).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from provenance import header, write_result  # noqa: E402
CLI = "import sys; from specfold.cli import main; sys.exit(main(sys.argv[1:]))"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(src: Path, port: int, max_tokens: int, extra: list[str]) -> subprocess.Popen:
    """`specfold serve --model tiny` from the source tree `src`, on `port`; returns once it answers."""
    import httpx
    cmd = [sys.executable, "-c", CLI, "serve", "--model", "tiny", "--port", str(port),
           "--max-new-tokens", str(max_tokens), *extra]
    env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, env=env, cwd=src, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"server did not start: {cmd}")


def checkout(commit: str, into: str) -> Path:
    """The tree of `commit` (e.g. the lock-based server before the engine), extracted into `into`."""
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return Path(into)


async def load(url: str, questions: list[str], concurrency: int, total: int, max_tokens: int) -> dict:
    import httpx
    lat: list[float] = []
    toks = errors = 0
    todo = iter(range(total))

    async def client(c: httpx.AsyncClient) -> None:
        nonlocal toks, errors
        for i in todo:
            body = {"model": "tiny", "max_tokens": max_tokens, "temperature": 0,
                    "messages": [{"role": "user", "content": questions[i % len(questions)]}]}
            t = time.perf_counter()
            r = await c.post(url + "/v1/chat/completions", json=body)
            lat.append(time.perf_counter() - t)
            if r.status_code != 200:
                errors += 1
                continue
            toks += r.json()["usage"]["completion_tokens"]

    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=concurrency)) as c:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(c) for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    lat.sort()
    return {"concurrency": concurrency, "requests": total, "errors": errors, "wall_s": wall,
            "req_per_s": total / wall, "out_tok_per_s": toks / wall, "p50_s": statistics.median(lat),
            "p95_s": lat[min(len(lat) - 1, int(0.95 * len(lat)))]}


def direct(questions: list[str], concurrency: int, total: int, max_tokens: int) -> dict:
    """The same requests through an in-process Engine (no HTTP), all queued at once with
    max_num_seqs=concurrency: what the engine does without arrival gaps or server overhead."""
    from specfold import LLM
    from specfold.engine.engine import Engine
    from specfold.params import EngineConfig, SamplingParams
    llm = LLM("tiny")
    tok = llm.tokenizer
    ids = [tok.encode(tok.apply_chat_template([{"role": "user", "content": questions[i % len(questions)]}]))
           for i in range(total)]
    eng = Engine(llm, EngineConfig(max_num_seqs=concurrency, max_waiting=total))
    t0 = time.perf_counter()
    start = {eng.add_request(i, SamplingParams(max_new_tokens=max_tokens)): t0 for i in ids}
    lat, toks = [], 0
    while eng.has_unfinished():
        for d in eng.step():
            if d.finished:
                lat.append(time.perf_counter() - start[d.request_id])
                toks += len(d.output.token_ids)
    wall = time.perf_counter() - t0
    lat.sort()
    return {"concurrency": concurrency, "requests": total, "errors": 0, "wall_s": wall, "req_per_s": total / wall,
            "out_tok_per_s": toks / wall, "p50_s": statistics.median(lat),
            "p95_s": lat[min(len(lat) - 1, int(0.95 * len(lat)))], "steps": eng.steps}


def row(name: str, r: dict) -> str:
    return (f"| {name} | {r['concurrency']} | {r['requests']} | {r['errors']} | {r['req_per_s']:.1f} | "
            f"{r['out_tok_per_s']:.0f} | {r['p50_s']:.3f} | {r['p95_s']:.3f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--requests", type=int, default=64, help="requests per concurrency level")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--baseline", default=None, help="also measure the server of this commit")
    ap.add_argument("--direct", action="store_true", help="also run the requests through an in-process Engine")
    ap.add_argument("--json", "--out", dest="json", default=None, help="write the rows here (with the run's header)")
    ap.add_argument("--note", default="", help="what the run shared the machine with (the result's machine note)")
    a = ap.parse_args()
    head = header(a.note)
    rows_in = (ROOT / "specfold/tiny/model/heldout.jsonl").read_text().splitlines()
    questions = [json.loads(r)["question"] for r in rows_in[:32]]
    levels = [int(c) for c in a.concurrency.split(",")]
    servers = [("engine", lambda tmp: (ROOT, ["--max-num-seqs", "64", "--log-level", "warning"]))]
    if a.baseline:
        servers.append((f"lock ({a.baseline})", lambda tmp: (checkout(a.baseline, tmp), [])))
    rows = []
    print("| server | clients | requests | errors | req/s | output tok/s | p50 s | p95 s |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        procs, urls = [], []
        try:
            for name, launch in servers:  # all up at once (idle servers cost nothing), then interleaved
                port = free_port()
                src, extra = launch(tmp)
                procs.append(start(src, port, a.max_tokens, extra))
                urls.append(f"http://127.0.0.1:{port}")
                asyncio.run(load(urls[-1], questions, 2, 4, a.max_tokens))  # warm-up
            for c in levels:  # per level, every server back to back: drift in machine load hits all alike
                for (name, _), url in zip(servers, urls):
                    r = asyncio.run(load(url, questions, c, a.requests, a.max_tokens))
                    rows.append(dict(r, server=name))
                    print(row(name, r), flush=True)
                if a.direct:
                    r = direct(questions, c, a.requests, a.max_tokens)
                    rows.append(dict(r, server="in-process engine"))
                    print(row("in-process engine (no HTTP, all queued)", r), flush=True)
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(30)
    if a.json:
        write_result(a.json, head, {"settings": {"requests": a.requests, "max_tokens": a.max_tokens, "model": "tiny",
                                                 "baseline": a.baseline}, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
