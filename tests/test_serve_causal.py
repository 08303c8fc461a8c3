"""The server decodes with Nemotron-Labs-Diffusion's causal methods like with any other: a server
started with `ar` or `linear_spec` (engine flags, fixed at start) answers token-id completions with
what `LLM.generate` returns for that method (token count, finish reason) (random NLD-layout checkpoint, float64)."""
from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
import httpx  # noqa: E402

from specfold import LLM, DecodeParams  # noqa: E402
from specfold.serve.app import ServeConfig, create_app  # noqa: E402
from tests.causal_helpers import nld_checkpoint  # noqa: E402
from tests.serve_helpers import LiveServer  # noqa: E402

PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13], [30, 31]]


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = nld_checkpoint(tmp_path_factory.mktemp("nld"), focus=2.0, mask_like=15, mask_mix=0.7, layer_scale=0.6)
    return LLM(path, dtype="float64", overrides={"stop_token_ids": [94]})


@pytest.mark.parametrize("method, extra", [("ar", {}), ("linear_spec", {"threshold": 0.0})])
def test_server_with_a_causal_method_returns_the_library_tokens(llm, method, extra):
    params = DecodeParams(method=method, max_new_tokens=11, **extra)
    want = llm.generate(PROMPTS, params)
    config, _ = params.split()
    engine = llm.engine(config)
    with LiveServer(create_app(llm, engine, ServeConfig(model_name="nld", max_tokens=11))) as s:
        for prompt, out in zip(PROMPTS, want):
            r = httpx.post(s.url + "/v1/completions", json={"model": "nld", "prompt": prompt, "max_tokens": 11},
                           timeout=120)
            assert r.status_code == 200, r.text
            body = r.json()
            # the checkpoint has no tokenizer (empty text): the token count and the finish reason are
            # what the response can be compared on
            assert body["usage"]["completion_tokens"] == len(out.token_ids)
            assert body["choices"][0]["finish_reason"] == out.finish_reason
    assert engine.config.method == method
