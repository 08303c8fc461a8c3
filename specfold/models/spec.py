"""Model families as data: one table, one `ModelSpec`, no class per checkpoint.

`resolve_spec(config, overrides, tokenizer_vocab)` turns a HuggingFace `config.json` (a dict) into a
`ModelSpec`: the transformer's dimensions and layout, plus everything decoding needs (mask id, stop
ids, logits shift, attention kind, block alignment, seed token, default decode settings).

Invariants:
- the mask id is never guessed: overrides > config `mask_token_id` > the family's mask token looked up
  in the tokenizer vocabulary (or the family table's id, LLaDA2's published 156895: its configs carry
  none) > ConfigError;
- stop ids: overrides > config `stop_token_ids` (specfold's own key) > the checkpoint's eos
  (generation_config.json, then config.json, read as transformers reads them) plus the family's
  end-of-turn token (`eot_token`, looked up in the tokenizer vocabulary); the table's `stop_token_ids`
  stand in for the eos only when the checkpoint names none;
- `overrides` may set any ModelSpec field (like vLLM's `hf_overrides`); unknown names are rejected;
- a `model_type` not in the table is rejected with the list of supported ones.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from specfold.errors import ConfigError

ATTENTION_KINDS = ("block_causal", "bidirectional", "causal_prefix")
ALIGNMENTS = ("absolute", "after_prompt")
WEIGHT_LAYOUTS = ("hf", "olmo", "nemotron", "llada2")


@dataclass(slots=True)
class ModelSpec:
    family: str
    model_type: str
    # transformer shape
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # HF rope_parameters / rope_scaling dict, or None for default
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    weight_layout: str = "hf"
    # diffusion decoding
    mask_token_id: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    logits_shift: bool = False
    attention: str = "block_causal"
    alignment: str = "absolute"
    seed_token: bool = False
    block_size: int = 32
    sub_block_size: int | None = None
    rule: str = "threshold"
    threshold: float = 0.9
    threshold_ge: bool = False
    tokens_per_step: int = 1
    confidence: str = "max_prob"
    max_new_tokens_multiple_of_block: bool = False
    # LLaDA2 decoding (decoding/rules_llada2.py): schedule steps per block (0: the block size), the
    # edit rule's tau_edit and post-fill step limit, and whether the last block is decoded in full
    # past prompt + max_new_tokens (its extra positions count for the rule; the output is cut after)
    steps: int = 0
    edit_threshold: float = 0.0
    max_post_steps: int = 0
    full_last_block: bool = False
    # partial RoPE: rotate only the first `rotary_dim` dims of each head (None: all of them)
    rotary_dim: int | None = None
    # mixture of experts (models/moe.py); num_experts == 0: a dense FFN in every layer
    num_experts: int = 0
    experts_per_token: int = 0
    expert_groups: int = 1
    topk_groups: int = 1
    moe_intermediate_size: int = 0
    shared_experts: int = 0
    dense_layers: int = 0  # the first `dense_layers` layers keep the dense FFN
    routed_scaling: float = 1.0
    router_bias: bool = True  # checkpoints carry a per-expert selection bias
    # "sigmoid": LLaDA2's biased, group-limited routing; "softmax": Qwen3-MoE's (SDAR-MoE), top-k of
    # softmax(router logits), renormalised over the k only when `norm_topk_prob` (models/moe.py)
    router_scoring: str = "sigmoid"
    norm_topk_prob: bool = True
    # Qwen3-MoE's layer rule: layer i is MoE iff i is past `dense_layers`, not in `mlp_only_layers`
    # and (i + 1) % decoder_sparse_step == 0
    mlp_only_layers: tuple[int, ...] = ()
    decoder_sparse_step: int = 1
    extra: dict = field(default_factory=dict)

    @property
    def uses_cache(self) -> bool:
        return self.attention != "bidirectional"

    def is_moe_layer(self, index: int) -> bool:
        return (self.num_experts > 0 and index >= self.dense_layers and index not in self.mlp_only_layers
                and (index + 1) % self.decoder_sparse_step == 0)


# Family table: model_type -> (family name, layout defaults, decoding defaults).
# Decoding defaults follow each family's published inference settings (SPEC §2).
_QWEN2 = dict(qkv_bias=True, qk_norm=False)
_QWEN3 = dict(qkv_bias=False, qk_norm=True)
_LLAMA = dict(qkv_bias=False, qk_norm=False)
# Qwen3-MoE (SDAR-MoE): Qwen3 attention, softmax routing, no groups, bias or shared expert; the MoE
# keys of config.json are read by `_qwen3_moe_fields`
_QWEN3_MOE = dict(**_QWEN3, router_scoring="softmax", router_bias=False)
_LLADA2 = dict(weight_layout="llada2", mask_token_id=156895, stop_token_ids=(156892,),
               logits_shift=False, attention="block_causal", alignment="absolute", seed_token=False,
               block_size=32, full_last_block=True)

FAMILIES: dict[str, dict[str, Any]] = {
    "Fast_dLLM_Qwen": dict(
        family="fast_dllm_v2", **_QWEN2, mask_token="|<MASK>|", stop_token_ids=(151645,), eot_token="<|im_end|>",
        logits_shift=True, attention="block_causal", alignment="absolute", seed_token=True,
        block_size=32, sub_block_size=8, rule="sub_block", threshold=0.9),
    "sdar": dict(
        family="sdar", **_QWEN3, stop_token_ids=(151645, 151643), eot_token="<|im_end|>", logits_shift=False,
        attention="block_causal", alignment="absolute", seed_token=False, block_size=4,
        rule="static", tokens_per_step=1),
    # SDAR-30B-A3B (Chat, Sci, Chat-b8): SDAR's decoding on a Qwen3-MoE body (SGLang's sdar_moe.py);
    # the mask id is SDAR's 151669 unless config.json names one
    "sdar_moe": dict(
        family="sdar_moe", **_QWEN3_MOE, mask_token_id=151669, stop_token_ids=(151645, 151643),
        eot_token="<|im_end|>", logits_shift=False, attention="block_causal", alignment="absolute",
        seed_token=False, block_size=4, rule="static", tokens_per_step=1),
    "Dream": dict(
        family="dream", **_QWEN2, stop_token_ids=(151643,), eot_token="<|im_end|>", logits_shift=True,
        attention="bidirectional", block_size=32, rule="dream", confidence="neg_entropy"),
    "llada": dict(
        family="llada", **_LLAMA, weight_layout="olmo", stop_token_ids=(126081, 126348), eot_token="<|eot_id|>",
        logits_shift=False, attention="bidirectional", block_size=32, rule="llada"),
    "nemotron_labs_diffusion": dict(
        family="nemotron_labs_diffusion", **_LLAMA, weight_layout="nemotron", stop_token_ids=(11,),
        eot_token="<|im_end|>",
        logits_shift=False, attention="causal_prefix", alignment="after_prompt", seed_token=True,
        block_size=32, rule="threshold", threshold=0.9, threshold_ge=True,
        max_new_tokens_multiple_of_block=True),
    # LLaDA2.0 / 2.1 (Ling-2.0 MoE layout, docs/LLADA2.md): block-causal from position 0, so the
    # prompt's last partial block is part of the first active block (SPEC §3)
    # (edit_threshold / max_post_steps: 2.1's, for a checkpoint of this model_type run with rule llada2_edit)
    "llada2_moe": dict(family="llada2", **_LLADA2, rule="llada2", threshold=0.95, steps=32,
                       edit_threshold=0.5, max_post_steps=16),
    "llada2_moe_veomni": dict(family="llada2", **_LLADA2, rule="llada2", threshold=0.95, steps=32,
                              edit_threshold=0.5, max_post_steps=16),
    "llada21_moe": dict(family="llada2", **_LLADA2, rule="llada2_edit", threshold=0.7,
                        edit_threshold=0.5, max_post_steps=16),
    "qwen2": dict(family="qwen2", **_QWEN2),
    "qwen3": dict(family="qwen3", **_QWEN3),
    "qwen3_moe": dict(family="qwen3_moe", **_QWEN3_MOE),
    "llama": dict(family="llama", **_LLAMA),
    "ministral3": dict(family="ministral3", **_LLAMA),
}
# Plain base layouts carry no diffusion defaults: the diffusion fields must come from config.json
# (mask_token_id, block_size, ...) or from `overrides`.
_PLAIN = {"qwen2", "qwen3", "qwen3_moe", "llama", "ministral3"}

_SPEC_FIELDS = {f.name for f in dataclasses.fields(ModelSpec)}
_DIFFUSION_CONFIG_KEYS = ("block_size", "sub_block_size", "logits_shift", "attention", "alignment",
                          "seed_token", "threshold", "rule", "stop_token_ids")


def supported_model_types() -> list[str]:
    return sorted(FAMILIES)


def _get(cfg: dict, *names: str, default: Any = None) -> Any:
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    return default


def _shape_fields(cfg: dict, layout: str) -> dict[str, Any]:
    """Transformer dimensions from an HF config (Llama/Qwen names) or an OLMo-style config (LLaDA)."""
    try:
        if layout == "olmo":
            d, heads = cfg["d_model"], cfg["n_heads"]
            shape = dict(
                hidden_size=d, num_layers=cfg["n_layers"], num_heads=heads,
                num_kv_heads=_get(cfg, "n_kv_heads", default=heads),
                head_dim=_get(cfg, "head_dim", default=d // heads),
                intermediate_size=cfg["mlp_hidden_size"],
                vocab_size=_get(cfg, "embedding_size", "vocab_size"),
                rms_eps=_get(cfg, "rms_norm_eps", default=1e-5),
                rope_theta=_get(cfg, "rope_theta", default=10000.0),
                max_position_embeddings=_get(cfg, "max_sequence_length", default=4096),
                tie_word_embeddings=bool(_get(cfg, "weight_tying", default=False)),
                qkv_bias=bool(_get(cfg, "include_bias", "include_qkv_bias", default=False)),
            )
        else:
            d, heads = cfg["hidden_size"], cfg["num_attention_heads"]
            shape = dict(
                hidden_size=d, num_layers=cfg["num_hidden_layers"], num_heads=heads,
                num_kv_heads=_get(cfg, "num_key_value_heads", default=heads),
                head_dim=_get(cfg, "head_dim", default=d // heads),
                intermediate_size=cfg["intermediate_size"], vocab_size=cfg["vocab_size"],
                rms_eps=_get(cfg, "rms_norm_eps", default=1e-6),
                max_position_embeddings=_get(cfg, "max_position_embeddings", default=32768),
                tie_word_embeddings=bool(_get(cfg, "tie_word_embeddings", default=False)),
            )
            rope = _get(cfg, "rope_parameters", "rope_scaling")
            theta = _get(cfg, "rope_theta", default=None)
            if isinstance(rope, dict):
                theta = rope.get("rope_theta", theta)
                kind = rope.get("rope_type", rope.get("type", "default"))
                shape["rope_scaling"] = None if kind == "default" else dict(rope)
            shape["rope_theta"] = float(theta if theta is not None else 10000.0)
            if "attention_bias" in cfg:
                shape["qkv_bias"] = bool(cfg["attention_bias"])
    except KeyError as e:
        raise ConfigError(f"config.json lacks the field {e.args[0]!r} needed for model_type "
                          f"{cfg.get('model_type')!r}") from None
    return shape


def _qwen3_moe_fields(cfg: dict) -> dict[str, Any]:
    """The MoE fields of a Qwen3-MoE config.json (`sdar_moe`, `qwen3_moe`), with the defaults of
    transformers' Qwen3MoeConfig where a key is absent; ConfigError (one line) on a wrong type."""
    where = f"config.json of model_type {cfg.get('model_type')!r}"

    def integer(key: str, default: Any, low: int) -> int:
        value = cfg.get(key, default)
        if value is None:
            raise ConfigError(f"{where} lacks the field {key!r} needed for its MoE layers")
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{where}: {key}={value!r}, expected an integer >= {low}")
        return value

    if cfg.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"{where}: hidden_act={cfg['hidden_act']!r}; specfold supports silu")
    # transformers >= 5 writes the expert count as num_local_experts
    experts = integer("num_experts" if "num_experts" in cfg else "num_local_experts", 0, 0)
    out: dict[str, Any] = dict(num_experts=experts, expert_groups=1, topk_groups=1, shared_experts=0,
                               dense_layers=0, routed_scaling=1.0)
    if not experts:
        return out
    norm = cfg.get("norm_topk_prob", False)
    if not isinstance(norm, bool):
        raise ConfigError(f"{where}: norm_topk_prob={norm!r}, expected true or false")
    only = cfg.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
        raise ConfigError(f"{where}: mlp_only_layers={only!r}, expected a list of layer indices")
    out.update(experts_per_token=integer("num_experts_per_tok", None, 1),
               moe_intermediate_size=integer("moe_intermediate_size", None, 1),
               decoder_sparse_step=integer("decoder_sparse_step", 1, 1),
               norm_topk_prob=norm, mlp_only_layers=tuple(only))
    return out


