"""Vanilla decoding on a random-weight checkpoint shaped like Qwen2.5-0.5B, on this CPU.

Prints NFE, tokens per forward and tokens/s per rule (fp32 and bf16), and where the time of one
denoising forward goes: the whole forward with logits at every block position against logits only
at the positions a rule reads, and the 151,936-word head alone.

    .venv/bin/python benchmarks/model_core.py --threads 1 --max-new-tokens 64

Random weights give flat confidences, so the threshold rules fall back to one token per step: the
tokens-per-forward figures here measure bookkeeping, not a real model's acceptance (the tiny model's
benchmarks do that).
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from specfold import LLM, DecodeParams

QWEN25_05B = dict(model_type="qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, intermediate_size=4864, vocab_size=151936, rms_norm_eps=1e-6,
                  rope_theta=1000000.0, max_position_embeddings=32768, tie_word_embeddings=True,
                  mask_token_id=151665, block_size=32, sub_block_size=8, stop_token_ids=[151645],
                  logits_shift=True, seed_token=True, rule="sub_block", threshold=0.9)


def random_checkpoint(folder: Path, cfg: dict, seed: int = 0) -> Path:
    g = torch.Generator().manual_seed(seed)
    d, hd = cfg["hidden_size"], cfg["hidden_size"] // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * hd
    sd = {"model.embed_tokens.weight": torch.randn(cfg["vocab_size"], d, generator=g) * 0.02,
          "model.norm.weight": torch.ones(d)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes = {"self_attn.q_proj.weight": (d, d), "self_attn.q_proj.bias": (d,),
                  "self_attn.k_proj.weight": (kv, d), "self_attn.k_proj.bias": (kv,),
                  "self_attn.v_proj.weight": (kv, d), "self_attn.v_proj.bias": (kv,),
                  "self_attn.o_proj.weight": (d, d), "mlp.gate_proj.weight": (cfg["intermediate_size"], d),
                  "mlp.up_proj.weight": (cfg["intermediate_size"], d), "mlp.down_proj.weight": (d, cfg["intermediate_size"])}
        for k, s in shapes.items():
            sd[p + k] = torch.randn(*s, generator=g) * 0.02
        sd[p + "input_layernorm.weight"] = torch.ones(d)
        sd[p + "post_attention_layernorm.weight"] = torch.ones(d)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def time_forward(llm: LLM, prompt_len: int, n: int, reps: int) -> dict:
    m = llm.model
    cache = m.new_cache(prompt_len + n)
    ids = torch.randint(0, 1000, (1, prompt_len))
    with torch.inference_mode():
        m(ids, torch.arange(prompt_len), cache=cache, mask=None, write_cache=True, logits_at=torch.tensor([prompt_len - 1]))
        block = torch.randint(0, 1000, (1, n))
        pos = torch.arange(prompt_len, prompt_len + n)
        out = {}
        for name, at in (("logits at all 32", None), ("logits at 8 (one sub-block)", torch.arange(8)),
                         ("logits at 1", torch.tensor([0]))):
            m(block, pos, cache=cache, logits_at=at)
            t0 = time.perf_counter()
            for _ in range(reps):
                m(block, pos, cache=cache, logits_at=at)
            out[name] = (time.perf_counter() - t0) / reps
        x = torch.randn(1, n, m.spec.hidden_size, dtype=m.dtype)
        t0 = time.perf_counter()
        for _ in range(reps):
            m.head(x)
        out["head alone, 32 rows"] = (time.perf_counter() - t0) / reps
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=100)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# model_core benchmark: {platform.processor() or platform.machine()}, {a.threads} thread(s), "
          f"torch {torch.__version__}, commit {commit}, {time.strftime('%Y-%m-%d')}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = random_checkpoint(Path(tmp) / "qwen25-05b-random", QWEN25_05B)
        prompt = list(range(1000, 1000 + a.prompt_len))
        for dtype in ("float32", "bfloat16"):
            llm = LLM(folder, dtype=dtype)
            print(f"\n## {dtype}\n\n| rule | NFE | tokens | tokens/forward | tokens/s |\n|---|---|---|---|---|")
            for rule, kw in (("static k=1", dict(rule="static", tokens_per_step=1)),
                             ("static k=2", dict(rule="static", tokens_per_step=2)),
                             ("threshold 0.9", dict(rule="threshold")),
                             ("sub_block 0.9 (8)", dict(rule="sub_block")),
                             ("dynamic 0.9 / k=2", dict(rule="dynamic", tokens_per_step=2))):
                o = llm.generate([prompt], DecodeParams(max_new_tokens=a.max_new_tokens, early_stop=False, **kw))[0]
                s = o.stats
                print(f"| {rule} | {s.nfe} | {s.tokens} | {s.tokens_per_forward:.2f} | {s.tokens_per_second:.2f} |")
            t = time_forward(llm, a.prompt_len, 32, a.reps)
            full = t["logits at all 32"]
            print(f"\nOne denoising forward (block of 32 after a {a.prompt_len}-token prefix):\n")
            print("| variant | ms | share of the full forward |\n|---|---|---|")
            for k, v in t.items():
                print(f"| {k} | {v * 1000:.1f} | {v / full:.2f} |")


if __name__ == "__main__":
    main()
