"""The OpenAI-compatible server end to end: a real uvicorn server on loopback, the real engine and the
embedded tiny model, driven by the official `openai` client and by raw HTTP (httpx).

References are independent of the server: `LLM.generate` on the same prompt and params (its own
engine), and the engine's own state (runner counters, `Engine.has_unfinished`) for cancellation. No
timing assertions: waits are liveness bounds only.
"""
from __future__ import annotations

import json
import threading

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
import httpx  # noqa: E402

from specfold import LLM  # noqa: E402
from specfold.engine.engine import Engine  # noqa: E402
from specfold.params import EngineConfig, SamplingParams  # noqa: E402
from specfold.serve.app import ServeConfig, create_app  # noqa: E402
from tests.serve_helpers import LiveServer, wait_until  # noqa: E402

Q1 = "Ben has 4 stickers. He buys 5 more stickers. Then he sells 2 stickers. How many stickers does Ben have now?"
Q2 = "Anna has 5 shells. She loses 2 shells. Then she buys 6 more shells. How many shells does Anna have now?"


def serve(llm, max_tokens=64, **engine):
    eng = Engine(llm, EngineConfig(**engine))
    return LiveServer(create_app(llm, eng, ServeConfig(model_name="tiny", max_tokens=max_tokens))), eng


@pytest.fixture(scope="module")
def llm(tiny_llm):
    return tiny_llm


@pytest.fixture(scope="module")
def server(llm):
    live, eng = serve(llm, max_num_seqs=16)
    with live:
        live.engine = eng
        yield live


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture
def chat_reference(llm, vanilla_refs):
    """`chat_reference(q, max_new_tokens) -> Ref`: what the library returns for one chat turn
    (independent of the server), decoded once for the session (conftest.vanilla_refs)."""
    def ref(q, max_new_tokens):
        ids = llm.tokenizer.encode(llm.tokenizer.apply_chat_template([{"role": "user", "content": q}]))
        return vanilla_refs(llm, [ids], SamplingParams(max_new_tokens=max_new_tokens))[0]
    return ref


def health(server) -> dict:
    return httpx.get(server.url + "/health").json()


# ---------------------------------------------------------------------------------- happy paths
def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    h = httpx.get(server.url + "/health")
    assert h.status_code == 200 and h.json()["status"] == "ok"


def test_chat_equals_library_and_counts_usage(llm, client, chat_reference):
    want = chat_reference(Q1, max_new_tokens=64)
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": Q1}], max_tokens=64,
                                       temperature=0)
    assert r.choices[0].message.content == want.text and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == want.finish_reason
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(want.prompt_token_ids), len(want.token_ids))
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    parts = [{"type": "text", "text": Q1[:20]}, {"type": "text", "text": Q1[20:]}]
    r2 = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": parts}],
                                        max_completion_tokens=64, temperature=0)
    assert r2.choices[0].message.content == want.text


def test_completions_prompts_and_n_index_choices(llm, client):
    ids = llm.tokenizer.encode(Q2)
    r = client.completions.create(model="tiny", prompt=[Q1, ids], n=2, max_tokens=24, temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    want = llm.generate([Q1, ids], SamplingParams(max_new_tokens=24))
    assert [c.text for c in r.choices] == [want[0].text] * 2 + [want[1].text] * 2
    assert r.usage.prompt_tokens == len(want[0].prompt_token_ids) + len(ids)
    assert r.usage.completion_tokens == 2 * sum(len(w.token_ids) for w in want)


def test_stream_arrives_block_by_block(llm, client, chat_reference):
    want = chat_reference(Q1, max_new_tokens=64)
    assert len(want.token_ids) > llm.spec.block_size  # the answer spans several blocks
    chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": Q1}],
                                                 max_tokens=64, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(texts) >= 2 and "".join(texts) == want.text
    assert finish == [want.finish_reason]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(want.token_ids)


def test_stream_n_choices(client, chat_reference):
    want = chat_reference(Q2, max_new_tokens=40).text
    texts = {0: "", 1: ""}
    finish = {}
    for c in client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": Q2}],
                                            max_tokens=40, temperature=0, n=2, stream=True):
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
    assert texts == {0: want, 1: want} and set(finish) == {0, 1}


