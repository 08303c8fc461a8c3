"""Tensor parallelism at the commands: `specfold serve` and `specfold generate` with `-tp 2` (two local
ranks, gloo, the embedded model in float64).

- A `-tp 2` server answers concurrent `openai` clients (chat and completions, streamed and not, at
  temperature 0) with exactly the texts one rank decodes (`LLM.generate`), batched.
- Killing the rank process of a `specfold serve -tp 2` mid-request: the streamed request gets the
  error event, the running and the waiting ones 503, each with the one-line error, within 60 s;
  later requests and /health answer 503 with the same line; Ctrl-C still ends the server quietly.
- `specfold generate -tp 2`: killing its rank mid-run is exactly one stderr line and a nonzero exit
  within 60 s; Ctrl-C to the process group (as a terminal sends it) is exit 130, "interrupted", and no
  rank process outlives it.

Waits are liveness bounds except the issue's 60 s; the rank's pid is found as the server's or the
command's child process (/proc), as an operator would.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
import httpx  # noqa: E402

from specfold import LLM  # noqa: E402
from specfold.engine.engine import Engine  # noqa: E402
from specfold.params import EngineConfig, SamplingParams  # noqa: E402
from specfold.serve.app import ServeConfig, create_app  # noqa: E402
from tests.serve_helpers import LiveServer, wait_until  # noqa: E402

pytestmark = pytest.mark.slow  # multi-process tensor parallelism, servers and kills: minutes

ROOT = Path(__file__).resolve().parents[1]
CHATS = ["What is 3 + 4?", "Tom has 7 apples. He gets 5 more apples. How many apples does Tom have now?",
         "Mia has 9 pens. She gives away 4 pens. How many pens does Mia have now?"]
COMPLETIONS = ["Ben has 4 stickers.", "Count from 5 to 9:", "Ava has 3 toys. She buys"]
ENGINE = dict(method="specfold", delta=0.0, draft_budget=2, rule="static")  # folded verification over 2 ranks
MAX_TOKENS = 32
KILL_BOUND_S = 60.0  # the bound: a dead rank is one line within 60 s
LINE = "tensor-parallel rank 1 was killed by SIGKILL; the request set is ended (restart to continue)"
from specfold.cli import template_line  # noqa: E402
STARTED = template_line(True)  # generate's first stderr line: the prompts go through the chat template


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")


def _children(pid: int) -> list[int]:
    """The child processes of `pid` (every thread's /proc children list)."""
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            out += [int(x) for x in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except OSError:
            pass
    return out


def _ranks_of(pid: int) -> list[int]:
    """The rank processes `pid` started (their command line runs specfold.executor.worker)."""
    out = []
    for c in _children(pid):
        try:
            if b"specfold.executor.worker" in Path(f"/proc/{c}/cmdline").read_bytes():
                out.append(c)
        except OSError:
            pass
    return out


def _sockets(pid: int) -> int:
    n = 0
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
            except OSError:
                pass
    except OSError:
        pass
    return n


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _alive(pid: int) -> bool:
    """Running (a zombie, or a pid gone, is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _in_group(pgid: int) -> list[int]:
    """Running processes of process group `pgid`."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(d))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------- answers
def test_a_tp2_server_answers_concurrent_openai_clients_as_one_rank_decodes():
    one = LLM("tiny", dtype="float64", config=EngineConfig(**ENGINE))
    want_chat = [o.text for o in one.generate(CHATS, SamplingParams(max_new_tokens=MAX_TOKENS, chat_template=True))]
    want_text = [o.text for o in one.generate(COMPLETIONS, SamplingParams(max_new_tokens=MAX_TOKENS,
                                                                          chat_template=False))]
    assert sum(map(len, want_chat + want_text)) > 100  # real answers, not immediate stops

    two = LLM("tiny", dtype="float64", tensor_parallel_size=2)
    try:
        app = create_app(two, Engine(two, EngineConfig(**ENGINE)), ServeConfig(model_name="tiny"))
        with LiveServer(app) as s:
            client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=300)
            start = threading.Barrier(len(CHATS) + len(COMPLETIONS))

            def chat(q: str, stream: bool) -> str:
                start.wait()
                kw = dict(model="tiny", messages=[{"role": "user", "content": q}], max_tokens=MAX_TOKENS,
                          temperature=0)
                if not stream:
                    return client.chat.completions.create(**kw).choices[0].message.content
                return "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**kw, stream=True)
                               if c.choices)

            def complete(p: str, stream: bool) -> str:
                start.wait()
                kw = dict(model="tiny", prompt=p, max_tokens=MAX_TOKENS, temperature=0)
                if not stream:
                    return client.completions.create(**kw).choices[0].text
                return "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True) if c.choices)

            with ThreadPoolExecutor(len(CHATS) + len(COMPLETIONS)) as pool:
                chats = [pool.submit(chat, q, i == 0) for i, q in enumerate(CHATS)]
                texts = [pool.submit(complete, p, i == 0) for i, p in enumerate(COMPLETIONS)]
                got_chat, got_text = [f.result() for f in chats], [f.result() for f in texts]
            health = httpx.get(s.url + "/health", timeout=60).json()
    finally:
        two.close()
    assert got_chat == want_chat
    assert got_text == want_text
    assert health["max_running"] >= 2 and health["step_errors"] == 0  # the clients were batched, nothing failed


