"""Unmask rules (SPEC §4): (block state, scored candidates) -> the next block state. Host only.

A rule is a pure function of plain Python data: the block state (a list of token ids), the scored
candidates (`Scored`, host lists that the runner read back from the device once per step, see
decoding/readout.py) and the step index inside the block. So a state's scores can be stored and
reused (speculative decoding) without changing the trajectory, and no rule ever touches a tensor.

Invariants (temperature 0):
- the mask token never wins (the readout sets its logit to -inf); token = argmax, confidence of the
  rule's kind (max_prob default, margin, neg_entropy), float64;
- only masked positions in the rule's region are candidates; ties go to the lower position;
- every step unmasks at least one position, except the Dream schedule, which may unmask none.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from specfold.params import EngineConfig


@dataclass(slots=True)
class Scored:
    positions: list[int]  # [C] candidate window positions, ascending
    tokens: list[int]  # [C] chosen token per candidate
    conf: list[float]  # [C] confidence (float64)
    top: list[list[int]] | None = None  # [C][K] the K most likely ids (column 0 = argmax at T = 0)


def rank(s: Scored) -> list[int]:
    """Candidate indices by descending confidence, ties to the lower position (stable sort)."""
    conf = s.conf
    return sorted(range(len(conf)), key=lambda i: -conf[i])


def _top(s: Scored, k: int) -> list[int]:
    return rank(s)[: max(1, min(k, len(s.conf)))]


def indices(flags: list[bool]) -> list[int]:
    return [i for i, f in enumerate(flags) if f]


class Rule:
    """Base: `region` picks candidate positions, `select` picks which candidates to unmask."""

    def __init__(self, p: EngineConfig):
        self.p = p

    def region(self, masked: list[bool], block_start: int) -> list[bool]:
        """masked [W] over the window (only positions of the current block are ever masked-and-
        allowed) -> candidate flags [W]."""
        return masked

    def select(self, s: Scored, step: int, masks_at_start: int) -> list[int]:
        raise NotImplementedError

    def apply(self, state: list[int], s: Scored, step: int, masks_at_start: int) -> list[int]:
        nxt = list(state)
        for i in self.select(s, step, masks_at_start):
            nxt[s.positions[i]] = s.tokens[i]
        return nxt

    def passes(self, conf: float) -> bool:
        tau = self.p.threshold
        return conf >= tau if self.p.threshold_ge else conf > tau


class Static(Rule):
    def select(self, s, step, masks_at_start):
        return _top(s, self.p.tokens_per_step)


class Threshold(Rule):
    def select(self, s, step, masks_at_start):
        ok = [self.passes(c) for c in s.conf]
        for i in _top(s, 1):
            ok[i] = True
        return indices(ok)


class SubBlock(Threshold):
    """Threshold restricted to the first sub-block that still has masks (Fast-dLLM v2)."""

    def region(self, masked, block_start):
        n = self.p.sub_block_size
        first = next((i for i, m in enumerate(masked) if m), None)
        if first is None:
            return masked
        lo = block_start + (first - block_start) // n * n
        return [m and lo <= i < lo + n for i, m in enumerate(masked)]


class Dynamic(Rule):
    """SDAR: every position with confidence > τ when at least k qualify, else static(k)."""

    def select(self, s, step, masks_at_start):
        ok = [self.passes(c) for c in s.conf]
        if sum(ok) >= min(self.p.tokens_per_step, len(s.conf)):
            return indices(ok)
        return _top(s, self.p.tokens_per_step)


class LLaDA(Rule):
    """Per block of m masks and s steps: step i unmasks m // s, plus one for the first m mod s steps."""

    def select(self, s, step, masks_at_start):
        steps = self.p.steps
        k = masks_at_start // steps + (1 if step < masks_at_start % steps else 0)
        if step >= steps - 1:
            k = len(s.conf)
        return rank(s)[: min(k, len(s.conf))]


@lru_cache(maxsize=64)
def dream_ratios(steps: int) -> tuple[float, ...]:
    """1 − t[i+1]/t[i] for timesteps linspace(1, 1e-3, steps+1), in float32 as upstream computes
    them (made once per step count, on the CPU, outside any decode step)."""
    import torch
    t = torch.linspace(1, 1e-3, steps + 1, dtype=torch.float32)
    return tuple((1 - t[1:] / t[:-1]).tolist())


class Dream(Rule):
    """Timesteps linspace(1, 1e-3, steps+1); step i unmasks int(n·(1 − t[i+1]/t[i])) (float32), all at the end."""

    def select(self, s, step, masks_at_start):
        steps = self.p.steps
        n = len(s.conf)
        if step >= steps - 1:
            return rank(s)
        k = _f32_times(n, dream_ratios(steps)[step])
        return rank(s)[: min(k, n)]


def _f32_times(n: int, r: float) -> int:
    """int(n * r) with the product rounded to float32, as `int(n * tensor_f32)` does."""
    import struct
    return int(struct.unpack("f", struct.pack("f", n * r))[0])


RULES: dict[str, type[Rule]] = {"static": Static, "threshold": Threshold, "sub_block": SubBlock,
                                "dynamic": Dynamic, "llada": LLaDA, "dream": Dream}


def make_rule(p: EngineConfig) -> Rule:
    try:
        return RULES[p.rule](p)
    except KeyError:
        raise ValueError(f"unknown rule {p.rule!r}; accepted: {sorted(RULES)}") from None
