"""Random Nemotron-Labs-Diffusion-layout checkpoints for the causal-program tests.

`nld_checkpoint(folder, ...)` saves a random Ministral-3 model under NLD's names (`encoder.*`,
`diffusion_head`, optionally a separate causal `lm_head`) with model_type nemotron_labs_diffusion.
`focus > 1` multiplies the head rows of a few tokens so the argmax mostly falls among them: the
bidirectional drafts then sometimes agree with the causal choices, and rounds accept 1..n tokens.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from tests.hf_reference import make_hf_model

FOCUS_TOKENS = list(range(10, 16))
MASK = 95


def nld_checkpoint(folder: Path, seed: int = 0, focus: float = 1.0, ar_head: bool = False,
                   block_size: int = 4, stop: int = 94, mask_like: int | None = None,
                   mask_mix: float = 1.0, layer_scale: float = 1.0) -> Path:
    hf = make_hf_model("ministral3", seed=seed)
    sd = {}
    for k, v in hf.state_dict().items():
        if k == "model.embed_tokens.weight" and mask_like is not None:
            v = v.clone()
            v[MASK] = (1 - mask_mix) * v[MASK] + mask_mix * v[mask_like]
        if k.endswith(("o_proj.weight", "down_proj.weight")):
            v = v * layer_scale
        if k == "lm_head.weight":
            w = v.clone()
            w[FOCUS_TOKENS] *= focus
            sd["diffusion_head.weight"] = w
            if ar_head:
                g = torch.Generator().manual_seed(seed + 100)
                ar = torch.randn(w.shape, generator=g) * w.std()
                ar[FOCUS_TOKENS] *= focus
                sd["lm_head.weight"] = ar
        elif k.startswith("model."):
            sd["encoder." + k[len("model."):]] = v.contiguous()
    folder.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(folder / "model.safetensors"))
    config = hf.config.to_dict()
    config.update(model_type="nemotron_labs_diffusion", mask_token_id=MASK, block_size=block_size,
                  stop_token_ids=[stop], tie_word_embeddings=False)
    (folder / "config.json").write_text(json.dumps(config))
    return folder
