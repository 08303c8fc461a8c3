"""Engine replicas on Ray Serve, end to end: a local Ray cluster (one per test process), the real
`specfold serve --replicas 2` CLI joining it, the Python API app, and real HTTP clients.

References are independent of Ray: the single-process server (serve/app.py on one in-process
engine) answers the same requests; the replicas' own counters (reported to /health) show who served,
refused and aborted what; Ray kills a replica's actor for the fault test. Waits are liveness bounds.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
import httpx  # noqa: E402

from tests.ray_helpers import needs_ray, ray_cluster, serve_url  # noqa: E402
from tests.serve_helpers import LiveServer, wait_until  # noqa: E402

pytestmark = [pytest.mark.ray, needs_ray]

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = [json.loads(line)["question"]
             for line in (ROOT / "specfold/tiny/model/heldout.jsonl").read_text().splitlines()[:16]]
ERROR_FIELDS = {"message", "type", "param", "code"}


def health(url: str) -> dict:
    return httpx.get(url + "/health", timeout=30).json()


def running_replicas(url: str) -> list[dict]:
    return [r for r in health(url).get("replicas", []) if r["state"] == "RUNNING"]


def body(i: int) -> dict:
    """Request i of the load: seeded sampling with n=2, streaming, a stop string, or plain greedy."""
    b = {"model": "tiny", "messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
         "max_tokens": 48, "temperature": 0}
    kind = i % 4
    if kind == 0:
        b.update(temperature=0.9, seed=1000 + i, n=2)
    elif kind == 1:
        b.update(stream=True, seed=i, temperature=0.7)
    elif kind == 2:
        b.update(stop=["="])
    return b


async def chat(c: httpx.AsyncClient, url: str, b: dict, streaming=None) -> tuple[int, dict]:
    """(status, {"texts", "reasons"}) or (status, an error body); a stream's in-band error counts as one.
    `streaming` (a threading.Event) is set once a stream delivers text: its replica is decoding."""
    if not b.get("stream"):
        r = await c.post(url + "/v1/chat/completions", json=b)
        j = r.json()
        if r.status_code != 200:
            return r.status_code, j
        return 200, {"texts": [ch["message"]["content"] for ch in j["choices"]],
                     "reasons": [ch["finish_reason"] for ch in j["choices"]]}
    texts, reasons, error, done = {}, {}, None, False
    async with c.stream("POST", url + "/v1/chat/completions", json=b) as r:
        if r.status_code != 200:
            return r.status_code, json.loads(await r.aread())
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                ev = json.loads(line[6:])
                if "error" in ev:
                    error = ev
                    continue
                for ch in ev["choices"]:
                    if streaming is not None and ch["delta"].get("content"):
                        streaming.set()
                    texts[ch["index"]] = texts.get(ch["index"], "") + (ch["delta"].get("content") or "")
                    reasons[ch["index"]] = ch["finish_reason"] or reasons.get(ch["index"])
    assert done, "a stream must end with data: [DONE]"
    if error is not None:
        return 200, error
    return 200, {"texts": [texts[i] for i in sorted(texts)], "reasons": [reasons[i] for i in sorted(reasons)]}


async def load(url: str, n: int, timeout: float, during=None) -> list:
    """n concurrent requests; each result is (status, body, seconds) or ("exception", repr, seconds).
    `during(streaming)` runs in a thread meanwhile; `streaming` is set once any stream has text."""
    streaming = threading.Event()
    async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=n)) as c:
        async def one(i):
            t = time.monotonic()
            try:
                status, got = await chat(c, url, body(i), streaming)
            except Exception as e:  # noqa: BLE001 (asserted by the callers)
                return "exception", repr(e), time.monotonic() - t
            return status, got, time.monotonic() - t
        tasks = [asyncio.ensure_future(one(i)) for i in range(n)]
        if during is not None:
            await asyncio.get_running_loop().run_in_executor(None, during, streaming)
        return await asyncio.gather(*tasks)


def is_error_body(b) -> bool:
    return isinstance(b, dict) and set(b) == {"error"} and set(b["error"]) == ERROR_FIELDS


def _up(url: str) -> bool:
    try:
        return httpx.get(url + "/v1/models", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def single_process():
    """The single-process server (one engine, no Ray) with the CLI server's settings."""
    from specfold import LLM
    from specfold.engine.engine import Engine
    from specfold.params import EngineConfig
    from specfold.serve.app import ServeConfig, create_app
    llm = LLM("tiny")
    with LiveServer(create_app(llm, Engine(llm, EngineConfig()), ServeConfig(model_name="tiny", max_tokens=64))) as s:
        yield s.url


