"""Shared fixtures: small random checkpoints written through `save_pretrained` (the real loading path)."""
from __future__ import annotations

import os
import sys

import pytest
import torch

torch.set_num_threads(int(os.environ.get("SPECFOLD_TEST_THREADS", "1")))


@pytest.fixture(scope="session")
def tiny_llm():
    """The shipped tiny model, `LLM("tiny")` in float32, loaded once for the session: for tests that
    decode with it or read its model, tokenizer and config. A test that changes the LLM it holds
    (overrides, patched model or methods, a closed LLM) builds its own."""
    from specfold import LLM
    return LLM("tiny", dtype="float32")


@pytest.fixture(scope="session")
def tiny_llm64():
    """`LLM("tiny", dtype="float64")` loaded once for the session (exactness checks); shared read-only,
    as `tiny_llm`."""
    from specfold import LLM
    return LLM("tiny", dtype="float64")


@pytest.fixture(scope="session")
def vanilla_refs(tiny_llm, tiny_llm64):
    """`vanilla_refs(llm, prompts, params) -> tuple[Ref, ...]`: vanilla's decodes of `prompts` (a list)
    on a session LLM (`tiny_llm` or `tiny_llm64`, the only ones shared for the session), decoded once
    per (model, prompts, params) and frozen (tests/vanilla_refs.py): the reference that tests which
    compare a lossless method or the server with the library share instead of decoding it again."""
    from specfold import DecodeParams
    from tests.vanilla_refs import freeze

    made: dict = {}

    def get(llm, prompts, params):
        if llm is not tiny_llm and llm is not tiny_llm64:
            raise ValueError("vanilla_refs decodes on the session LLMs only (tiny_llm, tiny_llm64)")
        method = params.method if isinstance(params, DecodeParams) else llm.engine_config.method
        if method != "vanilla":
            raise ValueError(f"vanilla_refs decodes with vanilla only, not {method!r}")
        key = (llm is tiny_llm64, tuple(p if isinstance(p, str) else tuple(p) for p in prompts), repr(params))
        if key not in made:
            made[key] = freeze(llm.generate(list(prompts), params))
        return made[key]

    return get


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """`checkpoint(kind="qwen2", peaked=0.0, **diffusion_config) -> folder`; cached per argument set.

    `peaked` > 0 scales the head so confidences are high (drafts and thresholds then actually fire)."""
    from tests.hf_reference import make_hf_model, save_hf

    made: dict = {}

    def make(kind: str = "qwen2", peaked: float = 0.0, seed: int = 0, **diffusion):
        key = (kind, peaked, seed, tuple(sorted((k, str(v)) for k, v in diffusion.items())))
        if key not in made:
            hf = make_hf_model(kind, seed=seed)
            if peaked:
                with torch.no_grad():
                    hf.lm_head.weight.mul_(peaked)
            cfg = {"mask_token_id": 95, "block_size": 4, "stop_token_ids": [94]}
            cfg.update(diffusion)
            made[key] = save_hf(hf, tmp_path_factory.mktemp(kind), cfg)
        return made[key]

    return make


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After the last test of the Ray modules in a row (once their fixtures are torn down), stop the
    test cluster of tests/ray_helpers.py: the rest of the suite runs without its processes."""
    yield
    helpers = sys.modules.get("tests.ray_helpers")
    if helpers is not None and (nextitem is None or not hasattr(nextitem.module, "ray_cluster")):
        helpers.shutdown()