def _eos_ids(eos: Any, where: str) -> tuple[int, ...] | None:
    if eos is None:
        return None
    ids = list(eos) if isinstance(eos, (list, tuple)) else [eos]
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
        raise ConfigError(f"{where}: eos_token_id must be a token id or a list of token ids, got {eos!r}")
    return tuple(ids)


def checkpoint_eos(config: dict, generation: dict | None = None) -> tuple[int, ...] | None:
    """The checkpoint's eos ids, read as `transformers` reads them: generation_config.json's
    `eos_token_id` when that file sets one, else config.json's (its decoder/text config's when the
    top level has none: `GenerationConfig.from_model_config`); an int or a list. (Where
    generation_config.json exists without an eos, transformers stops at nothing; config.json's eos
    is used then.) None: the checkpoint names no eos."""
    if generation is not None and generation.get("eos_token_id") is not None:
        return _eos_ids(generation["eos_token_id"], "generation_config.json")
    if config.get("eos_token_id") is not None:
        return _eos_ids(config["eos_token_id"], "config.json")
    for name in ("decoder", "generator", "text_config"):
        sub = config.get(name)
        if isinstance(sub, dict):
            return _eos_ids(sub.get("eos_token_id"), f"config.json {name}")
    return None


def _stop_ids(fields: dict, config: dict, generation: dict | None, eot: int | None) -> tuple[int, ...]:
    """The checkpoint's eos (the family table's stop ids when it names none) plus the family's
    end-of-turn token."""
    ids = list(checkpoint_eos(config, generation) or fields.get("stop_token_ids", ()))
    if eot is not None and eot not in ids:
        ids.append(eot)
    return tuple(ids)