# ---------------------------------------------------------------------------------- a cluster of its own
# First in the module: while it runs, this process's cluster is up with Serve started (a CLI that wrongly
# joined it would be seen), but none of the module's other replicas (the CLI's and the Python API's, kept
# until the module ends) compete with the new cluster for the CPU.
def _listener(port: int) -> str | None:
    """The command line of the process listening on TCP `port` on this machine (from /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for r in rows:
            f = r.split()
            if int(f[1].rsplit(":", 1)[1], 16) == port and f[3] == "0A":  # 0A: LISTEN
                inodes.add(f"socket:[{f[9]}]")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in os.listdir(f"/proc/{pid}/fd")):
                return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
        except OSError:
            continue
    return None


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads the listening process from /proc")
def test_cli_on_its_own_cluster_serves_from_the_ingress_replica(single_process):
    """Without --ray-address the CLI starts a cluster of its own (never the one this process runs), and
    the ingress replica itself listens on --port (direct ingress: no hop through Serve's proxy). Its
    answers are the single-process server's, and Ctrl-C stops it in seconds (no 30 s drain)."""
    from tests.ray_helpers import free_port
    serve_url()  # this process's cluster, with Serve, is up: the CLI must not join it
    port = free_port()
    cmd = [sys.executable, "-m", "specfold", "serve", "--model", "tiny", "--replicas", "1", "--replica-cpus", "1",
           "--port", str(port), "--max-new-tokens", "64", "--log-level", "warning"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_SERVE_", "RAY_ADDRESS"))}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: proc.poll() is not None or (_up(url) and len(running_replicas(url)) == 1),
                   "the CLI's own cluster and replica", limit=240, every=0.5)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        listener = _listener(port)
        assert listener is not None and "SpecfoldIngress" in listener, listener
        got = asyncio.run(load(url, 8, timeout=300))
        want = asyncio.run(load(single_process, 8, timeout=300))
        assert [g[0] for g in got] == [200] * 8, [g for g in got if g[0] != 200][:3]
        assert [g[1] for g in got] == [w[1] for w in want]  # streams (body 1, 5) included
        assert health(url)["replicas"][0]["node_id"] != ray_node_id()
    finally:
        t = time.monotonic()
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 130 and err.strip().endswith("interrupted"), err[-2000:]
    assert time.monotonic() - t < 25, f"Ctrl-C took {time.monotonic() - t:.0f} s"
    assert _listener(port) is None


def ray_node_id() -> str:
    import ray
    ray_cluster()
    return ray.get_runtime_context().get_node_id()


# ---------------------------------------------------------------------------------- the CLI
@pytest.fixture(scope="module")
def cli_server():
    """`specfold serve --model tiny --replicas 2 --replica-cpus 1`, joining this process's cluster.

    Ready when the CLI says it serves (it says so once `serve.run` has returned: Serve's controller
    holds both replicas as running, so the ingress's router will route to both) and both replicas
    report RUNNING to the ingress. The replicas report from their constructors, before the
    controller counts them as running, so their reports alone are not enough."""
    address, url = ray_cluster(), serve_url()
    port = url.rsplit(":", 1)[1]
    cmd = [sys.executable, "-m", "specfold", "serve", "--model", "tiny", "--replicas", "2", "--replica-cpus", "1",
           "--ray-address", address, "--port", port, "--max-new-tokens", "64", "--log-level", "warning"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    reader.start()

    def ready() -> bool:
        said = any(line.startswith("specfold: serving 'tiny'") for line in err)
        return proc.poll() is not None or (said and _up(url) and len(running_replicas(url)) == 2)
    try:
        wait_until(ready, "the CLI's replicas", limit=240, every=0.5)
        assert proc.poll() is None, "".join(err)[-3000:]
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        reader.join(10)
    text = "".join(err)
    assert proc.returncode == 130 and text.strip().endswith("interrupted"), text[-2000:]


def test_cli_replicas_answer_like_the_single_process_server(cli_server, single_process):
    before = {r["replica_id"]: r["requests_served"] for r in running_replicas(cli_server)}
    got = asyncio.run(load(cli_server, 32, timeout=300))
    want = asyncio.run(load(single_process, 32, timeout=300))
    assert [g[0] for g in got] == [200] * 32, [g for g in got if g[0] != 200][:3]
    for i, (g, w) in enumerate(zip(got, want)):
        assert g[1] == w[1], (i, body(i), g[1], w[1])
    assert any(len(set(g[1]["texts"])) > 1 for g in got[::4])  # seeds seed+i: the n=2 choices differ somewhere
    assert all("=" not in t for g in got[2::4] for t in g[1]["texts"])  # the stop string cut them

    def served():
        reps = running_replicas(cli_server)
        return {r["replica_id"]: r["requests_served"] - before.get(r["replica_id"], 0) for r in reps}
    wait_until(lambda: sum(served().values()) == 32, "the replicas' reports of 32 requests", limit=30)
    assert len(served()) == 2 and all(n > 0 for n in served().values()), served()
    h = health(cli_server)
    assert h["status"] == "ok" and {r["torch_threads"] for r in h["replicas"]} == {1}
    assert {r["num_cpus"] for r in h["replicas"]} == {1.0}


def test_fault_killed_replica_fails_its_requests_and_is_replaced(cli_server):
    import ray
    reps = running_replicas(cli_server)
    assert len(reps) == 2
    killed = {}

    def kill_a_busy_replica(streaming: threading.Event):
        # The replicas report every 2 s, about as long as the whole load takes, so a report's
        # `running` may be stale: kill once a stream has text instead. All 32 requests were sent at
        # once, Serve's router spreads them over both replicas, and a stream's first text comes
        # after its first block, long before any request ends: either replica holds requests then.
        assert streaming.wait(60), "no stream delivered text within 60 s"
        victim = running_replicas(cli_server)[0]
        ray.kill(ray.get_actor(victim["actor_name"], namespace=victim["namespace"]), no_restart=True)
        killed.update(victim)
    results = asyncio.run(load(cli_server, 32, timeout=90, during=kill_a_busy_replica))
    assert not [r for r in results if r[0] == "exception"]  # nobody waited past the timeout
    ok = [r for r in results if r[0] == 200 and "texts" in r[1]]
    failed = [r for r in results if r not in ok]
    assert all(is_error_body(r[1]) for r in failed), failed[:3]
    assert failed and {r[1]["error"]["code"] for r in failed} == {"replica_unavailable"}
    assert len(ok) + len(failed) == 32 and ok  # the live replica kept answering
    def states() -> dict:
        return {r["replica_id"]: r["state"] for r in health(cli_server)["replicas"]}
    wait_until(lambda: states()[killed["replica_id"]] == "DEAD", "the killed replica to show as DEAD", limit=30)
    wait_until(lambda: len(running_replicas(cli_server)) == 2, "Serve to replace the killed replica", limit=180,
               every=0.5)
    assert states()[killed["replica_id"]] == "DEAD" and killed["replica_id"] not in {
        r["replica_id"] for r in running_replicas(cli_server)}
    again = asyncio.run(load(cli_server, 4, timeout=120))
    assert [r[0] for r in again] == [200] * 4


def test_replicas_that_do_not_fit_a_local_cluster_are_refused():
    ray_cluster()
    from specfold.errors import SpecfoldError
    from specfold.ray.cluster import check_fits
    check_fits(2, 2.0, 0.0, strict=True)  # the test cluster has 4 CPUs
    with pytest.raises(SpecfoldError, match=r"3 replica\(s\) of 2 CPU and 0 GPU need 6 CPUs \(the cluster has 4\)"):
        check_fits(3, 2.0, 0.0, strict=True)
    with pytest.raises(SpecfoldError, match=r"need 1 GPUs \(the cluster has 0\)"):
        check_fits(1, 1.0, 1.0, strict=True)


# ---------------------------------------------------------------------------------- the Python API
KEY = {"Authorization": "Bearer narrow-key"}


@pytest.fixture(scope="module")
def narrow():
    """build_openai_app on 2 replicas of one slot and no queue, without stop tokens (requests run to
    max_tokens): two long streams fill both replicas."""
    from ray import serve

    from specfold.ray import SpecfoldLLMConfig, build_openai_app
    config = SpecfoldLLMConfig(model_source="tiny", num_replicas=2, engine_kwargs={"max_num_seqs": 1, "max_waiting": 0},
                               llm_kwargs={"overrides": {"stop_token_ids": []}}, max_tokens=8,
                               health_check_period_s=0.5, server_kwargs={"api_key": KEY["Authorization"][7:],
                                                                         "max_body_bytes": 4096})
    url = serve_url() + "/narrow"
    serve.run(build_openai_app(config), name="narrow", route_prefix="/narrow")
    try:
        wait_until(lambda: len(running_replicas(url)) == 2, "the narrow replicas", limit=180, every=0.5)
        yield url
    finally:
        serve.delete("narrow")


LONG = {"model": "tiny", "prompt": QUESTIONS[0], "max_tokens": 900, "stream": True}


def counters(url: str, key: str) -> int:
    return sum(r[key] for r in running_replicas(url))


def test_every_replica_full_answers_429_and_closed_streams_abort(narrow):
    aborted = counters(narrow, "aborted")
    with httpx.stream("POST", narrow + "/v1/completions", json=LONG, timeout=120, headers=KEY) as a, \
            httpx.stream("POST", narrow + "/v1/completions", json=LONG, timeout=120, headers=KEY) as b:
        lines = [a.iter_lines(), b.iter_lines()]  # (keep the iterators: dropping one closes its stream)
        assert a.status_code == b.status_code == 200 and all(next(x).startswith("data: ") for x in lines)
        wait_until(lambda: sorted(r["running"] for r in running_replicas(narrow)) == [1, 1],
                   "one long request on each replica", limit=30)
        busy = httpx.post(narrow + "/v1/completions", json={"model": "tiny", "prompt": "x"}, timeout=60, headers=KEY)
        assert busy.status_code == 429 and busy.json()["error"]["code"] == "engine_full"
        assert is_error_body(busy.json()) and busy.headers["retry-after"] == "1"
    wait_until(lambda: counters(narrow, "aborted") == aborted + 2, "both closed streams to be aborted", limit=30)
    wait_until(lambda: counters(narrow, "running") == 0, "the replicas to drain", limit=30)
    r = httpx.post(narrow + "/v1/completions", json={"model": "tiny", "prompt": QUESTIONS[1]}, timeout=60, headers=KEY)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"


def _raw_post(url: str, body: dict):
    """A non-streamed POST on a plain socket (closed by the caller while the answer is pending)."""
    import socket
    u = httpx.URL(url + "/v1/completions")
    data = json.dumps(body).encode()
    sock = socket.create_connection((u.host, u.port), timeout=60)
    head = (f"POST {u.raw_path.decode()} HTTP/1.1\r\nHost: {u.host}:{u.port}\r\nContent-Type: application/json\r\n"
            f"Authorization: {KEY['Authorization']}\r\nContent-Length: {len(data)}\r\n\r\n")
    sock.sendall(head.encode() + data)
    return sock


def test_non_stream_disconnect_aborts_on_the_replica(narrow):
    """The client goes away while its (non-streamed) request runs on a replica: the replica aborts
    it. Sampling at temperature 1 keeps the 900-token request running for a while; the socket is
    closed once /health shows it running (tried again if it ended first)."""
    aborted = counters(narrow, "aborted")
    body = dict(LONG, stream=False, temperature=1.0, seed=0)
    for _ in range(5):
        sock = _raw_post(narrow, body)
        try:
            deadline, seen = time.monotonic() + 10, False
            while not seen and time.monotonic() < deadline:
                seen = counters(narrow, "running") == 1
                time.sleep(0.05)
        finally:
            sock.close()
        if seen:
            break
        wait_until(lambda: counters(narrow, "running") == 0, "the replicas to drain", limit=30)
    else:
        pytest.fail("the request never showed as running on a replica")
    wait_until(lambda: counters(narrow, "aborted") == aborted + 1, "the abandoned request to be aborted", limit=30)
    wait_until(lambda: counters(narrow, "running") == 0, "the replicas to drain", limit=30)


def test_errors_are_openai_bodies_through_the_ingress(narrow):
    r = httpx.post(narrow + "/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user",
                                                                                          "content": "hi"}]},
                   headers=KEY)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found" and is_error_body(r.json())
    r = httpx.post(narrow + "/v1/completions", json={"model": "tiny", "prompt": "x", "delta": 0.1}, headers=KEY)
    assert r.status_code == 400 and r.json()["error"]["param"] == "delta"
    r = httpx.post(narrow + "/v1/completions", json={"model": "tiny", "prompt": [999999]}, headers=KEY)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    r = httpx.post(narrow + "/v1/completions", json={"model": "tiny", "prompt": "x"})  # serve/app.py's key check
    assert r.status_code == 401 and is_error_body(r.json())
    r = httpx.post(narrow + "/v1/completions", json={"model": "tiny", "prompt": "x" * 5000}, headers=KEY)
    assert r.status_code == 413 and is_error_body(r.json())  # the body cap, before the body is read


