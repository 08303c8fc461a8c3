"""LLaDA2 loading and forward (docs/LLADA2.md): specfold's native model against the cache-free
reference forward (tests/llada2_reference.py) in float64 on small random checkpoints with the
public key and weight names, with and without the prefix cache, one forward and packed ones."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from specfold.errors import CheckpointError, ConfigError
from specfold.models.cache import PrefixCache
from specfold.models.forward import Forward
from specfold.models.loader import load_model
from specfold.models.spec import resolve_spec
from tests import llada2_checkpoint as C
from tests.llada2_reference import reference_logits

TOL = 1e-10
BLOCK = 8
MARGIN = 1e-6  # routing decisions the comparisons rely on are this far from a tie (float64 noise ~1e-15)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    folder, cfg, w = C.make(tmp_path_factory.mktemp("llada2") / "ckpt", seed=0)
    model, spec, _ = load_model(folder, torch.float64, "cpu", overrides=C.overrides(cfg))
    return folder, cfg, w, model, spec


def _tokens(n: int, seed: int, vocab: int = 62) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _block_causal(pos: torch.Tensor, n: int = BLOCK) -> torch.Tensor:
    return (pos[:, None] // n) >= (pos[None, :] // n)


def test_spec_of_the_public_mini_config():
    cfg = C.config(num_hidden_layers=20, hidden_size=2048, intermediate_size=5120, num_attention_heads=16,
                   num_key_value_heads=4, head_dim=128, vocab_size=157184, num_experts=256,
                   num_experts_per_tok=8, n_group=8, topk_group=4, moe_intermediate_size=512,
                   num_shared_experts=1, first_k_dense_replace=1, max_position_embeddings=16384)
    s = resolve_spec(cfg)
    assert (s.family, s.weight_layout, s.rotary_dim, s.qk_norm, s.qkv_bias, s.tie_word_embeddings) == \
        ("llada2", "llada2", 64, True, False, False)
    assert (s.num_experts, s.experts_per_token, s.expert_groups, s.topk_groups, s.moe_intermediate_size,
            s.shared_experts, s.dense_layers, s.routed_scaling) == (256, 8, 8, 4, 512, 1, 1, 2.5)
    assert (s.mask_token_id, s.stop_token_ids, s.block_size, s.rope_theta) == (156895, (156892,), 32, 600000.0)
    assert (s.attention, s.alignment, s.full_last_block, s.rule, s.threshold, s.steps) == \
        ("block_causal", "absolute", True, "llada2", 0.95, 32)
    edit = resolve_spec(dict(cfg, model_type="llada21_moe"))
    assert (edit.rule, edit.threshold, edit.edit_threshold, edit.max_post_steps) == ("llada2_edit", 0.7, 0.5, 16)
    assert resolve_spec(cfg, {"rule": "llada2_edit"}).rule == "llada2_edit"


@pytest.mark.parametrize("key, value", [("score_function", "softmax"), ("use_bias", True),
                                        ("norm_head", True), ("n_group", 3)])
def test_unsupported_config_is_one_clear_error(key, value):
    cfg = C.config(**{key: value})
    with pytest.raises(ConfigError, match=key):
        resolve_spec(cfg, C.overrides(cfg))


def test_forward_matches_reference(ckpt):
    _, cfg, w, model, spec = ckpt
    assert spec.rotary_dim == 8 and [l.moe is not None for l in model.layers] == [False, True, True]
    for n, seed in ((21, 1), (24, 2), (5, 3)):
        toks = _tokens(n, seed)
        ref, margin = reference_logits(w, cfg, toks, BLOCK)
        assert margin > MARGIN
        pos = torch.arange(n)
        ours = model(torch.tensor([toks]), pos, mask=_block_causal(pos))[0]
        assert (ours - ref).abs().max().item() <= TOL


def test_prefix_cache_windows_and_packed_forwards(ckpt):
    """Whole blocks in the cache, the prompt's partial block plus masks as the window (several
    branches), equal to the cache-free forward of each branch's full sequence."""
    _, cfg, w, model, spec = ckpt
    M = spec.mask_token_id
    prompt = _tokens(19, 4)  # 2 whole blocks + 3 prompt positions in the third
    cache = model.new_cache(capacity=4)
    pos = torch.arange(16)
    model(torch.tensor([prompt[:16]]), pos, cache=cache, mask=_block_causal(pos), write_cache=True)
    branches = [prompt[16:] + [M] * 5, prompt[16:] + [7, M, 9, M, M], prompt[16:] + [3, 4, 5, 6, 8]]
    wpos = torch.arange(16, 24)
    win = model(torch.tensor(branches), wpos, cache=cache, mask=_block_causal(wpos))
    other = model.new_cache()
    p2 = _tokens(8, 5)
    model(torch.tensor([p2]), torch.arange(8), cache=other, mask=_block_causal(torch.arange(8)), write_cache=True)
    many = model.forward_many([Forward(torch.tensor(branches), wpos, cache, _block_causal(wpos)),
                               Forward(torch.tensor([[M] * 8]), torch.arange(8, 16), other,
                                       _block_causal(torch.arange(8, 16)))])
    for b, br in enumerate(branches):
        ref, margin = reference_logits(w, cfg, prompt[:16] + br, BLOCK)
        assert margin > MARGIN
        assert (win[b] - ref[16:]).abs().max().item() <= TOL
        assert (many[0].logits[b] - ref[16:]).abs().max().item() <= TOL
    ref2, _ = reference_logits(w, cfg, p2 + [M] * 8, BLOCK)
    assert (many[1].logits[0] - ref2[8:]).abs().max().item() <= TOL


