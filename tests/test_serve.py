"""OpenAI-compatible server: completions, chat, streaming and errors, against generate()."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from specfold import LLM, DecodeParams  # noqa: E402
from specfold.serve import create_app  # noqa: E402


@pytest.fixture(scope="module")
def client_and_llm(checkpoint):
    llm = LLM(checkpoint("qwen2", peaked=30.0), dtype="float64")
    return TestClient(create_app(llm, DecodeParams(max_new_tokens=8), "test-model")), llm


def test_models_and_completion_matches_generate(client_and_llm):
    client, llm = client_and_llm
    assert client.get("/v1/models").json()["data"][0]["id"] == "test-model"
    r = client.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 6, "rule": "static"})
    assert r.status_code == 200, r.text
    body = r.json()
    want = llm.generate([[1, 2, 3]], DecodeParams(max_new_tokens=6, rule="static"))[0]
    assert body["usage"]["completion_tokens"] == len(want.token_ids)
    assert body["usage"]["specfold"]["nfe"] == want.stats.nfe
    assert body["choices"][0]["finish_reason"] == want.finish_reason


def test_stream_and_errors(client_and_llm):
    client, _ = client_and_llm
    r = client.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 4, "stream": True})
    lines = [ln for ln in r.text.splitlines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and json.loads(lines[0][6:])["object"] == "text_completion"
    bad = client.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 0})
    assert bad.status_code == 400 and "max_new_tokens" in bad.json()["detail"]
    bad = client.post("/v1/completions", json={"prompt": [1, 2], "rule": "nope"})
    assert bad.status_code == 400 and "unknown rule" in bad.json()["detail"]
    bad = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert bad.status_code == 400 and "tokenizer" in bad.json()["detail"]