# ---------------------------------------------------------------------------------- faults: serve
def test_killing_a_rank_of_a_tp2_server_is_503_with_one_line():
    """`specfold serve -tp 2` as an operator starts it; every request runs to max_tokens (no stop
    token), two decode at once and a third waits. Killing the rank mid-request ends all three with the
    rank's one line: the stream in-band (the openai client raises it), the others as 503."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "specfold", "serve", "--model", "tiny", "-tp", "2", "--dtype", "float64",
            "--override", "stop_token_ids=[]", "--method", "vanilla", "--max-num-seqs", "2", "--threads", "2",
            "--port", str(port), "--log-level", "warning"]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    ranks: list[int] = []
    try:
        def up():
            assert p.poll() is None, p.stderr.read()[-3000:]
            try:
                return httpx.get(url + "/health", timeout=5).status_code == 200
            except httpx.TransportError:
                return False
        wait_until(up, "specfold serve -tp 2 to start", limit=300, every=0.2)
        ranks = _ranks_of(p.pid)
        assert len(ranks) == 1  # -tp 2: one rank besides the server's own

        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
        first_chunk, errors = threading.Event(), {}
        body = {"model": "tiny", "prompt": "Ben has 4 stickers.", "max_tokens": 900, "temperature": 0}

        def streamed():
            try:
                for c in client.completions.create(**{**body, "stream": True}):
                    if c.choices and c.choices[0].text:
                        first_chunk.set()
                errors["stream"] = None
            except openai.APIError as e:
                errors["stream"] = (e, time.monotonic())

        def plain(name: str):
            try:
                r = httpx.post(url + "/v1/completions", json=body, timeout=300)
                errors[name] = (r, time.monotonic())
            except httpx.HTTPError as e:
                errors[name] = (e, time.monotonic())

        threads = [threading.Thread(target=streamed)]
        threads[0].start()
        wait_until(first_chunk.is_set, "the stream's first chunk", limit=300)
        for name in ("running", "waiting"):
            threads.append(threading.Thread(target=plain, args=(name,)))
            threads[-1].start()

        def queued():
            text = httpx.get(url + "/metrics", timeout=30).text
            return ("specfold:num_requests_running 2.0" in text and "specfold:num_requests_waiting 1.0" in text)
        wait_until(queued, "two running requests and one waiting", limit=300, every=0.1)
        assert not errors  # all three in flight when the rank dies

        os.kill(ranks[0], signal.SIGKILL)
        killed = time.monotonic()
        for t in threads:
            t.join(KILL_BOUND_S + 30)
        assert not any(t.is_alive() for t in threads)

        e, when = errors["stream"]
        line = e.message
        assert line == LINE, line
        assert e.body == {"message": line, "type": "server_error", "param": None, "code": "engine_down"}
        assert when - killed < KILL_BOUND_S
        for name in ("running", "waiting"):
            r, when = errors[name]
            assert isinstance(r, httpx.Response), r
            assert r.status_code == 503 and when - killed < KILL_BOUND_S, (name, r.status_code, r.text)
            assert r.json() == {"error": {"message": line, "type": "server_error", "param": None,
                                          "code": "engine_down"}}

        later = httpx.post(url + "/v1/chat/completions", timeout=60,
                           json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert later.status_code == 503 and later.json()["error"]["message"] == line
        with pytest.raises(openai.InternalServerError) as err:  # the openai client sees the same
            client.completions.create(model="tiny", prompt="hi", max_tokens=4, stream=True)
        assert err.value.status_code == 503 and err.value.body["message"] == line
        health = httpx.get(url + "/health", timeout=60)
        assert health.status_code == 503 and health.json()["error"]["message"] == line
        assert httpx.get(url + "/v1/models", timeout=60).status_code == 200  # the server itself still answers
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
        _, stderr = p.communicate(timeout=120)
    assert p.returncode == 130 and "Traceback" not in stderr, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == "interrupted"
    assert not [r for r in ranks if _alive(r)]


# ---------------------------------------------------------------------------------- faults: generate
def _generate_tp2(tmp_path) -> tuple[subprocess.Popen, int]:
    """`specfold generate -tp 2` on 8 prompts that run to 900 tokens (no stop token), in its own
    process group; returns it and its rank's pid once the rank is connected and decoding."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(CHATS + COMPLETIONS + CHATS[:2]) + "\n")
    argv = [sys.executable, "-m", "specfold", "generate", "--model", "tiny", "-tp", "2", "--dtype", "float64",
            "--override", "stop_token_ids=[]", "--prompt-file", str(prompts), "--max-new-tokens", "900",
            "--method", "vanilla", "--threads", "2", "--json"]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                         start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    ranks: list[int] = []

    def connected():
        assert p.poll() is None, p.stderr.read()[-3000:]
        ranks[:] = _ranks_of(p.pid)
        return len(ranks) == 1 and _sockets(ranks[0]) >= 3  # the store and both process groups
    wait_until(connected, "the rank to connect", limit=300, every=0.1)
    # the rank says it has loaded its shard in the rendezvous store (its address is on its command line)
    addr, port = Path(f"/proc/{ranks[0]}/cmdline").read_bytes().split(b"\0")[-5:-3]
    st = dist.TCPStore(addr.decode(), int(port), is_master=False, timeout=timedelta(seconds=60),
                       wait_for_workers=False)

    def loaded():
        assert p.poll() is None, p.stderr.read()[-3000:]
        return st.check(["ready/1"])
    wait_until(loaded, "the rank to load its shard", limit=300, every=0.1)
    del st
    at_ready = _cpu_seconds(ranks[0])

    def decoding():  # after loading, the rank only replays rank 0's steps
        assert p.poll() is None, p.stderr.read()[-3000:]
        return _cpu_seconds(ranks[0]) - at_ready > 1.0
    wait_until(decoding, "the rank to replay steps", limit=300, every=0.1)
    return p, ranks[0]


def test_killing_the_rank_of_specfold_generate_is_one_line(tmp_path):
    p, rank = _generate_tp2(tmp_path)
    try:
        os.kill(rank, signal.SIGKILL)
        killed = time.monotonic()
        stdout, stderr = p.communicate(timeout=KILL_BOUND_S + 30)
        took = time.monotonic() - killed
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 2 and took < KILL_BOUND_S, (p.returncode, took, stderr[-3000:])
    assert stderr.strip().splitlines() == [STARTED, f"error: {LINE}"], stderr[-3000:]  # mid-run: not "while starting"
    assert stdout == "" and _in_group(p.pid) == []


def test_ctrl_c_stops_every_rank_of_specfold_generate(tmp_path):
    p, rank = _generate_tp2(tmp_path)
    try:
        os.killpg(p.pid, signal.SIGINT)  # what a terminal does: every process of the group gets it
        stdout, stderr = p.communicate(timeout=KILL_BOUND_S)  # not the collective timeout (120 s) and more
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 130, stderr[-3000:]
    assert stderr.strip().splitlines() == [STARTED, "interrupted"] and stdout == ""
    assert not _alive(rank) and _in_group(p.pid) == []  # the rank, and anything else the command started
