"""Attention masks of the three prefix/window kinds (SPEC §3): host descriptions, built on the device.

- block_causal: blocks aligned to absolute positions: query q sees key j iff q // N >= j // N
  (prefill, active window and commit alike; a window that spans blocks stays block-causal inside);
- causal_prefix (Nemotron-Labs-Diffusion): prefill and commit are causal; the active block is
  bidirectional inside itself;
- bidirectional (Dream, LLaDA): no mask at all (None).
Every window query also sees the whole cached prefix; that part needs no mask. Programs describe a
mask as a tuple (decoding/jobs.py); `build_mask` makes the bool [T, T] tensor (True = may attend) on
the positions' device, so no mask is ever copied from the host.
"""
from __future__ import annotations

import torch


def block_causal(positions: torch.Tensor, n: int, origin: int = 0) -> torch.Tensor:
    b = torch.div(positions - origin, n, rounding_mode="floor")
    return b[:, None] >= b[None, :]


def causal(positions: torch.Tensor) -> torch.Tensor:
    return positions[:, None] >= positions[None, :]


def pending(a: int, t: int, device) -> torch.Tensor:
    """[t, t]: the first `a` (pending) rows causal among themselves; the other rows see everything."""
    m = torch.ones(t, t, dtype=torch.bool, device=device)
    if a:
        m[:a, :a] = causal(torch.arange(a, device=device))
        m[:a, a:] = False
    return m


def is_full(desc: tuple | None, start: int, t: int) -> bool:
    """Whether the mask lets every window row see every window row (decided on the host)."""
    if desc is None:
        return True
    if desc[0] == "block":
        n, origin = desc[1], desc[2]
        return (start - origin) // n == (start + t - 1 - origin) // n
    if desc[0] == "pending":
        return desc[1] == 0 or t == 1
    return t == 1  # causal


def build_mask(desc: tuple | None, positions: torch.Tensor) -> torch.Tensor | None:
    """The bool [T, T] mask on the positions' device (None = full attention)."""
    if desc is None:
        return None
    kind = desc[0]
    if kind == "block":
        return block_causal(positions, desc[1], desc[2])
    if kind == "causal":
        return causal(positions)
    if kind == "pending":
        return pending(desc[1], len(positions), positions.device)
    raise ValueError(f"unknown mask description {desc!r}")


def prefill_mask(attention: str, n: int) -> tuple | None:
    if attention == "block_causal":
        return ("block", n, 0)
    if attention == "causal_prefix":
        return ("causal",)
    return None


def window_mask(attention: str, n: int, origin: int = 0) -> tuple | None:
    """Mask of an active window (one block, or several in eager mode) against itself."""
    if attention == "bidirectional":
        return None
    return ("block", n, origin)


def commit_mask(attention: str, n: int, origin: int = 0) -> tuple | None:
    if attention == "causal_prefix":
        return ("causal",)
    return window_mask(attention, n, origin)
