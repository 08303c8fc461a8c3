"""Per-request state of a causal decode program, and the causal token choice.

Invariants:
- `generated` holds final tokens only, never more than `max_new_tokens`, and nothing after the first
  stop token (the stop token itself is kept here and cut from `output()`, like the diffusion loop);
- the token at absolute position `q` is chosen from the causal logits that predict `q` by `choose`,
  a function of (logits, q, temperature, seed) alone: at T = 0 the argmax with the mask token's logit
  at -inf (ties to the lower id); at T > 0 Gumbel-max with noise seeded by (seed, q). Every causal
  program therefore picks the same token at the same position given the same prefix, which is what
  makes LinearSpec lossless against AR for a fixed seed, at any temperature;
- `cache.length` = number of positions whose K/V are in the prefix cache; positions
  `[cache.length, start)` are committed tokens waiting to be written (`pending`, multi-branch only).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specfold.models.cache import PrefixCache
from specfold.outputs import DecodeStats

_SEED_STRIDE = 1_000_003  # (seed, position) -> one generator seed


def choose(logits: torch.Tensor, positions: torch.Tensor, mask_id: int, temperature: float,
           seed: int) -> torch.Tensor:
    """logits [K, V] predicting absolute `positions` [K] -> tokens [K] (long, on logits' device)."""
    lg = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32).clone()
    lg[:, mask_id] = float("-inf")
    if temperature <= 0:
        return lg.argmax(-1)
    logp = torch.log_softmax(lg / temperature, dim=-1).double()
    out = torch.empty(lg.shape[0], dtype=torch.long, device=lg.device)
    for i, q in enumerate(positions.tolist()):
        g = torch.Generator(device=lg.device).manual_seed(seed * _SEED_STRIDE + int(q))
        u = torch.rand(lg.shape[1], generator=g, dtype=torch.float64, device=lg.device).clamp_(1e-20, 1.0)
        out[i] = (logp[i] - torch.log(-torch.log(u))).argmax()
    return out


@dataclass
class CausalState:
    """One request of a causal program (AR or LinearSpec)."""
    prompt: list[int]
    max_new_tokens: int
    stop_ids: frozenset[int]
    cache: PrefixCache
    stats: DecodeStats = field(default_factory=DecodeStats)
    generated: list[int] = field(default_factory=list)
    phase: str = "prefill"  # "prefill" | "decode" (AR) | "draft" | "verify" (LinearSpec) | "done"
    finish_reason: str | None = None  # "stop" | "length"
    start: int = 0  # absolute position of the last committed token (the next forward's first row)
    pending: list[int] = field(default_factory=list)  # committed tokens at [cache.length, start)
    round: object = None  # LinearSpec: the current round (linear_spec.Round)
    temperature: float = 0.0
    seed: int = 0
    budget: int | None = None  # cap on alternative drafts per round (the engine's draft budget)
    reported: int = 0  # generated tokens already handed to the engine

    @property
    def done(self) -> bool:
        return self.phase == "done"

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.generated)

    def emit(self, tokens: list[int]) -> bool:
        """Append final tokens; stop at the first stop token or at the budget. True when finished."""
        for t in tokens:
            if self.remaining <= 0:
                break
            self.generated.append(int(t))
            if int(t) in self.stop_ids:
                self.finish("stop")
                return True
        if self.remaining <= 0:
            self.finish("length")
            return True
        self.start = len(self.prompt) + len(self.generated) - 1
        return False

    def finish(self, reason: str) -> None:
        self.phase, self.finish_reason = "done", reason

    def output(self) -> list[int]:
        """Generated ids truncated at the first stop token (excluded)."""
        out = self.generated
        if self.finish_reason == "stop":
            out = out[:-1]
        self.stats.tokens = len(out)
        return list(out)

    def ask(self, forwards: list) -> list:
        """The forwards this request asks for now (their token rows are counted as `rows`)."""
        self.stats.extra["rows"] = self.stats.extra.get("rows", 0) + sum(f.rows for f in forwards)
        return forwards

    def count(self, kind: str) -> None:
        """Count one forward of `kind` ("prefill" | "decode" | "draft" | "verify")."""
        self.stats.nfe += 1
        if kind == "verify":
            self.stats.verify_forwards += 1
        key = f"{kind}_forwards"
        self.stats.extra[key] = self.stats.extra.get(key, 0) + 1
