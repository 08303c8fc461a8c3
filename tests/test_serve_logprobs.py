"""logprobs through a real server (uvicorn on loopback, the tiny model): chat (`logprobs: true`,
`top_logprobs`) and completions (`logprobs: N`), plain and streamed, in OpenAI's shapes, equal to
what the library returns for the same request (float32 on the CPU: the server's speculative engine rounds
differently from the library's vanilla one, hence the tolerance; float64 equality is tests/test_logprobs.py);
bad values are one 400 saying what is accepted."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
import httpx  # noqa: E402

from specfold.engine.engine import Engine  # noqa: E402
from specfold.params import EngineConfig, SamplingParams  # noqa: E402
from specfold.serve.app import ServeConfig, create_app  # noqa: E402
from tests.serve_helpers import LiveServer  # noqa: E402

TOL = 1e-4
Q = "Ben has 4 stickers. He buys 5 more stickers. Then he sells 2 stickers. How many stickers does Ben have now?"
P = "Anna has 5 shells. She loses 2 shells."


@pytest.fixture(scope="module")
def llm(tiny_llm):
    return tiny_llm


@pytest.fixture(scope="module")
def server(llm):
    with LiveServer(create_app(llm, Engine(llm, EngineConfig(method="spiffy")),
                               ServeConfig(model_name="tiny", max_tokens=32))) as live:
        yield live


def approx(x):
    return pytest.approx(x, abs=TOL, rel=0)


def text_of(llm, t: int) -> str:
    return llm.tokenizer.decode([t], skip_special_tokens=False)


def library(llm, ids: list[int], n: int, **kw):
    return llm.generate([ids], SamplingParams(max_new_tokens=32, logprobs=n, **kw))[0]


def chat_ids(llm, q: str) -> list[int]:
    return llm.tokenizer.encode(llm.tokenizer.apply_chat_template([{"role": "user", "content": q}]))


def sse(r) -> list[dict]:
    return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def test_chat_plain_and_streamed(llm, server):
    want = library(llm, chat_ids(llm, Q), 3)
    body = {"model": "tiny", "messages": [{"role": "user", "content": Q}], "logprobs": True, "top_logprobs": 3}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    content = ch["logprobs"]["content"]
    assert len(content) == len(want.token_ids) > 0
    for e, t, d in zip(content, want.token_ids, want.logprobs):
        assert set(e) == {"token", "logprob", "bytes", "top_logprobs"}
        assert e["token"] == text_of(llm, t) and e["bytes"] == list(e["token"].encode())
        assert e["logprob"] == approx(d[t]) and e["logprob"] <= 0
        assert [x["token"] for x in e["top_logprobs"]] == [text_of(llm, k) for k in list(d)[:3]]
        assert [x["logprob"] for x in e["top_logprobs"]] == approx(list(d.values())[:3])
        assert all(set(x) == {"token", "logprob", "bytes"} for x in e["top_logprobs"])
    assert "".join(e["token"] for e in content) == ch["message"]["content"] == want.text
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=dict(body, stream=True), timeout=120) as s:
        chunks = sse(s)
    streamed = [e for c in chunks for ch in c["choices"] if ch["logprobs"] for e in ch["logprobs"]["content"]]
    assert [e["token"] for e in streamed] == [e["token"] for e in content]
    assert [e["logprob"] for e in streamed] == approx([e["logprob"] for e in content])
    for c in chunks:  # each chunk carries the logprobs of the text it carries
        for ch in c["choices"]:
            if ch["logprobs"]:
                assert "".join(e["token"] for e in ch["logprobs"]["content"]) == ch["delta"]["content"]
    assert sum(1 for c in chunks for ch in c["choices"] if ch["logprobs"]) > 1  # several blocks, several chunks


def test_chat_with_the_openai_client(llm, server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": Q}], logprobs=True,
                                       max_tokens=16)
    want = llm.generate([chat_ids(llm, Q)], SamplingParams(max_new_tokens=16, logprobs=0))[0]
    content = r.choices[0].logprobs.content
    assert [c.logprob for c in content] == approx([d[t] for d, t in zip(want.logprobs, want.token_ids)])
    assert all(c.top_logprobs == [] for c in content)
    plain = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": Q}], max_tokens=16)
    assert plain.choices[0].logprobs is None


def test_completions_plain_and_streamed(llm, server):
    ids = llm.tokenizer.encode(P)
    want = library(llm, ids, 2)
    body = {"model": "tiny", "prompt": P, "logprobs": 2}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    lp = ch["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert lp["tokens"] == [text_of(llm, t) for t in want.token_ids]
    assert lp["token_logprobs"] == approx([d[t] for d, t in zip(want.logprobs, want.token_ids)])
    assert lp["top_logprobs"] == [approx({text_of(llm, k): v for k, v in d.items()}) for d in want.logprobs]
    assert all(len(d) in (2, 3) for d in lp["top_logprobs"])
    offsets = [sum(len(s) for s in lp["tokens"][:i]) for i in range(len(lp["tokens"]))]
    assert lp["text_offset"] == offsets and ch["text"] == want.text
    with httpx.stream("POST", server.url + "/v1/completions", json=dict(body, stream=True), timeout=120) as s:
        chunks = sse(s)
    parts = [ch["logprobs"] for c in chunks for ch in c["choices"] if ch["logprobs"]]
    assert len(parts) > 1
    joined = {key: [x for p in parts for x in p[key]] for key in lp}
    assert joined["tokens"] == lp["tokens"] and joined["text_offset"] == lp["text_offset"]  # offsets continue
    assert joined["token_logprobs"] == approx(lp["token_logprobs"])
    assert joined["top_logprobs"] == [approx(d) for d in lp["top_logprobs"]]


def test_completions_n_choices_sampled(llm, server):
    """Each choice carries its own tokens' logprobs (choice i = the engine request of seed + i)."""
    ids = llm.tokenizer.encode(P)
    body = {"model": "tiny", "prompt": P, "logprobs": 1, "n": 2, "seed": 5, "temperature": 1.5, "max_tokens": 24}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=120).json()
    for i, ch in enumerate(r["choices"]):
        want = llm.generate([ids], SamplingParams(max_new_tokens=24, temperature=1.5, seed=5 + i, logprobs=1))[0]
        assert ch["logprobs"]["token_logprobs"] == approx([d[t] for d, t in zip(want.logprobs, want.token_ids)])
    assert r["choices"][0]["logprobs"] != r["choices"][1]["logprobs"]


@pytest.mark.parametrize("path,extra,param,words", [
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "integer in [0, 20]"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs", "needs 'logprobs': true"),
    ("/v1/chat/completions", {"logprobs": 3}, "logprobs", "true or false"),
    ("/v1/completions", {"logprobs": 21}, "logprobs", "integer in [0, 20]"),
    ("/v1/completions", {"logprobs": True}, "logprobs", "integer in [0, 20]"),
])
def test_bad_values_are_one_400(server, path, extra, param, words):
    base = {"model": "tiny", "messages": [{"role": "user", "content": "x"}]} if "chat" in path else \
        {"model": "tiny", "prompt": "x"}
    r = httpx.post(server.url + path, json=dict(base, **extra), timeout=60)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"] and "\n" not in err["message"], err