def test_stream_raw_sse_completions(llm, server):
    prompt = llm.tokenizer.apply_chat_template([{"role": "user", "content": Q2}])  # the chat turn, as text
    want = llm.generate([prompt], SamplingParams(max_new_tokens=48))[0]
    assert len(want.token_ids) > llm.spec.block_size
    with httpx.stream("POST", server.url + "/v1/completions", timeout=120,
                      json={"model": "tiny", "prompt": prompt, "max_tokens": 48, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert all(ln.startswith("data: ") for ln in lines) and lines[-1] == "data: [DONE]"
    events = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert all(e["object"] == "text_completion" for e in events)
    assert "".join(e["choices"][0]["text"] for e in events) == want.text
    assert events[-1]["choices"][0]["finish_reason"] == want.finish_reason
    assert sum(1 for e in events if e["choices"][0]["text"]) >= 2


def test_stop_strings_cut_the_output(client, chat_reference):
    full = chat_reference(Q1, max_new_tokens=64).text
    stop = "more"
    assert stop in full
    msgs = [{"role": "user", "content": Q1}]
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=64, temperature=0, stop=[stop, "zzz"])
    assert r.choices[0].message.content == full[:full.index(stop)] and r.choices[0].finish_reason == "stop"
    s = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=64, temperature=0, stop=stop,
                                       stream=True)
    got = [(c.choices[0].delta.content or "", c.choices[0].finish_reason) for c in s if c.choices]
    assert "".join(t for t, _ in got) == full[:full.index(stop)] and got[-1][1] == "stop"


def test_seed_and_n_at_temperature(llm, client):
    prompt = "Ben has 4 stickers. He buys 5 more stickers."  # not a chat turn: the model is unsure here

    def ask(**kw):
        r = client.completions.create(model="tiny", prompt=prompt, max_tokens=32, temperature=2.0, **kw)
        return [c.text for c in r.choices]
    a = ask(n=3, seed=7)
    assert len(a) == 3 and ask(n=3, seed=7) == a  # same seed, same texts
    assert ask(seed=8) == [a[1]] and ask(seed=9) == [a[2]]  # choice i is seed + i (documented)
    assert a[0] == llm.generate([prompt], SamplingParams(max_new_tokens=32, temperature=2.0, seed=7))[0].text
    many = {t for s in range(20, 26) for t in ask(seed=s)}
    assert len(many) > 1  # different seeds do sample differently at this temperature
    unseeded = {t for _ in range(4) for t in ask(n=2)}
    assert len(unseeded) > 1  # no seed: the server draws one per request


# ---------------------------------------------------------------------------------- errors
MALFORMED = [  # (path, raw body or JSON, status, param)
    ("/v1/chat/completions", b"{not json", 400, None),
    ("/v1/chat/completions", b"", 400, None),
    ("/v1/chat/completions", [1, 2], 400, None),
    ("/v1/chat/completions", {"model": "tiny"}, 400, "messages"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [5]}, 400, "messages[0]"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user"}]}, 400, "messages[0].content"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {}}]}]}, 400, "messages[0].content"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "seed": "x"},
     400, "seed"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "logprobs": True,
      "top_logprobs": 21}, 400, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}, 400, "model"),
    ("/v1/chat/completions", {"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "graph": "/etc/passwd"}, 400, "graph"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "echo": True}, 400, "echo"),
    ("/v1/completions", {"model": "tiny", "prompt": [10**6]}, 400, "prompt"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 5000}, 400, "max_tokens"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "temperature": "0"}, 400, "temperature"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "n": 0}, 400, "n"),
    ("/v1/nope", {"model": "tiny"}, 404, None),
]


@pytest.mark.parametrize("path,body,status,param", MALFORMED, ids=[f"{i}:{p}" for i, (_, _, _, p) in
                                                                   enumerate(MALFORMED)])
def test_malformed_bodies_get_openai_errors(server, path, body, status, param):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(server.url + path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"] and err["param"] == param
    if param and status == 400:
        assert param.split("[")[0].split(".")[0] in err["message"]


def test_wrong_method_and_client_errors(server, client):
    r = httpx.get(server.url + "/v1/chat/completions")
    assert r.status_code == 405 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="presence_penalty"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                       presence_penalty=0.5)
    with pytest.raises(openai.BadRequestError, match="unknown field 'method'"):
        client.completions.create(model="tiny", prompt="x", extra_body={"method": "spiffy"})


