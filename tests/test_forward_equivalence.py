"""specfold's native forward equals `transformers` under the same 4D mask (SPEC §2-3)."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from specfold.models.loader import load_model
from tests.hf_reference import float64_reference, hf_logits, make_hf_model, save_hf

DIFFUSION = {"mask_token_id": 95, "block_size": 4}
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def block_causal(T: int, n: int) -> torch.Tensor:
    pos = torch.arange(T)
    return (pos[:, None] // n) >= (pos[None, :] // n)


def masks(T: int):
    return {"bidirectional": torch.ones(T, T, dtype=torch.bool), "block_causal": block_causal(T, 4)}


def _check(folder, hf, dtype, layout_overrides=None):
    model, spec, _ = load_model(folder, dtype, "cpu", overrides=layout_overrides)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 95, (1, 11), generator=g)
    for name, allowed in masks(11).items():
        with float64_reference():
            ref = hf_logits(hf, ids, allowed, dtype)
        ours = model(ids, torch.arange(11), mask=allowed)
        err = (ours - ref).abs().max().item()
        assert err <= TOL[dtype], (name, err)
    # same logits through the prefix cache: prefill 8 block-causal positions, then the last window
    allowed = block_causal(11, 4)
    with float64_reference():
        ref = hf_logits(hf, ids, allowed, dtype)
    cache = model.new_cache(capacity=4)  # forces the cache to grow
    model(ids[:, :8], torch.arange(8), cache=cache, mask=allowed[:8, :8], write_cache=True)
    assert cache.length == 8
    win = model(ids[:, 8:].repeat(3, 1), torch.arange(8, 11), cache=cache, mask=allowed[8:, 8:])
    assert (win - ref[:, 8:]).abs().max().item() <= TOL[dtype]
    only = model(ids[:, 8:], torch.arange(8, 11), cache=cache, mask=allowed[8:, 8:],
                 logits_at=torch.tensor([2, 0]))
    assert (only[0] - win[0, [2, 0]]).abs().max().item() <= TOL[dtype]
    return spec


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama", "ministral3"])
def test_matches_transformers(tmp_path, kind, dtype):
    hf = make_hf_model(kind)
    folder = save_hf(hf, tmp_path / kind, DIFFUSION)
    spec = _check(folder, hf, dtype)
    assert spec.qk_norm == (kind == "qwen3")
    assert spec.qkv_bias == (kind == "qwen2")


def _rename_and_save(hf, folder, mapping, config):
    import json
    folder.mkdir()
    sd = {mapping(k): v.contiguous() for k, v in hf.state_dict().items() if mapping(k)}
    save_file(sd, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_llada_olmo_names(tmp_path, dtype):
    hf = make_hf_model("llama")
    c = hf.config
    olmo = {"self_attn.q_proj": "q_proj", "self_attn.k_proj": "k_proj", "self_attn.v_proj": "v_proj",
            "self_attn.o_proj": "attn_out", "mlp.gate_proj": "ff_proj", "mlp.up_proj": "up_proj",
            "mlp.down_proj": "ff_out", "input_layernorm": "attn_norm", "post_attention_layernorm": "ff_norm"}

    def mapping(k):
        if k == "model.embed_tokens.weight":
            return "model.transformer.wte.weight"
        if k == "model.norm.weight":
            return "model.transformer.ln_f.weight"
        if k == "lm_head.weight":
            return "model.transformer.ff_out.weight"
        parts = k.split(".")
        if parts[1] == "layers":
            return f"model.transformer.blocks.{parts[2]}.{olmo['.'.join(parts[3:-1])]}.{parts[-1]}"
        return None

    config = {"model_type": "llada", "d_model": c.hidden_size, "n_heads": c.num_attention_heads,
              "n_kv_heads": c.num_key_value_heads, "n_layers": c.num_hidden_layers,
              "mlp_hidden_size": c.intermediate_size, "vocab_size": c.vocab_size, "embedding_size": c.vocab_size,
              "rms_norm_eps": c.rms_norm_eps, "rope_theta": 10000.0, "max_sequence_length": 512,
              "weight_tying": False, "mask_token_id": 95}
    _rename_and_save(hf, tmp_path / "llada", mapping, config)
    spec = _check(tmp_path / "llada", hf, dtype)
    assert spec.family == "llada" and spec.attention == "bidirectional"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_nemotron_encoder_names(tmp_path, dtype):
    hf = make_hf_model("ministral3")
    c = hf.config

    def mapping(k):
        if k == "lm_head.weight":
            return "diffusion_head.weight"
        return "encoder." + k[len("model."):] if k.startswith("model.") else None

    config = c.to_dict()
    config.update(model_type="nemotron_labs_diffusion", mask_token_id=95)
    _rename_and_save(hf, tmp_path / "nld", mapping, config)
    spec = _check(tmp_path / "nld", hf, dtype)
    assert spec.attention == "causal_prefix" and spec.alignment == "after_prompt" and spec.threshold_ge
