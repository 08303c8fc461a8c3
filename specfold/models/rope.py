"""Rotary position embeddings with absolute positions: default, linear, Llama-3 and YaRN scaling,
plus the Llama-4-style per-position query scaling that Ministral-3 / Nemotron-Labs-Diffusion use.

Invariants: frequencies are computed in float64 and cast to the model dtype at the end; cos/sin use
the rotate-half convention of HuggingFace (`[x1, x2] -> [-x2, x1]`); YaRN's attention factor
multiplies cos and sin, as in `transformers`. Partial RoPE (`rotary_dim` < head_dim, LLaDA2): the
frequencies are those of a `rotary_dim`-wide rotation, padded with zeros to head_dim / 2, so the
tables keep the full head width and `apply_rope` stays one formula; the q/k head dims must then be
laid out by `partial_rotary_perm` (the loader does it), which puts the pairs (i, i + rotary_dim/2)
of the first `rotary_dim` dims at (j, j + head_dim/2).
"""
from __future__ import annotations

import math

import torch

from specfold.errors import ConfigError


def _yarn(dim: int, base: float, p: dict, max_pos: int) -> tuple[torch.Tensor, float]:
    factor = p.get("factor")
    orig = p.get("original_max_position_embeddings") or max_pos
    if factor is None:
        factor = max_pos / orig

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = p.get("attention_factor")
    if attn is None:
        m, m_all = p.get("mscale"), p.get("mscale_all_dim")
        attn = mscale(factor, m) / mscale(factor, m_all) if (m and m_all) else mscale(factor)
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def corr_dim(rot: float) -> float:
        return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    extra, inter = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extra_factor = 1 - ramp
    return inter * (1 - extra_factor) + extra * extra_factor, float(attn)


def _llama3(inv: torch.Tensor, p: dict) -> torch.Tensor:
    factor, lo, hi = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    orig = p["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    lo_wl, hi_wl = orig / lo, orig / hi
    scaled = torch.where(wavelen > lo_wl, inv / factor, inv)
    smooth = (orig / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    mid = ~(wavelen < hi_wl) & ~(wavelen > lo_wl)
    return torch.where(mid, smoothed, scaled)


class Rope:
    """cos/sin tables for absolute positions; `query_scale(positions)` for Llama-4-style scaling."""

    def __init__(self, head_dim: int, theta: float, scaling: dict | None, max_pos: int,
                 rotary_dim: int | None = None):
        self.head_dim = head_dim
        dim = rotary_dim or head_dim  # frequencies of a dim-wide rotation
        inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        self.attention_factor = 1.0
        self.llama4_beta: float | None = None
        self.llama4_orig: int | None = None
        kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
        if kind == "yarn":
            inv, self.attention_factor = _yarn(dim, theta, scaling, max_pos)
        elif kind == "linear":
            inv = inv / scaling["factor"]
        elif kind == "llama3":
            inv = _llama3(inv, scaling)
        elif kind != "default":
            raise ConfigError(f"unsupported rope type {kind!r}; supported: default, linear, llama3, yarn")
        if dim != head_dim and self.attention_factor != 1.0:
            raise ConfigError("partial RoPE with an attention factor (YaRN) is not supported")
        if scaling and scaling.get("llama_4_scaling_beta") is not None:
            self.llama4_beta = float(scaling["llama_4_scaling_beta"])
            self.llama4_orig = int(scaling.get("original_max_position_embeddings") or max_pos)
        pad = torch.zeros(head_dim // 2 - inv.shape[0], dtype=torch.float64)
        self.inv_freq = torch.cat([inv, pad])  # float64 [D/2]; frequency 0 = the dims pass through

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] long -> (cos, sin) each [T, D] in `dtype`."""
        if self.inv_freq.device != positions.device:  # moved once, with the model's first call there
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions.to(torch.float64)[:, None] * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        return ((emb.cos() * self.attention_factor).to(dtype),
                (emb.sin() * self.attention_factor).to(dtype))

    def query_scale(self, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
        """[T] multiplier for queries (Llama-4 scaling past the original context), or None."""
        if self.llama4_beta is None:
            return None
        pos = positions.to(torch.float64)
        return (1 + self.llama4_beta * torch.log1p(torch.floor(pos / self.llama4_orig))).to(dtype)


def partial_rotary_perm(head_dim: int, rotary_dim: int) -> list[int]:
    """New head-dim order (new index -> checkpoint index) under which the checkpoint's partial
    rotation of its first `rotary_dim` dims (pairs (i, i + r) with r = rotary_dim/2) becomes the
    full-width rotate-half pairs (j, j + head_dim/2); the other dims fill the rest in order."""
    r, h = rotary_dim // 2, head_dim // 2
    rest = list(range(rotary_dim, head_dim))
    return list(range(r)) + rest[: h - r] + list(range(r, rotary_dim)) + rest[h - r:]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., T, D] with cos/sin [T, D] broadcast over leading dims."""
    return x * cos + rotate_half(x) * sin
