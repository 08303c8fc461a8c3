"""Helpers that build tiny random `transformers` checkpoints and run them as the reference.

`transformers` computes RMSNorm and RoPE tables in float32 even for float64 models; for the float64
comparison `float64_reference()` patches those two pieces to run in the model's dtype (same math),
so a 1e-10 bound compares the architecture, not HF's rounding choices.
"""
from __future__ import annotations

import contextlib
import inspect
import json
import textwrap
from pathlib import Path

import torch

# config kwargs shared by the tiny reference models
BASE = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


def make_hf_model(kind: str, seed: int = 0):
    import transformers as tf
    torch.manual_seed(seed)
    if kind == "qwen2":
        cfg = tf.Qwen2Config(**BASE, rope_theta=10000.0, tie_word_embeddings=False)
        model = tf.Qwen2ForCausalLM(cfg)
    elif kind == "qwen3":
        cfg = tf.Qwen3Config(**BASE, head_dim=12, rope_theta=10000.0, tie_word_embeddings=True)
        model = tf.Qwen3ForCausalLM(cfg)
    elif kind == "llama":
        cfg = tf.LlamaConfig(**BASE, rope_theta=10000.0)
        model = tf.LlamaForCausalLM(cfg)
    elif kind == "ministral3":
        rope = {"type": "yarn", "rope_type": "yarn", "rope_theta": 1000000.0, "factor": 16.0,
                "original_max_position_embeddings": 64, "max_position_embeddings": 1024,
                "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0,
                "llama_4_scaling_beta": 0.1}
        kw = dict(BASE, max_position_embeddings=1024)
        cfg = tf.Ministral3Config(**kw, head_dim=8, rope_parameters=rope)
        model = tf.Ministral3ForCausalLM(cfg)
    else:
        raise ValueError(kind)
    with torch.no_grad():  # random q/k/v biases and norm weights, so bugs in them show
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.normal_(0, 0.5 if name.endswith("bias") else 0.2).add_(1.0 if "norm" in name else 0.0)
    return model.eval()


def save_hf(model, folder: Path, extra_config: dict) -> Path:
    model.save_pretrained(folder, safe_serialization=True)
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(extra_config)
    cfg_path.write_text(json.dumps(cfg))
    return folder


@contextlib.contextmanager
def float64_reference():
    """Make HF's RMSNorm and rotary tables keep the input dtype (they upcast to float32)."""
    import transformers.models.llama.modeling_llama as ml
    import transformers.models.ministral3.modeling_ministral3 as mm
    import transformers.models.qwen2.modeling_qwen2 as mq2
    import transformers.models.qwen3.modeling_qwen3 as mq3
    import transformers.models.qwen3_moe.modeling_qwen3_moe as mq3m

    def norm_forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.variance_epsilon))

    def rope_forward(self, x, position_ids):
        inv = self.inv_freq_f64.to(x.device)
        freqs = position_ids[..., None].to(torch.float64) * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)

    saved = []
    for mod in (ml, mm, mq2, mq3, mq3m):
        for cname in dir(mod):
            cls = getattr(mod, cname)
            if cname.endswith("RMSNorm"):
                saved.append((cls, "forward", cls.forward))
                cls.forward = norm_forward
            elif cname.endswith("RotaryEmbedding"):
                saved.append((cls, "forward", cls.forward))
                cls.forward = rope_forward
    try:
        yield
    finally:
        for cls, attr, fn in saved:
            setattr(cls, attr, fn)


def hf_logits(model, ids: torch.Tensor, allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Run the HF model with a 4D additive mask built from `allowed` [T, T] (True = may attend)."""
    model = model.to(dtype)
    for mod in model.modules():
        if hasattr(mod, "inv_freq"):
            if not hasattr(mod, "inv_freq_f64"):
                mod.inv_freq_f64 = _inv_freq_f64(mod)
    add = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=add[None, None], position_ids=torch.arange(ids.shape[1])[None])
    return out.logits


def _inv_freq_f64(mod) -> torch.Tensor:
    """The rotary inverse frequencies in float64, checked against HF's own float32 table."""
    from specfold.models.rope import Rope
    cfg = mod.config
    rp = dict(getattr(cfg, "rope_parameters", None) or {})
    kind = rp.get("rope_type", rp.get("type", "default"))
    theta = rp.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    r = Rope(head_dim, theta, None if kind == "default" else rp, cfg.max_position_embeddings)
    assert torch.allclose(r.inv_freq.float(), mod.inv_freq.float(), rtol=1e-6), "rope tables disagree"
    assert abs(r.attention_factor - mod.attention_scaling) < 1e-12
    return r.inv_freq


@contextlib.contextmanager
def patched_forward(cls, old: str, new: str, count: int, name: str):
    """`cls.forward` re-executed from its own source with `old` replaced by `new` (which must occur
    `count` times: a changed source fails loudly instead of being patched wrongly), restored after."""
    import sys
    src = textwrap.dedent(inspect.getsource(cls.forward))
    assert src.count(old) == count, f"{cls.__name__}.forward changed: re-check what this patch does"
    ns: dict = {}
    exec(compile(src.replace(old, new), name, "exec"), vars(sys.modules[cls.__module__]), ns)
    saved, cls.forward = cls.forward, ns["forward"]
    try:
        yield
    finally:
        cls.forward = saved
