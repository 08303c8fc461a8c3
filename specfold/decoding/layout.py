"""Attention masks of the three prefix/window kinds (SPEC §3), as bool [T, T] (True = may attend).

- block_causal: blocks aligned to absolute positions: query q sees key j iff q // N >= j // N
  (prefill, active window and commit alike; a window that spans blocks stays block-causal inside);
- causal_prefix (Nemotron-Labs-Diffusion): prefill and commit are causal; the active block is
  bidirectional inside itself;
- bidirectional (Dream, LLaDA): no mask at all (None).
Every window query also sees the whole cached prefix; that part needs no mask.
"""
from __future__ import annotations

import torch


def block_causal(positions: torch.Tensor, n: int, origin: int = 0) -> torch.Tensor:
    b = torch.div(positions - origin, n, rounding_mode="floor")
    return b[:, None] >= b[None, :]


def causal(positions: torch.Tensor) -> torch.Tensor:
    return positions[:, None] >= positions[None, :]


def prefill_mask(attention: str, positions: torch.Tensor, n: int) -> torch.Tensor | None:
    if attention == "block_causal":
        return block_causal(positions, n)
    if attention == "causal_prefix":
        return causal(positions)
    return None


def window_mask(attention: str, positions: torch.Tensor, n: int, origin: int = 0) -> torch.Tensor | None:
    """Mask of an active window (one block, or several in eager mode) against itself."""
    if attention == "bidirectional":
        return None
    return block_causal(positions, n, origin)


def commit_mask(attention: str, positions: torch.Tensor, n: int, origin: int = 0) -> torch.Tensor | None:
    if attention == "causal_prefix":
        return causal(positions)
    return window_mask(attention, positions, n, origin)