def resolve_spec(config: dict, overrides: dict | None = None,
                 vocab: dict[str, int] | None = None, generation: dict | None = None) -> ModelSpec:
    """Build the ModelSpec of a checkpoint from its config.json dict, overrides, tokenizer vocab and
    generation_config.json dict (None: the checkpoint has none)."""
    overrides = dict(overrides or {})
    unknown = set(overrides) - _SPEC_FIELDS
    if unknown:
        raise ConfigError(f"unknown override field(s) {sorted(unknown)}; accepted: {sorted(_SPEC_FIELDS)}")
    for key, value in overrides.items():
        _check_override(key, value)
    model_type = overrides.pop("model_type", None) or config.get("model_type")
    if model_type not in FAMILIES:
        raise ConfigError(f"unknown model_type {model_type!r}; supported: {supported_model_types()}")
    fam = dict(FAMILIES[model_type])
    mask_token = fam.pop("mask_token", None)
    eot_token = fam.pop("eot_token", None)
    layout = overrides.get("weight_layout", fam.get("weight_layout", "hf"))
    fields: dict[str, Any] = dict(model_type=model_type)
    fields.update(fam)
    fields.update(_shape_fields(config, layout))
    for key in ("qkv_bias", "qk_norm"):  # family layout wins over generic config flags
        if key in fam:
            fields[key] = fam[key]
    if layout == "llada2":
        from specfold.models.llada2 import config_fields
        fields.update(config_fields(config, fields["head_dim"]))
    elif fam.get("router_scoring") == "softmax":
        fields.update(_qwen3_moe_fields(config))
    if model_type == "qwen2" and "attention_bias" not in config:
        fields["qkv_bias"] = True
    # diffusion fields that a checkpoint's config.json may carry (our tiny model does; SDAR has block_size)
    for key in _DIFFUSION_CONFIG_KEYS:
        if config.get(key) is not None:
            fields[key] = tuple(config[key]) if key == "stop_token_ids" else config[key]
    if config.get("bd_size") is not None:  # Fast-dLLM v2's name for the block size
        fields["block_size"] = int(config["bd_size"])
    if config.get("stop_token_ids") is None:  # specfold's own key wins; else the checkpoint's eos
        eot = vocab.get(eot_token) if eot_token is not None and vocab is not None else None
        fields["stop_token_ids"] = _stop_ids(fields, config, generation, eot)
    if config.get("mask_token_id") is not None:
        fields["mask_token_id"] = int(config["mask_token_id"])
    if isinstance(config.get("widened_from"), dict):  # `specfold widen` output (models/widen.py)
        fields["extra"] = {"widened_from": dict(config["widened_from"])}
    fields.update(overrides)
    if "stop_token_ids" in fields:
        fields["stop_token_ids"] = tuple(int(t) for t in fields["stop_token_ids"])
    if "mlp_only_layers" in fields:
        fields["mlp_only_layers"] = tuple(int(i) for i in fields["mlp_only_layers"])
    if fields.get("mask_token_id") is None and mask_token is not None and vocab is not None:
        fields["mask_token_id"] = vocab.get(mask_token)
    if fields.get("mask_token_id") is None:
        raise ConfigError(
            f"no mask token id for model_type {model_type!r}: set `mask_token_id` in config.json or "
            f"pass overrides={{'mask_token_id': ID}}"
            + (f" (the tokenizer has no {mask_token!r} token)" if mask_token else ""))
    spec = ModelSpec(family=fields.pop("family"), **fields)
    _validate(spec)
    return spec