# ---------------------------------------------------------------------------------- load
@pytest.mark.slow
def test_sixteen_concurrent_clients(server, client, chat_reference):
    before = health(server)
    want = {q: chat_reference(q, max_new_tokens=32).text for q in (Q1, Q2)}
    errors, texts = [], []

    def worker(i):
        try:
            c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
            for k in range(3):
                q = (Q1, Q2)[(i + k) % 2]
                r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": q}],
                                              max_tokens=32, temperature=0)
                texts.append(r.choices[0].message.content == want[q])
        except Exception as e:  # noqa: BLE001 (collected and asserted below)
            errors.append(repr(e))
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert errors == [] and len(texts) == 48 and all(texts)  # batch invariance: same text as alone
    after = health(server)
    assert after["added"] - before["added"] == 48 and after["finished"] - before["finished"] == 48
    assert after["max_running"] > 1  # requests were decoded together, not one after another
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": Q1}], max_tokens=8)
    assert r.choices[0].finish_reason in ("stop", "length")


# ---------------------------------------------------------------------------------- cancellation
@pytest.fixture(scope="module")
def narrow():
    """One slot, no queue, and no stop tokens (every request runs to max_tokens): a request that is
    not aborted keeps the engine full and the next one is refused with 429."""
    live, eng = serve(LLM("tiny", overrides={"stop_token_ids": []}), max_tokens=8, max_num_seqs=1, max_waiting=0)
    with live:
        live.engine = eng
        yield live


LONG = {"model": "tiny", "prompt": Q1, "max_tokens": 900}


def test_full_engine_answers_429(narrow):
    with httpx.stream("POST", narrow.url + "/v1/completions", json=dict(LONG, stream=True), timeout=120) as r:
        assert r.status_code == 200
        lines = r.iter_lines()  # (keep the iterator: dropping it closes the stream)
        assert next(lines).startswith("data: ")  # the request is running
        busy = httpx.post(narrow.url + "/v1/completions", json={"model": "tiny", "prompt": "x"})
        assert busy.status_code == 429 and busy.json()["error"]["code"] == "engine_full"
        assert busy.headers["retry-after"] == "1"
    wait_until(lambda: health(narrow)["running"] == 0, "the closed stream to be aborted")
    wait_until(lambda: not narrow.engine.has_unfinished(), "the engine to drain")
    before = health(narrow)
    both = httpx.post(narrow.url + "/v1/completions", json={"model": "tiny", "prompt": "x", "n": 2})
    assert both.status_code == 429  # n=2 needs two slots: refused as a whole, the first one taken back
    h = health(narrow)
    assert h["refused"] == before["refused"] + 1 and h["added"] == before["added"] and h["running"] == 0
    wait_until(lambda: not narrow.engine.has_unfinished(), "the engine to drain")
    assert not narrow.engine.requests


def _next_request_runs(narrow, aborted_before):
    wait_until(lambda: health(narrow)["aborted"] == aborted_before + 1, "the abandoned request to be aborted")
    wait_until(lambda: not narrow.engine.has_unfinished(), "the engine to drain")  # (the abort delta)
    assert narrow.engine.num_running() == 0 and not narrow.engine.requests  # its slot and cache are freed
    r = httpx.post(narrow.url + "/v1/completions", json={"model": "tiny", "prompt": Q2, "max_tokens": 8},
                   timeout=120)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
    h = health(narrow)
    assert h["aborted"] == aborted_before + 1 and h["running"] == 0


def test_stream_disconnect_aborts(narrow):
    before = health(narrow)
    with httpx.stream("POST", narrow.url + "/v1/completions", json=dict(LONG, stream=True), timeout=120) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        assert next(lines) == "" and next(lines).startswith("data: ")  # tokens are flowing
    _next_request_runs(narrow, before["aborted"])
    assert health(narrow)["finished"] == before["finished"] + 1  # only the second one finished


def test_non_stream_disconnect_aborts(narrow):
    before = health(narrow)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(narrow.url + "/v1/completions", json=LONG, timeout=httpx.Timeout(120, read=0.5))
    _next_request_runs(narrow, before["aborted"])
