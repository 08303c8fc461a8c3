"""The tiny model's HF checkpoint: config (Qwen2 layout + specfold's diffusion fields) and export."""
from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

from specfold.models.transformer import Transformer

# Model sizes. "base" is the shipped model; "micro" is for the test suite.
SIZES = {
    "base": dict(hidden_size=192, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=512),
    # 5.0M parameters (20 MB in float32): more capacity per training token for the `choices` task
    "large": dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=768),
    "micro": dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                  intermediate_size=64),
}
BLOCK_SIZE = 16
SUB_BLOCK_SIZE = 8
VOCAB_PAD = 64  # config vocab_size is the tokenizer size rounded up to this


def model_config(size: str, vocab_size: int, mask_id: int, stop_ids: list[int], eos_id: int,
                 pad_id: int) -> dict:
    s = SIZES[size]
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        **s,
        "head_dim": s["hidden_size"] // s["num_attention_heads"],
        "vocab_size": int(math.ceil(vocab_size / VOCAB_PAD) * VOCAB_PAD),
        "hidden_act": "silu",
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": s["num_hidden_layers"],
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "float32",
        "bos_token_id": None,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        # diffusion fields read by specfold (models/spec.py)
        "mask_token_id": mask_id,
        "stop_token_ids": stop_ids,
        "block_size": BLOCK_SIZE,
        "sub_block_size": SUB_BLOCK_SIZE,
        "logits_shift": False,
        "attention": "block_causal",
        "alignment": "absolute",
        "seed_token": False,
        "rule": "sub_block",
        "threshold": 0.9,
    }



def export(model: Transformer, config: dict, tok_dir: Path, heldout_path: Path, out: Path) -> None:
    """Write the HF checkpoint folder (Qwen2 names) into `out`, atomically per file."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    names = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
             "lm_head.weight": "lm_head.weight"}
    parts = {"q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
             "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
             "down_proj": "mlp.down_proj", "input_norm": "input_layernorm",
             "post_norm": "post_attention_layernorm"}
    for name, p in model.state_dict().items():
        if name in names:
            hf = names[name]
        else:
            _, i, part, kind = name.split(".")
            hf = f"model.layers.{i}.{parts[part]}.{kind}"
        tensors[hf] = p.detach().float().contiguous().clone()
    tmp = out / "model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": config["stop_token_ids"], "pad_token_id": config["pad_token_id"]}, indent=2) + "\n")
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tok_dir / f).resolve() != (out / f).resolve():
            shutil.copy(tok_dir / f, out / f)
    if heldout_path.resolve() != (out / "heldout.jsonl").resolve():
        shutil.copy(heldout_path, out / "heldout.jsonl")
