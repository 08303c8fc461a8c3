"""LLaDA2.0 / 2.1 checkpoints (Ling-2.0 MoE layout): config fields and weight names (docs/LLADA2.md).

`config_fields(config, head_dim)` reads the MoE, q/k norm and partial-RoPE keys of a `llada2_moe`
config.json; `tensors(name, t, spec)` maps one checkpoint tensor onto specfold's canonical names.

Invariants:
- the fused `attention.query_key_value` [(H + 2 Hkv) D, d] is split into q_proj, k_proj, v_proj (its
  rows are q heads, then k heads, then v heads: the official code views it as [H + 2 Hkv, D]);
- partial RoPE: the official code rotates the first `rotary_dim` dims of each head with the
  rotate-half pairing (i, i + rotary_dim/2) and passes the rest through. specfold's RoPE pairs
  (i, i + D/2) over the whole head, so q and k (projection rows and q/k norm weights) are stored with
  their head dims permuted by `rope.partial_rotary_perm`, which maps those pairs onto each other;
  the pass-through dims get frequency 0 (cos 1, sin 0). Scores q.k are invariant under one
  permutation of both, and v is untouched, so every forward computes the checkpoint's function;
- a per-expert tensor maps to a slot `name[e]` of a stacked [E, ...] parameter (the loader fills
  the slots); dFactory's merged layout (`llada2_moe_veomni`) already stores them stacked.
The spec table imports this module; torch (through models/rope.py) is imported only by `tensors`.
"""
from __future__ import annotations

import re
from typing import Any

from specfold.errors import ConfigError

# config keys -> defaults of the official configuration class, where a public config may omit them
_MOE_KEYS = (("num_experts_per_tok", "experts_per_token", None), ("n_group", "expert_groups", 8),
             ("topk_group", "topk_groups", 4), ("moe_intermediate_size", "moe_intermediate_size", None),
             ("num_shared_experts", "shared_experts", 0), ("first_k_dense_replace", "dense_layers", 0),
             ("routed_scaling_factor", "routed_scaling", 2.5))


def config_fields(cfg: dict, head_dim: int) -> dict[str, Any]:
    """ModelSpec fields beyond the HF shape keys (which a LLaDA2 config shares with Llama/Qwen)."""
    for key, bad, why in (("score_function", lambda v: v not in (None, "sigmoid"), "only sigmoid routing"),
                          ("use_bias", lambda v: bool(v), "no biases besides q/k/v"),
                          ("norm_head", lambda v: bool(v), "an unnormalised lm_head"),
                          ("hidden_act", lambda v: v not in (None, "silu"), "silu")):
        if bad(cfg.get(key)):
            raise ConfigError(f"config.json has {key}={cfg[key]!r}; specfold supports {why} for model_type "
                              f"{cfg.get('model_type')!r}")
    factor = cfg.get("partial_rotary_factor", 0.5)
    rotary = int(head_dim * factor) if factor is not None else int(cfg.get("rotary_dim") or head_dim)
    out: dict[str, Any] = dict(qkv_bias=bool(cfg.get("use_qkv_bias", False)),
                               qk_norm=bool(cfg.get("use_qk_norm", True)),
                               rotary_dim=None if rotary == head_dim else rotary)
    if not cfg.get("num_experts"):
        return out
    out["num_experts"] = int(cfg["num_experts"])
    for key, field, default in _MOE_KEYS:
        value = cfg.get(key, default)
        if value is None:
            raise ConfigError(f"config.json lacks the field {key!r} needed for a MoE model_type "
                              f"{cfg.get('model_type')!r}")
        out[field] = float(value) if field == "routed_scaling" else int(value)
    out["router_bias"] = bool(cfg.get("moe_router_enable_expert_bias", True))
    return out


_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
_DIRECT = {  # suffix inside a layer -> canonical suffix
    "input_layernorm.weight": "input_norm.weight", "post_attention_layernorm.weight": "post_norm.weight",
    "attention.dense.weight": "o_proj.weight",
    "mlp.gate_proj.weight": "gate_proj.weight", "mlp.up_proj.weight": "up_proj.weight",
    "mlp.down_proj.weight": "down_proj.weight",
    "mlp.gate.weight": "moe.router", "mlp.gate.expert_bias": "moe.expert_bias",
    "mlp.experts.gate_proj": "moe.w_gate", "mlp.experts.up_proj": "moe.w_up",
    "mlp.experts.down_proj": "moe.w_down",
    "mlp.shared_experts.gate_proj.weight": "moe.shared.gate_proj.weight",
    "mlp.shared_experts.up_proj.weight": "moe.shared.up_proj.weight",
    "mlp.shared_experts.down_proj.weight": "moe.shared.down_proj.weight",
}
_EXPERT = re.compile(r"mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight")
_TOP = {"model.word_embeddings.weight": "embed.weight", "model.norm.weight": "norm.weight",
        "lm_head.weight": "lm_head.weight"}


def reads_whole(name: str) -> bool:
    """Whether `tensors` needs checkpoint tensor `name` whole (the fused q/k/v and the q/k norms are
    split or permuted); every other tensor maps by its name alone (`tensors(name, None, spec)`)."""
    return bool(re.fullmatch(r"model\.layers\.\d+\.attention\.(query_key_value\.(weight|bias)|"
                             r"(query|key)_layernorm\.weight)", name))


def tensors(name: str, t, spec) -> list[tuple[str, Any]]:
    """Checkpoint tensor -> [(canonical name, tensor)] ([] = not a model weight). A name ending in
    `[e]` is slot e of a stacked expert parameter."""
    if name in _TOP:
        return [(_TOP[name], t)]
    m = _LAYER.fullmatch(name)
    if not m:
        return []
    i, rest = m.group(1), m.group(2)
    if rest in _DIRECT:
        return [(f"layers.{i}.{_DIRECT[rest]}", t)]
    e = _EXPERT.fullmatch(rest)
    if e:
        return [(f"layers.{i}.moe.w_{e.group(2)}[{e.group(1)}]", t)]
    norm = {"attention.query_layernorm.weight": "q_norm", "attention.key_layernorm.weight": "k_norm"}
    if rest in norm:
        return [(f"layers.{i}.{norm[rest]}.weight", t[_perm(spec)])]
    fused = re.fullmatch(r"attention\.query_key_value\.(weight|bias)", rest)
    if fused:
        return [(f"layers.{i}.{part}.{fused.group(1)}", piece) for part, piece in _split_qkv(t, spec)]
    return []


def _perm(spec) -> list[int]:
    from specfold.models.rope import partial_rotary_perm
    return partial_rotary_perm(spec.head_dim, spec.rotary_dim or spec.head_dim)


def _split_qkv(t, spec):
    """Fused [(H + 2 Hkv) D, ...] -> q [H D, ...], k, v [Hkv D, ...]; q and k head dims permuted."""
    D, H, Hkv = spec.head_dim, spec.num_heads, spec.num_kv_heads
    if t.shape[0] != (H + 2 * Hkv) * D:
        from specfold.errors import CheckpointError
        raise CheckpointError(f"query_key_value has {t.shape[0]} rows; config.json implies "
                              f"(heads {H} + 2 x kv heads {Hkv}) x head_dim {D} = {(H + 2 * Hkv) * D}")
    q, k, v = t.split([H * D, Hkv * D, Hkv * D], dim=0)
    perm = _perm(spec)

    def permute(x, heads):
        return x.reshape(heads, D, *x.shape[1:])[:, perm].reshape(x.shape).contiguous()
    return [("q_proj", permute(q, H)), ("k_proj", permute(k, Hkv)), ("v_proj", v.contiguous())]
