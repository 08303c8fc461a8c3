"""Genuine internal errors: a 500 in OpenAI's error shape (never a traceback), and the server keeps serving.

A fake engine whose `step` fails stands in for a bug; no decoding is involved (the real engine is
tested end to end in test_serve.py).
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
import httpx  # noqa: E402

from specfold.params import SamplingParams  # noqa: E402
from specfold.serve.app import ServeConfig, create_app  # noqa: E402
from tests.serve_helpers import LiveServer  # noqa: E402


class FailingEngine:
    """`step` raises for the first `fail` calls, then finishes every request with one token."""

    def __init__(self, fail: int):
        self.fail, self.live = fail, []
        self.kv = SimpleNamespace(health=lambda: {"kv_blocks_total": 0, "kv_blocks_free": 0, "kv_cache_usage_perc": 0.0},
                                  preemptions=0, queries=0, hits=0)  # no KV pool: what /metrics and /health read

    def add_request(self, prompt_ids, params, request_id=None):
        assert isinstance(params, SamplingParams)
        self.live.append(request_id)
        return request_id

    def abort(self, request_id):
        self.live.remove(request_id)

    def has_unfinished(self):
        return bool(self.live)

    def step(self):
        if self.fail:
            self.fail -= 1
            raise RuntimeError("boom")
        done, self.live = self.live, []
        return [SimpleNamespace(request_id=r, new_token_ids=[5], text_delta="", finished=True,
                                finish_reason="length", output=None, new_logprobs=None) for r in done]


@pytest.fixture()
def server():
    llm = SimpleNamespace(tokenizer=None, spec=SimpleNamespace(vocab_size=100, max_position_embeddings=64))
    with LiveServer(create_app(llm, FailingEngine(fail=2), ServeConfig(model_name="m", max_tokens=4))) as s:
        yield s


def test_internal_error_is_a_500_and_the_server_keeps_serving(server):
    body = {"model": "m", "prompt": [1, 2, 3]}
    r = httpx.post(server.url + "/v1/completions", json=body)
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert "Traceback" not in r.text and "boom" not in r.text
    with httpx.stream("POST", server.url + "/v1/completions", json=dict(body, stream=True)) as s:
        assert s.status_code == 200
        events = [ln for ln in s.iter_lines() if ln]
    assert json.loads(events[0][6:])["error"]["code"] == "internal_error" and events[-1] == "data: [DONE]"
    ok = httpx.post(server.url + "/v1/completions", json=body)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 1
    h = httpx.get(server.url + "/health").json()
    assert h["status"] == "ok" and h["step_errors"] == 2 and h["running"] == 0


def test_text_prompt_without_tokenizer_is_a_400(server):
    r = httpx.post(server.url + "/v1/completions", json={"model": "m", "prompt": "hello"})
    assert r.status_code == 400 and "no tokenizer" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": "m", "messages": [
        {"role": "user", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
