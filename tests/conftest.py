"""Shared fixtures: small random checkpoints written through `save_pretrained` (the real loading path)."""
from __future__ import annotations

import os
import sys

import pytest
import torch

torch.set_num_threads(int(os.environ.get("SPECFOLD_TEST_THREADS", "1")))


@pytest.fixture(autouse=True, scope="session")
def _cache_dir(tmp_path_factory):
    """The engine's cost model cache (auto draft budgets) goes to a temporary folder, never ~/.cache."""
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg_cache"))
    yield
    if old is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old


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


# `slow` marks for tests in files that issue 42's draft-budget rewrite is changing right now (the
# frozen copy in test_budget_fastpath.py is to go): kept here until it lands, then moved into the files.
_SLOW_ELSEWHERE = {
    "tests/test_budget.py::test_auto_is_exact_at_temperature_and_on_the_tiny_model",
    "tests/test_budget.py::test_auto_budgets_never_change_tokens",
    "tests/test_budget.py::test_calibration_is_cached_and_keyed",
    "tests/test_budget.py::test_best_closure_against_brute_force",
}
_SLOW_FILES_ELSEWHERE = ("tests/test_budget_fastpath.py",)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.split("[")[0] in _SLOW_ELSEWHERE or item.nodeid.startswith(_SLOW_FILES_ELSEWHERE):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After the last test of the Ray modules in a row (once their fixtures are torn down), stop the
    test cluster of tests/ray_helpers.py: the rest of the suite runs without its processes."""
    yield
    helpers = sys.modules.get("tests.ray_helpers")
    if helpers is not None and (nextitem is None or not hasattr(nextitem.module, "ray_cluster")):
        helpers.shutdown()
