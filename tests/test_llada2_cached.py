"""The decode on specfold's model with a prefix cache of whole blocks (tests/llada2_reference.py
`cached_decode`, the shape the engine's program must have) equals the cache-free reference decoder
token for token, and its denoising forwards are exactly the reference's."""
from __future__ import annotations

import pytest
import torch

from tests import llada2_checkpoint as C
from tests.llada2_reference import cached_decode, reference_decode

BLOCK = 8


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from specfold.models.loader import load_model
    folder, cfg, w = C.make(tmp_path_factory.mktemp("llada2c") / "ckpt", seed=0, head_scale=4.0, eos_boost=2.0)
    model, spec, _ = load_model(folder, torch.float64, "cpu", overrides=C.overrides(cfg))
    return cfg, w, model, spec


@pytest.mark.parametrize("rule, L, n, kw", [
    ("llada2", 13, 27, dict(steps=4, threshold=0.95)),
    ("llada2", 16, 20, dict(steps=3, threshold=0.9)),  # prompt of whole blocks: prefilled, fresh block
    ("llada2", 5, 30, dict(steps=12, threshold=0.8)),  # no prefill: the prompt is in the first window
    ("llada2_edit", 13, 27, dict(threshold=0.5, edit_threshold=0.0, max_post_steps=3)),
    ("llada2_edit", 16, 20, dict(threshold=0.7, edit_threshold=0.5, max_post_steps=16)),
    ("llada2_edit", 21, 11, dict(threshold=0.9, edit_threshold=0.3, max_post_steps=0)),
    ("llada2_edit", 13, 20, dict(threshold=0.7, edit_threshold=0.9, max_post_steps=4)),  # blocks settle
])
@pytest.mark.slow
def test_cached_decode_equals_the_cache_free_reference(ckpt, rule, L, n, kw):
    cfg, w, model, spec = ckpt
    M, eos = spec.mask_token_id, spec.stop_token_ids[0]
    prompt = torch.randint(0, cfg["vocab_size"] - 2, (L,), generator=torch.Generator().manual_seed(L)).tolist()
    ref, nfe = reference_decode(w, cfg, prompt, rule=rule, max_new_tokens=n, mask_id=M, eos_id=eos, block=BLOCK, **kw)
    ours, counts = cached_decode(model, prompt, rule=rule, max_new_tokens=n, mask_id=M, eos_id=eos, block=BLOCK, **kw)
    assert ours == ref
    assert counts["steps"] == nfe
    assert counts["prefill"] == (1 if L >= BLOCK else 0)
    if kw.get("edit_threshold") == 0.9:  # a post step that changed nothing gave the commit K/V
        assert counts["reused"] > 0