def test_metrics_and_queue_gauges_through_the_ingress(narrow):
    before = _metric(narrow, "specfold:request_success_total")
    r = httpx.post(narrow + "/v1/completions", json={"model": "tiny", "prompt": QUESTIONS[2]}, headers=KEY,
                   timeout=60)
    assert r.status_code == 200
    assert _metric(narrow, "specfold:request_success_total") == before + 1
    assert _metric(narrow, "specfold:generation_tokens_total") >= 8
    assert _metric(narrow, "specfold:num_requests_waiting") == 0  # from the replicas' reports (no NaN)


def _metric(url: str, name: str) -> float:
    """The sum of a series' samples in /metrics (open without the key)."""
    text = httpx.get(url + "/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and (line[len(name)] in " {"))


def test_logprobs_through_the_ingress(narrow):
    """The replica's deltas carry the logprobs: merged for a non-streamed request, per chunk for a
    streamed one (the reference: the library, float32 rounding apart)."""
    from specfold import LLM, SamplingParams
    llm = LLM("tiny", overrides={"stop_token_ids": []})
    msgs = [{"role": "user", "content": QUESTIONS[3]}]
    ids = llm.tokenizer.encode(llm.tokenizer.apply_chat_template(msgs))
    want = llm.generate([ids], SamplingParams(max_new_tokens=8, logprobs=2))[0]
    chosen = pytest.approx([d[t] for d, t in zip(want.logprobs, want.token_ids)], abs=1e-4)
    r = httpx.post(narrow + "/v1/chat/completions", json={"model": "tiny", "messages": msgs, "logprobs": True,
                                                          "top_logprobs": 2}, headers=KEY, timeout=60)
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == [llm.tokenizer.decode([t], skip_special_tokens=False)
                                             for t in want.token_ids]
    assert [e["logprob"] for e in content] == chosen and all(len(e["top_logprobs"]) == 2 for e in content)
    with httpx.stream("POST", narrow + "/v1/completions", json={"model": "tiny", "prompt": ids, "logprobs": 1,
                                                                "stream": True}, headers=KEY, timeout=60) as s:
        events = [json.loads(x[6:]) for x in s.iter_lines() if x.startswith("data: {")]
    parts = [ch["logprobs"] for e in events for ch in e["choices"] if ch["logprobs"]]
    assert parts and [x for p in parts for x in p["token_logprobs"]] == chosen
