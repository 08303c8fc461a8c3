"""What an operator needs from the server: bounded requests, an API key, Prometheus metrics.

Real uvicorn servers on loopback (in-process, and one `python -m specfold serve` subprocess) with the
embedded tiny model. References are independent of the server: `LLM.generate` on the same prompts
(texts, forwards, accepted drafts, fold ratios), the engine's own context, and the raw HTTP bytes.
The one timing assertion is the issue's: a 50 MB body is refused in under a second (it takes
milliseconds; the body is never read). Other waits are liveness bounds.
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
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
import httpx  # noqa: E402

from specfold import LLM  # noqa: E402
from specfold.engine.engine import Engine  # noqa: E402
from specfold.params import EngineConfig, SamplingParams  # noqa: E402
from specfold.serve.app import ServeConfig, create_app  # noqa: E402
from tests.serve_helpers import LiveServer, wait_for_server, wait_until  # noqa: E402

pytestmark = pytest.mark.slow  # servers under load, subprocess servers, large bodies

ROOT = Path(__file__).resolve().parents[1]
Q = "Ben has 4 stickers. He buys 5 more stickers. Then he sells 2 stickers. How many stickers does Ben have now?"
END = "<|endoftext|>"  # the tiny tokenizer's longest token: 13 characters, one token


def live(llm, engine: dict | None = None, **config) -> LiveServer:
    eng = Engine(llm, EngineConfig(**(engine or {})))
    return LiveServer(create_app(llm, eng, ServeConfig(model_name="tiny", **config)))


@pytest.fixture(scope="module")
def llm(tiny_llm):
    return tiny_llm


@pytest.fixture(scope="module")
def endless():
    """The tiny model with no stop token: every request runs to max_tokens (long streams)."""
    return LLM("tiny", overrides={"stop_token_ids": []})


def raw_post(port: int, size: int, chunked: bool) -> tuple[int, dict, float]:
    """POST a `size`-byte body over a plain socket (sent from a thread, as a real client would keep
    sending); -> (status, JSON body, seconds until the whole response was read)."""
    sock = socket.create_connection(("127.0.0.1", port))
    length = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
    t0 = time.monotonic()
    sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"{length}\r\n\r\n".encode())

    def send():
        piece = b"x" * (1 << 20)
        try:
            for _ in range(size // len(piece)):
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
        except OSError:  # the server answered and closed: nothing more to send
            pass
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    data = b""
    while True:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if sep:
            want = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")))
            if len(rest) >= want:
                break
        got = sock.recv(65536)
        assert got, "the server closed the connection without an answer"
        data += got
    seconds = time.monotonic() - t0
    sock.close()
    sender.join(30)
    return int(head.split()[1]), json.loads(rest[:want]), seconds


def stream_in_thread(url: str, body: dict) -> tuple[threading.Thread, list]:
    """A streaming completion read in a thread: [(arrival time, data)] as the events come."""
    events: list = []

    def run():
        with httpx.stream("POST", url + "/v1/completions", json=dict(body, stream=True), timeout=300) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append((time.monotonic(), line[6:]))
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, events


def streamed_text(events: list) -> str:
    return "".join(json.loads(e)["choices"][0]["text"] for _, e in events if e != "[DONE]" and json.loads(e)["choices"])


# ---------------------------------------------------------------------------------- bounded requests
def test_a_50_mb_body_is_413_in_under_a_second_while_a_stream_goes_on(endless):
    with live(endless) as s:
        t, events = stream_in_thread(s.url, {"model": "tiny", "prompt": Q, "max_tokens": 256})
        wait_until(lambda: len(events) >= 2, "the stream's first chunks")
        status, body, seconds = raw_post(s.port, 50_000_000, chunked=False)
        assert status == 413 and body["error"]["code"] == "request_too_large" and body["error"]["type"]
        assert "at most 16777216 bytes" in body["error"]["message"]
        assert seconds < 1.0, seconds
        status, body, _ = raw_post(s.port, 50_000_000, chunked=True)  # no Content-Length: counted as it comes
        assert status == 413 and body["error"]["code"] == "request_too_large"
        at_413 = len(events)
        t.join(300)
    assert events[-1][1] == "[DONE]" and len(events) > at_413 + 1  # it kept streaming, and finished
    assert streamed_text(events) == endless.generate([Q], SamplingParams(max_new_tokens=256))[0].text


def test_the_body_cap_is_configurable(llm):
    with live(llm, max_body_bytes=2000) as s:
        body = {"model": "tiny", "prompt": Q, "max_tokens": 4, "user": "u" * 1500}
        assert len(json.dumps(body)) < 2000
        assert httpx.post(s.url + "/v1/completions", json=body, timeout=120).status_code == 200
        r = httpx.post(s.url + "/v1/completions", json=dict(body, user="u" * 2500), timeout=120)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_a_prompt_that_cannot_fit_is_refused_before_tokenizing(llm):
    ctx = llm.spec.max_position_embeddings
    budget = ctx - 4  # with max_tokens = 4
    with live(llm) as s:
        def post(prompt, path="/v1/completions"):
            body = {"model": "tiny", "max_tokens": 4}
            body.update({"messages": [{"role": "user", "content": prompt}]} if "chat" in path else {"prompt": prompt})
            return httpx.post(s.url + path, json=body, timeout=120)
        # exactly `budget` tokens of 13 characters: at the bound, and it fits (prompt + max_tokens = context)
        r = post(END * budget)
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == budget
        # one character more cannot fit: refused by the bound, without tokenizing (the message says so)
        for prompt, path, param in ((END * budget + "x", "/v1/completions", "prompt"),
                                    ("x" * (13 * ctx), "/v1/chat/completions", "messages")):
            r = post(prompt, path)
            err = r.json()["error"]
            assert r.status_code == 400 and (err["param"], err["code"]) == (param, "context_length_exceeded")
            assert "no token of this tokenizer stands for more than 13 characters" in err["message"]
        assert len(llm.tokenizer.encode(END * budget + "x")) > budget  # and indeed it would not fit
        # under the bound but too many tokens: tokenized, then refused by the count
        r = post("7" * 2000)
        assert r.status_code == 400 and "prompt of 2000 tokens + max_tokens=4 exceeds" in r.json()["error"]["message"]


def test_tokenizing_a_long_prompt_does_not_stop_the_other_streams():
    """A prompt just under the bound of a long-context model takes seconds to tokenize; meanwhile the
    engine thread and the event loop go on (the tokenizer runs with the GIL released): a stream
    sampled at temperature 2 (text in every block) keeps delivering chunks."""
    big = LLM("tiny", overrides={"stop_token_ids": [], "max_position_embeddings": 400_000})
    with live(big) as s:
        t, events = stream_in_thread(s.url, {"model": "tiny", "prompt": Q, "max_tokens": 2000, "temperature": 2.0,
                                             "seed": 1})
        wait_until(lambda: len(events) >= 3, "the stream's first chunks")
        text = "Tom has 3 apples. " * 250_000  # 4.5 M characters: under the bound, ~1.5 M tokens
        t0 = time.monotonic()
        r = httpx.post(s.url + "/v1/completions", json={"model": "tiny", "prompt": text, "max_tokens": 4}, timeout=600)
        t1 = time.monotonic()
        assert r.status_code == 400 and "tokens + max_tokens=4 exceeds" in r.json()["error"]["message"]
        t.join(300)
    during = [e for e in events if t0 < e[0] < t1]
    assert len(during) >= 2, (t1 - t0, len(during), len(events))  # a blocked loop or engine delivers none
    assert events[-1][1] == "[DONE]"


# ---------------------------------------------------------------------------------- API key
def test_api_key_guards_every_v1_route(llm):
    openai = pytest.importorskip("openai")
    with live(llm, api_key="s3cret") as s:
        def get(path, auth=None):
            return httpx.get(s.url + path, headers={"Authorization": auth} if auth else {}, timeout=60)
        for auth in (None, "Bearer wrong", "Bearer s3cre", "Bearer s3cret2", "Basic s3cret", "s3cret", "Bearer"):
            for path in ("/v1/models", "/v1/models/tiny", "/v1/nope", "/v1"):
                r = get(path, auth)
                assert r.status_code == 401, (auth, path)
                assert r.json()["error"]["code"] == "invalid_api_key" and r.headers["www-authenticate"] == "Bearer"
        r = httpx.post(s.url + "/v1/completions", json={"model": "tiny", "prompt": Q, "max_tokens": 4})
        assert r.status_code == 401  # refused before the body is read or parsed
        assert get("/v1/models", "Bearer s3cret").status_code == 200
        assert get("/v1/models", "bearer s3cret").status_code == 200  # the scheme is case-insensitive
        two = httpx.get(s.url + "/v1/models", headers=[("Authorization", "Bearer s3cret"), ("Authorization", "Bearer x")])
        assert two.status_code == 401
        assert get("/health").status_code == 200 and get("/metrics").status_code == 200  # probes stay open
        ok = openai.OpenAI(base_url=s.url + "/v1", api_key="s3cret", max_retries=0, timeout=120)
        assert ok.completions.create(model="tiny", prompt=Q, max_tokens=8).choices[0].text == \
            llm.generate([Q], SamplingParams(max_new_tokens=8))[0].text
        bad = openai.OpenAI(base_url=s.url + "/v1", api_key="nope", max_retries=0, timeout=120)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()


# ---------------------------------------------------------------------------------- metrics
def scrape(url: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families
    r = httpx.get(url + "/metrics", timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for fam in text_string_to_metric_families(r.text):
        for smp in fam.samples:
            key = smp.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(smp.labels.items())) + "}"
                              if smp.labels and "le" not in smp.labels else "")
            if "le" not in smp.labels:
                out[key] = smp.value
    return out


COUNTERS = ("specfold:prompt_tokens_total", "specfold:generation_tokens_total", "specfold:forwards_total",
            "specfold:draft_tokens_accepted_total")


def ask_all(url: str, prompts: list[str], max_tokens: int) -> tuple[list[str], int, list[dict]]:
    """Every prompt from its own client thread (every other one streamed), scraping /metrics until
    all are answered -> (texts, completion tokens by the responses' usage, scrapes)."""
    texts: list = []
    used: list = []

    def ask(p, stream):
        body = {"model": "tiny", "prompt": p, "max_tokens": max_tokens}
        if not stream:
            r = httpx.post(url + "/v1/completions", json=body, timeout=300).json()
            texts.append(r["choices"][0]["text"])
            used.append(r["usage"]["completion_tokens"])
            return
        body.update(stream=True, stream_options={"include_usage": True})
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as r:
            events = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: {")]
        texts.append("".join(e["choices"][0]["text"] for e in events if e["choices"]))
        used.append(events[-1]["usage"]["completion_tokens"])
    threads = [threading.Thread(target=ask, args=(p, i % 2 == 0), daemon=True) for i, p in enumerate(prompts)]
    for t in threads:
        t.start()
    scrapes = []
    while any(t.is_alive() for t in threads):
        scrapes.append(scrape(url))
        time.sleep(0.05)
    return texts, sum(used), scrapes + [scrape(url)]


PROMPTS = [f"Tom has {i} apples and buys {i + 2} more. How many apples does Tom have now?" for i in range(1, 7)]


def test_metrics_move_under_load_and_match_the_library(llm):
    want = llm.generate(PROMPTS, SamplingParams(max_new_tokens=48))
    with live(llm, {"max_num_seqs": 2}) as s, live(llm) as other:
        texts, used, scrapes = ask_all(s.url, PROMPTS, 48)
        quiet = scrape(other.url)
    final = scrapes[-1]
    assert sorted(texts) == sorted(w.text for w in want) and used == sum(len(w.token_ids) for w in want)
    for name in COUNTERS:  # counters never go back
        values = [m[name] for m in scrapes]
        assert values == sorted(values), name
    assert any(0 < m["specfold:generation_tokens_total"] < final["specfold:generation_tokens_total"] for m in scrapes)
    assert any(0 < m["specfold:forwards_total"] < final["specfold:forwards_total"] for m in scrapes)
    assert any(m["specfold:num_requests_running"] >= 1 for m in scrapes)
    assert any(m["specfold:num_requests_waiting"] >= 1 for m in scrapes)  # 6 clients, 2 slots
    assert final["specfold:num_requests_running"] == final["specfold:num_requests_waiting"] == 0
    assert final["specfold:prompt_tokens_total"] == sum(len(w.prompt_token_ids) for w in want)
    assert final["specfold:generation_tokens_total"] == sum(len(w.token_ids) for w in want)
    assert final["specfold:forwards_total"] == sum(w.stats.nfe for w in want)
    assert final["specfold:draft_tokens_accepted_total"] == 0 and final["specfold:fold_ratio_count"] == 0  # vanilla
    for h in ("specfold:time_to_first_token_seconds", "specfold:e2e_request_latency_seconds"):
        assert final[h + "_count"] == len(PROMPTS) and final[h + "_sum"] > 0
    assert final["specfold:e2e_request_latency_seconds_sum"] > final["specfold:time_to_first_token_seconds_sum"]
    reasons: dict = {}
    for w in want:
        reasons[w.finish_reason] = reasons.get(w.finish_reason, 0) + 1
    for reason, count in reasons.items():
        assert final[f"specfold:request_success_total{{finished_reason={reason}}}"] == count
    assert all(quiet[name] == 0 for name in COUNTERS)  # the other server's registry saw none of it


def test_metrics_count_accepted_drafts_and_fold_ratios(llm):
    """SpecFold under the static rule: drafts are accepted and verifications folded. (Its forward
    counts vary from run to run, so there is no second run to compare forwards with exactly.)"""
    with live(llm, {"method": "specfold", "rule": "static", "max_num_seqs": 1, "draft_budget": 7}) as s:
        texts, tokens, scrapes = ask_all(s.url, PROMPTS[:3], 48)
    final = scrapes[-1]
    assert final["specfold:generation_tokens_total"] == tokens
    assert final["specfold:draft_tokens_accepted_total"] > 0
    assert 0 < final["specfold:forwards_total"] < tokens  # the static rule alone needs a forward per token
    assert 1 <= final["specfold:fold_ratio_count"] <= 3
    assert 0 < final["specfold:fold_ratio_sum"] / final["specfold:fold_ratio_count"] <= 1
    # the chosen budgets: a fixed 7, so every verification verified at most 7 drafts
    assert final["specfold:draft_budget_count"] > 0 and final["specfold:drafts_verified_total"] > 0
    assert final["specfold:draft_budget_sum"] == final["specfold:drafts_verified_total"]
    assert final["specfold:draft_budget_sum"] <= 7 * final["specfold:draft_budget_count"]


def test_metrics_report_auto_budgets(llm):
    """Auto draft budgets: the budgets chosen are scraped."""
    with live(llm, {"method": "spiffy", "rule": "static", "max_num_seqs": 4}) as s:
        _, tokens, scrapes = ask_all(s.url, PROMPTS[:4], 32)
    final = scrapes[-1]
    assert final["specfold:generation_tokens_total"] == tokens
    assert final["specfold:draft_budget_count"] >= final["specfold:forwards_total"] / 4  # one per verification
    assert final["specfold:draft_budget_sum"] == final["specfold:drafts_verified_total"]


# ---------------------------------------------------------------------------------- the command line
def _free_port() -> int:
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


@pytest.mark.parametrize("sig, status, line", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_specfold_serve_with_a_key_and_a_cap(sig, status, line):
    """`specfold serve --api-key ... --max-body-bytes ...` as a user starts it; the key from the
    environment; Ctrl-C / SIGTERM end it quietly."""
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    argv = [sys.executable, "-m", "specfold", "serve", "--model", "tiny", "--port", str(port), "--log-level", "warning",
            "--max-body-bytes", "100000", "--threads", "1"]
    if sig == signal.SIGINT:
        argv += ["--api-key", "k-123"]
    else:
        env["SPECFOLD_API_KEY"] = "k-123"
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_server(p, url)
        body = {"model": "tiny", "prompt": Q, "max_tokens": 4}
        assert httpx.post(url + "/v1/completions", json=body, timeout=60).status_code == 401
        key = {"Authorization": "Bearer k-123"}
        assert httpx.post(url + "/v1/completions", json=body, headers=key, timeout=120).status_code == 200
        r = httpx.post(url + "/v1/completions", json=dict(body, user="u" * 200_000), headers=key, timeout=60)
        assert r.status_code == 413
        assert "specfold:generation_tokens_total 4.0" in httpx.get(url + "/metrics", timeout=60).text
    finally:
        p.send_signal(sig)
        _, err = p.communicate(timeout=120)
    assert "Traceback" not in err and p.returncode == status, err[-2000:]
    assert err.strip().splitlines()[-1] == line


def test_specfold_serve_says_what_it_serves_and_where():
    """Before serving, one stderr line names the model, the method, the unmask rule and the address:
    the bound one (with --port 0, the free port picked), where the server then answers."""
    import re
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    argv = [sys.executable, "-m", "specfold", "serve", "--model", "tiny", "--port", "0", "--log-level", "warning",
            "--method", "freedave", "--rule", "static", "--threads", "1"]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(p.stderr), daemon=True).start()
    try:
        wait_until(lambda: p.poll() is not None or any(x.startswith("specfold serve:") for x in lines),
                   "the start-up line", limit=300, every=0.1)
        said = [x.rstrip("\n") for x in lines if x.startswith("specfold serve:")]
        assert len(said) == 1, lines
        m = re.fullmatch(r"specfold serve: tiny, method freedave, rule static, on http://127\.0\.0\.1:(\d+)", said[0])
        assert m and int(m[1]) > 0, said
        assert httpx.get(f"http://127.0.0.1:{m[1]}/health", timeout=30).status_code == 200
    finally:
        p.send_signal(signal.SIGINT)
        p.wait(timeout=120)
    assert p.returncode == 130, "".join(lines)[-2000:]


def test_an_empty_api_key_is_one_line(capsys, monkeypatch):
    from specfold.cli import main
    rc = main(["serve", "--model", "tiny", "--api-key", " "])
    assert rc == 2 and capsys.readouterr().err.strip() == (
        "error: the API key (--api-key or SPECFOLD_API_KEY) is empty; give a key or leave both unset")
    monkeypatch.setenv("SPECFOLD_API_KEY", "")
    assert main(["serve", "--model", "tiny"]) == 2
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["serve", "--model", "tiny", "--max-body-bytes", "0"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "--max-body-bytes: expected a positive integer" in err
