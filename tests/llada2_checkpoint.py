"""Small random LLaDA2-shaped checkpoint folders: config.json with the public config's key names
(configs/model_configs/llada2_mini/config.json of inclusionAI/dFactory, tiny values) and
model.safetensors with the public weight names (`model.word_embeddings`, `layers.N.attention.*`,
`layers.N.mlp.{gate, experts.E.*, shared_experts}`, `model.norm`, `lm_head`).

The mask and eos ids of the real vocabulary do not fit a tiny one, so `overrides(cfg)` gives the
ids the tests load with (config.json keeps the public keys only).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

TINY = dict(num_hidden_layers=3, hidden_size=32, intermediate_size=48, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=64, num_experts=8, num_experts_per_tok=2,
            n_group=2, topk_group=1, moe_intermediate_size=16, num_shared_experts=1,
            first_k_dense_replace=1)


def config(**kw) -> dict:
    c = {"architectures": ["LLaDA2MoeModelLM"], "model_type": "llada2_moe", "hidden_act": "silu",
         "max_position_embeddings": 512, "norm_topk_prob": True, "norm_head": False,
         "rope_theta": 600000, "rope_scaling": None, "tie_word_embeddings": False, "torch_dtype": "float32",
         "use_bias": False, "use_rmsnorm": True, "rms_norm_eps": 1e-06, "use_qkv_bias": False,
         "rotary_dim": 8, "router_dtype": "fp32", "moe_router_enable_expert_bias": True,
         "routed_scaling_factor": 2.5, "score_function": "sigmoid", "partial_rotary_factor": 0.5,
         "pad_token_id": 1, "use_cache": False}
    c.update(TINY)
    c.update(kw)
    c["rotary_dim"] = int(c["head_dim"] * c["partial_rotary_factor"])
    return c


def overrides(cfg: dict) -> dict:
    """Mask = the last id, eos = the one before it (the real ids are past a tiny vocabulary)."""
    v = cfg["vocab_size"]
    return {"mask_token_id": v - 1, "stop_token_ids": [v - 2]}


def random_weights(cfg: dict, seed: int = 0, head_scale: float = 3.0, eos_boost: float = 0.0) -> dict:
    """Weights under the public names. `head_scale` sharpens the output distributions so thresholds
    are crossed; `eos_boost` adds to the eos row of lm_head along the mean embedding direction so
    that eos appears inside blocks."""
    g = torch.Generator().manual_seed(seed)
    d, V, D = cfg["hidden_size"], cfg["vocab_size"], cfg["head_dim"]
    H, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    E, I = cfg["num_experts"], cfg["moe_intermediate_size"]

    def lin(o, i):
        return torch.randn(o, i, generator=g) / i ** 0.5

    def norm(n):
        return 1.0 + 0.2 * torch.randn(n, generator=g)

    w = {"model.word_embeddings.weight": torch.randn(V, d, generator=g), "model.norm.weight": norm(d),
         "lm_head.weight": head_scale * lin(V, d)}
    if eos_boost:
        w["lm_head.weight"][V - 2] += eos_boost * w["model.word_embeddings.weight"].mean(0)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(d)
        w[p + "post_attention_layernorm.weight"] = norm(d)
        w[p + "attention.query_key_value.weight"] = lin((H + 2 * Hkv) * D, d)
        w[p + "attention.query_layernorm.weight"] = norm(D)
        w[p + "attention.key_layernorm.weight"] = norm(D)
        w[p + "attention.dense.weight"] = lin(d, H * D)
        if i < cfg["first_k_dense_replace"]:
            for n, (o, k) in {"gate_proj": (cfg["intermediate_size"], d), "up_proj": (cfg["intermediate_size"], d),
                              "down_proj": (d, cfg["intermediate_size"])}.items():
                w[p + f"mlp.{n}.weight"] = lin(o, k)
            continue
        w[p + "mlp.gate.weight"] = lin(E, d)
        w[p + "mlp.gate.expert_bias"] = 0.1 * torch.randn(E, generator=g)
        for e in range(E):
            w[p + f"mlp.experts.{e}.gate_proj.weight"] = lin(I, d)
            w[p + f"mlp.experts.{e}.up_proj.weight"] = lin(I, d)
            w[p + f"mlp.experts.{e}.down_proj.weight"] = lin(d, I)
        Is = I * cfg["num_shared_experts"]
        w[p + "mlp.shared_experts.gate_proj.weight"] = lin(Is, d)
        w[p + "mlp.shared_experts.up_proj.weight"] = lin(Is, d)
        w[p + "mlp.shared_experts.down_proj.weight"] = lin(d, Is)
    return w


def write(folder: Path, cfg: dict, weights: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"))
    return folder


def make(folder: Path, seed: int = 0, head_scale: float = 3.0, eos_boost: float = 0.0, **kw):
    """Write a random checkpoint; returns (folder, config dict, float64 weights by public name)."""
    cfg = config(**kw)
    w = random_weights(cfg, seed, head_scale, eos_boost)
    write(folder, cfg, w)
    return folder, cfg, {k: v.double() for k, v in w.items()}
