"""`Forward`: one model call over device tensors, and its `ForwardResult` (what the model and the
verifiers take and return).

Programs never build these: they ask for host-side `Job`s (decoding/jobs.py), which the engine's
runner turns into `Forward`s (one host-to-device copy per step) and runs in one packed call.

Invariants:
- `tokens` [B, T] are B branches of one window of T positions that all share `cache`'s prefix;
- `mask` [T, T] (query x key, True = may attend) restricts attention inside the window; None = full;
- `write_cache=True` needs B == 1 and appends the window's K/V to `cache` after the forward;
- `logits_at` (window indices) selects where the head runs; None = every position; `head_rows`
  (flat indices b·T + t) instead selects each branch's own rows: logits [1, len(head_rows), V];
- `parents[b]` is branch b's parent inside the batch (-1 for the root): verifiers that fold use it;
- `kind` is only for statistics and scheduling ("prefill", "verify", "commit", "draft").
"""
from __future__ import annotations

from dataclasses import dataclass, field
import torch

from specfold.models.cache import PrefixCache


def upload(values: list[int], device: torch.device) -> torch.Tensor:
    """Host integers -> one long tensor on `device`: one host-to-device copy, from pinned memory
    (asynchronous) on CUDA."""
    buf = torch.tensor(values, dtype=torch.long)
    if device.type == "cuda":
        return buf.pin_memory().to(device, non_blocking=True)
    return buf if buf.device == device else buf.to(device)


@dataclass(slots=True)
class Forward:
    tokens: torch.Tensor  # [B, T] long, on the model's device
    positions: torch.Tensor  # [T] long, absolute positions
    cache: PrefixCache | None = None
    mask: torch.Tensor | None = None  # [T, T] bool
    write_cache: bool = False
    logits_at: torch.Tensor | None = None  # [K] long window indices
    head: str = "lm"  # "lm" | "ar" (Nemotron-Labs-Diffusion's causal head where shipped)
    parents: list[int] = field(default_factory=list)
    return_hidden: bool = False
    kind: str = "verify"
    head_rows: torch.Tensor | None = None  # [n] long flat rows b*T + t (overrides logits_at)

    @property
    def rows(self) -> int:
        """Token rows this forward costs (scheduling budget)."""
        return int(self.tokens.shape[0] * self.tokens.shape[1])


@dataclass(slots=True)
class ForwardResult:
    logits: torch.Tensor  # [B, K, V]
    hidden: list[torch.Tensor] | None = None  # per-layer inputs [B, T, d] + final, when asked
    stats: dict | None = None  # verifier statistics of this forward (fold: per-layer "folded",
    # "positions", "ffn_folded" lists), added to the request's counters