_FIELD_TYPES = {f.name: str(f.type) for f in dataclasses.fields(ModelSpec)}


def _check_override(key: str, value: Any) -> None:
    """ConfigError unless `value` has the type of ModelSpec field `key` (e.g. mask_token_id=abc)."""
    t = _FIELD_TYPES[key]
    if value is None and "None" in t:
        return
    is_int = isinstance(value, int) and not isinstance(value, bool)
    ok = {"int": is_int, "float": is_int or isinstance(value, float), "bool": isinstance(value, bool),
          "str": isinstance(value, str), "dict": isinstance(value, dict),
          "tuple": isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool)
                                                            for v in value)}
    kind = next((k for k in ("tuple", "dict", "bool", "float", "int", "str") if t.startswith(k)), None)
    if kind is not None and not ok[kind]:
        want = {"tuple": "a list of integers", "dict": "a JSON object", "bool": "true or false",
                "float": "a number", "int": "an integer", "str": "a string"}[kind]
        raise ConfigError(f"override {key}={value!r}: expected {want}")


def _validate(spec: ModelSpec) -> None:
    if spec.attention not in ATTENTION_KINDS:
        raise ConfigError(f"attention={spec.attention!r}; accepted: {ATTENTION_KINDS}")
    if spec.alignment not in ALIGNMENTS:
        raise ConfigError(f"alignment={spec.alignment!r}; accepted: {ALIGNMENTS}")
    if spec.weight_layout not in WEIGHT_LAYOUTS:
        raise ConfigError(f"weight_layout={spec.weight_layout!r}; accepted: {WEIGHT_LAYOUTS}")
    if not 0 <= spec.mask_token_id < spec.vocab_size:
        raise ConfigError(f"mask_token_id={spec.mask_token_id} is outside the vocabulary [0, {spec.vocab_size})")
    if spec.num_heads % spec.num_kv_heads:
        raise ConfigError(f"num_heads={spec.num_heads} is not a multiple of num_kv_heads={spec.num_kv_heads}")
    if spec.block_size <= 0:
        raise ConfigError(f"block_size must be positive, got {spec.block_size}")
    if spec.rotary_dim is not None and not (0 < spec.rotary_dim <= spec.head_dim and spec.rotary_dim % 2 == 0):
        raise ConfigError(f"rotary_dim={spec.rotary_dim}: expected an even number in (0, head_dim={spec.head_dim}]")
    if spec.decoder_sparse_step < 1:
        raise ConfigError(f"decoder_sparse_step must be >= 1, got {spec.decoder_sparse_step}")
    if spec.num_experts:
        from specfold.models.moe import check_routing
        check_routing(spec.num_experts, spec.experts_per_token, spec.expert_groups, spec.topk_groups,
                      spec.router_scoring)


def fingerprint(spec: ModelSpec) -> str:
    """What a default graph is matched on: the family and the shapes decoding depends on. A widened
    checkpoint (`specfold widen`) computes its source's function, so it carries the source's."""
    widened = spec.extra.get("widened_from", {}).get("fingerprint")
    if widened:
        return str(widened)
    return (f"{spec.family}/{spec.model_type}:v{spec.vocab_size}:d{spec.hidden_size}:l{spec.num_layers}"
            f":n{spec.block_size}:m{spec.mask_token_id}")
