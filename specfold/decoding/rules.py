"""Unmask rules (SPEC §4): (block state, logits at candidate positions) -> positions to unmask + tokens.

A rule is a pure function of its inputs and the step index inside the block, so a state's logits can
be cached and reused (speculative decoding) without changing the trajectory.

Invariants (temperature 0):
- the mask token's logit is set to -inf before anything else; token = argmax, confidence from the
  rule's confidence kind (max_prob default, margin, neg_entropy);
- only masked positions in the rule's region are candidates; ties go to the lower position;
- every step unmasks at least one position, except the Dream schedule, which may unmask none.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specfold.params import DecodeParams


@dataclass(slots=True)
class Scored:
    positions: torch.Tensor  # [C] candidate window positions, ascending
    tokens: torch.Tensor  # [C] chosen token per candidate
    conf: torch.Tensor  # [C] confidence (float64)
    top: torch.Tensor | None = None  # [C, K] the K most likely token ids (column 0 = argmax), when asked


def score(logits: torch.Tensor, positions: torch.Tensor, mask_id: int, kind: str, temperature: float,
          generator: torch.Generator | None, topk: int = 0) -> Scored:
    """logits [C, V] at candidate `positions` -> tokens and confidences (and, for draft policies that
    read vocabulary ranks beyond the argmax, the `topk` most likely ids; never changes tokens/conf)."""
    lg = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32).clone()
    lg[:, mask_id] = float("-inf")
    if temperature > 0:
        lg = lg / temperature
    logp = torch.log_softmax(lg, dim=-1)
    probs = logp.exp()
    if temperature > 0:
        u = torch.rand(lg.shape, generator=generator, dtype=torch.float64, device=lg.device).clamp_(1e-20, 1.0)
        tokens = (logp.double() - torch.log(-torch.log(u))).argmax(-1)
    else:
        tokens = lg.argmax(-1)
    if kind == "max_prob":
        conf = probs.gather(-1, tokens[:, None])[:, 0]
    elif kind == "margin":
        top2 = probs.topk(2, dim=-1).values
        conf = top2[:, 0] - top2[:, 1]
    elif kind == "neg_entropy":
        conf = torch.where(probs > 0, probs * logp, torch.zeros_like(probs)).sum(-1)
    else:
        raise ValueError(kind)
    top = None
    if topk > 0:
        top = lg.topk(min(topk, lg.shape[-1]), dim=-1).indices
        if temperature == 0:
            top[:, 0] = tokens  # ties: the argmax (lowest index) is vocabulary rank 0
    return Scored(positions, tokens, conf.double(), top)


def rank(s: Scored) -> torch.Tensor:
    """Candidate indices by descending confidence, ties to the lower position (stable sort)."""
    return torch.sort(s.conf, descending=True, stable=True).indices


def _top(s: Scored, k: int) -> torch.Tensor:
    return rank(s)[: max(1, min(k, len(s.conf)))]


class Rule:
    """Base: `region` picks candidate positions, `select` picks which candidates to unmask."""

    def __init__(self, p: DecodeParams):
        self.p = p

    def region(self, masked: torch.Tensor, block_start: int) -> torch.Tensor:
        """masked [W] bool over the window (only positions of the current block are ever masked-and-
        allowed) -> candidate bool [W]."""
        return masked

    def select(self, s: Scored, step: int, masks_at_start: int) -> torch.Tensor:
        raise NotImplementedError

    def apply(self, state: torch.Tensor, s: Scored, step: int, masks_at_start: int) -> torch.Tensor:
        idx = self.select(s, step, masks_at_start)
        nxt = state.clone()
        nxt[s.positions[idx]] = s.tokens[idx]
        return nxt


class Static(Rule):
    def select(self, s, step, masks_at_start):
        return _top(s, self.p.tokens_per_step)


class Threshold(Rule):
    def select(self, s, step, masks_at_start):
        tau = self.p.threshold
        ok = (s.conf >= tau) if self.p.threshold_ge else (s.conf > tau)
        best = _top(s, 1)
        ok[best] = True
        return ok.nonzero()[:, 0]


class SubBlock(Threshold):
    """Threshold restricted to the first sub-block that still has masks (Fast-dLLM v2)."""

    def region(self, masked, block_start):
        n = self.p.sub_block_size
        idx = masked.nonzero()[:, 0]
        if len(idx) == 0:
            return masked
        first = idx[0].item()
        lo = block_start + (first - block_start) // n * n
        out = torch.zeros_like(masked)
        out[lo: lo + n] = masked[lo: lo + n]
        return out


class Dynamic(Rule):
    """SDAR: every position with confidence > τ when at least k qualify, else static(k)."""

    def select(self, s, step, masks_at_start):
        ok = s.conf >= self.p.threshold if self.p.threshold_ge else s.conf > self.p.threshold
        if ok.sum().item() >= min(self.p.tokens_per_step, len(s.conf)):
            return ok.nonzero()[:, 0]
        return _top(s, self.p.tokens_per_step)


class LLaDA(Rule):
    """Per block of m masks and s steps: step i unmasks m // s, plus one for the first m mod s steps."""

    def select(self, s, step, masks_at_start):
        steps = self.p.steps
        k = masks_at_start // steps + (1 if step < masks_at_start % steps else 0)
        if step >= steps - 1:
            k = len(s.conf)
        return rank(s)[: min(k, len(s.conf))]


class Dream(Rule):
    """Timesteps linspace(1, 1e-3, steps+1); step i unmasks int(n·(1 − t[i+1]/t[i])) (float32), all at the end."""

    def select(self, s, step, masks_at_start):
        steps = self.p.steps
        n = len(s.conf)
        if step >= steps - 1:
            return rank(s)
        t = torch.linspace(1, 1e-3, steps + 1, dtype=torch.float32)  # a host schedule of scalars
        k = int(n * (1 - t[step + 1] / t[step]))
        return rank(s)[: min(k, n)]


RULES: dict[str, type[Rule]] = {"static": Static, "threshold": Threshold, "sub_block": SubBlock,
                                "dynamic": Dynamic, "llada": LLaDA, "dream": Dream}


def make_rule(p: DecodeParams) -> Rule:
    try:
        return RULES[p.rule](p)
    except KeyError:
        raise ValueError(f"unknown rule {p.rule!r}; accepted: {sorted(RULES)}") from None