def test_llm_loads_the_folder_natively(ckpt):
    from specfold import LLM
    folder, cfg, w, model, _ = ckpt
    llm = LLM(str(folder), dtype="float64", overrides=C.overrides(cfg))
    assert llm.spec.family == "llada2" and llm.spec.model_type == "llada2_moe"
    toks = _tokens(12, 6)
    pos = torch.arange(12)
    assert torch.equal(llm.model(torch.tensor([toks]), pos, mask=_block_causal(pos)),
                       model(torch.tensor([toks]), pos, mask=_block_causal(pos)))


def test_merged_expert_layout_loads_the_same_model(ckpt, tmp_path):
    """dFactory's merged layout (`llada2_moe_veomni`): stacked [E, ...] expert tensors."""
    folder, cfg, w, model, _ = ckpt
    merged = {k: v.float() for k, v in w.items() if ".experts." not in k}
    for i in range(cfg["first_k_dense_replace"], cfg["num_hidden_layers"]):
        for part in ("gate", "up", "down"):
            merged[f"model.layers.{i}.mlp.experts.{part}_proj"] = torch.stack(
                [w[f"model.layers.{i}.mlp.experts.{e}.{part}_proj.weight"].float() for e in range(cfg["num_experts"])])
    C.write(tmp_path / "merged", dict(cfg, model_type="llada2_moe_veomni"), merged)
    m2, _, _ = load_model(tmp_path / "merged", torch.float64, "cpu", overrides=C.overrides(cfg))
    toks, pos = _tokens(10, 7), torch.arange(10)
    assert torch.equal(m2(torch.tensor([toks]), pos, mask=_block_causal(pos)),
                       model(torch.tensor([toks]), pos, mask=_block_causal(pos)))


def test_checkpoint_errors_name_what_is_wrong(ckpt, tmp_path):
    folder, cfg, w, _, _ = ckpt
    short = {k: v.float() for k, v in w.items() if k != "model.layers.2.mlp.experts.5.up_proj.weight"}
    C.write(tmp_path / "short", cfg, short)
    with pytest.raises(CheckpointError, match=r"layers\.2\.moe\.w_up\[5\]"):
        load_model(tmp_path / "short", torch.float64, "cpu", overrides=C.overrides(cfg))
    bad = dict(short, **{"model.layers.2.mlp.experts.5.up_proj.weight": torch.zeros(3, 3),
                         "model.layers.0.attention.query_key_value.weight": torch.zeros(5, cfg["hidden_size"])})
    C.write(tmp_path / "bad", cfg, bad)
    with pytest.raises(CheckpointError, match="query_key_value|up_proj"):
        load_model(tmp_path / "bad", torch.float64, "cpu", overrides=C.overrides(cfg))


def test_checkpoint_without_expert_bias(tmp_path):
    """`moe_router_enable_expert_bias: false`: no bias tensors, selection on the plain scores."""
    cfg = C.config(moe_router_enable_expert_bias=False)
    w = C.random_weights(cfg, seed=1)
    w = {k: v for k, v in w.items() if not k.endswith("expert_bias")}
    C.write(tmp_path / "nobias", cfg, w)
    model, spec, _ = load_model(tmp_path / "nobias", torch.float64, "cpu", overrides=C.overrides(cfg))
    assert not spec.router_bias and model.layers[1].moe.expert_bias is None
    ref_w = {k: v.double() for k, v in w.items()}
    for i in range(cfg["first_k_dense_replace"], cfg["num_hidden_layers"]):
        ref_w[f"model.layers.{i}.mlp.gate.expert_bias"] = torch.zeros(cfg["num_experts"], dtype=torch.float64)
    toks, pos = _tokens(17, 8), torch.arange(17)
    ref, margin = reference_logits(ref_w, cfg, toks, BLOCK)
    assert margin > MARGIN
    assert (model(torch.tensor([toks]), pos, mask=_block_causal(pos))[0] - ref).abs().max().item() <= TOL
