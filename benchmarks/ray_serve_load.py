"""Ray Serve replicas under load: throughput at C concurrent clients, N replicas x 1 thread each.

    PYTHONPATH=$PWD python benchmarks/ray_serve_load.py --replicas 1,2 --concurrency 16 \
        --requests 96 --max-tokens 64 [--model PATH] [--repeats 2] [--plain] [--json out.json]

For each replica count, `specfold serve --model tiny --replicas N --replica-cpus 1` of this tree runs
as a subprocess on a free port (it starts its own local Ray cluster and stops it on exit); after a
warm-up (one request per client), C clients send chat requests (held-out questions of the tiny model, greedy) one after
another, `--requests` in all, with serve_load.py's client. One server runs at a time (on a small
machine an idle cluster's own processes take CPU from the one measured); the `--repeats` runs
alternate (1, 2, 1, 2, ...) so that drift in the machine's load hits each alike, and the best run of
each is compared (other work only ever slows a run down). Each row notes the 1-minute load average
after it. `--plain` adds the
single-process server (`specfold serve` without Ray, one thread) as a reference row. `--model`: a
checkpoint instead of tiny, e.g. a `specfold widen` copy of tiny (the same tokens at a higher cost
per token: what a request costs the engine, against the fixed cost of its trip through Serve). The
clients talk to the ingress replica itself (direct ingress, since the CLI's cluster is its own); they, the
ingress, Serve's and Ray's processes and the replicas share the machine's cores. The ceiling without
Ray: benchmarks/engine_processes.py. Prints one markdown row per run
and, per count, the best run's throughput relative to the best 1-replica run.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from serve_load import CLI, free_port, load, row  # noqa: E402


def start(port: int, max_tokens: int, replicas: int | None, model: str = "tiny") -> subprocess.Popen:
    """`specfold serve --model tiny` (with `--replicas`: on Ray); returns once every replica answers."""
    import httpx
    extra = ["--replicas", str(replicas), "--replica-cpus", "1"] if replicas else ["--threads", "1"]
    cmd = [sys.executable, "-c", CLI, "serve", "--model", model, "--served-model-name", "tiny", "--port", str(port),
           "--max-new-tokens", str(max_tokens), "--log-level", "warning", *extra]  # (the clients ask for "tiny")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", RAY_USAGE_STATS_ENABLED="0")
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    url = f"http://127.0.0.1:{port}"
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            h = httpx.get(url + "/health", timeout=2)
            reps = [r for r in h.json().get("replicas", []) if r["state"] == "RUNNING"]
            if h.status_code == 200 and (replicas is None or len(reps) == replicas):
                return proc
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    stop(proc)
    raise RuntimeError(f"server did not start: {' '.join(cmd)}\n{proc.stderr.read()[-2000:] if proc.stderr else ''}")


def stop(proc: subprocess.Popen) -> None:
    """Ctrl-C: the CLI deletes its app and shuts down the cluster it started."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def burst(url: str, replicas: int | None, questions: list[str], a: argparse.Namespace) -> dict:
    """One measured run of `--requests` requests from `--concurrency` clients."""
    r = asyncio.run(load(url, questions, a.concurrency, a.requests, a.max_tokens))
    if replicas:
        import httpx
        r["served"] = sorted(x["requests_served"] for x in httpx.get(url + "/health").json()["replicas"])
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replicas", default="1,2")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--model", default="tiny", help="checkpoint folder (default: the embedded tiny model)")
    ap.add_argument("--plain", action="store_true", help="also the single-process server (no Ray)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    lines = (ROOT / "specfold/tiny/model/heldout.jsonl").read_text().splitlines()[:32]
    questions = [json.loads(x)["question"] for x in lines]
    counts = [int(x) for x in a.replicas.split(",")]
    runs: list[tuple[str, int | None]] = [("single process (no Ray)", None)] if a.plain else []
    runs += [(f"ray serve, {n} replica(s) x 1 thread", n) for n in counts]
    rows = []
    print("| server | clients | requests | errors | req/s | output tok/s | p50 s | p95 s |")
    print("|---|---|---|---|---|---|---|---|")
    for _ in range(a.repeats):
        for name, n in runs:  # one server at a time: on a small machine an idle cluster's own work counts
            port = free_port()
            proc = start(port, a.max_tokens, n, a.model)
            try:
                url = f"http://127.0.0.1:{port}"
                asyncio.run(load(url, questions, a.concurrency, a.concurrency, a.max_tokens))  # warm-up
                r = burst(url, n, questions, a)
            finally:
                stop(proc)
            if r["errors"]:
                raise RuntimeError(f"{r['errors']} of {r['requests']} requests failed on {name}")
            rows.append(dict(r, server=name, replicas=n, load1=os.getloadavg()[0]))
            print(row(name, r) + f" load {rows[-1]['load1']:.1f}" + (f" served {r['served']}" if n else ""),
                  flush=True)
    best = {n: max(r["req_per_s"] for r in rows if r["replicas"] == n) for _, n in runs}
    if 1 in best:
        for n in counts:
            print(f"{n} replica(s): best {best[n]:.2f} req/s = {best[n] / best[1]:.2f}x one replica")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
