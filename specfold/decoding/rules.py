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

Hooks a rule may override (the block program calls them; defaults = a monotone rule): `candidates`
(the positions whose scores it reads: the masked allowed ones; LLaDA2.1 also reads the written ones,
its edit set), `wants_forward` (before a forward: whether the block needs one more step; default:
while it has a mask), `advance` (state, scores, block context -> the next state and whether the block
is finished; it may rewrite written tokens when `monotone` is False) and `mid_block_stop` (whether a
block may end once a stop token has no mask before it). Per-block counters (`step`, `post`,
`settled`) live in the program's `BlockContext`, never in a rule: one rule serves every request.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from specfold.decoding import rules_llada2 as L2
from specfold.params import EngineConfig


@dataclass(slots=True)
class Scored:
    positions: list[int]  # [C] candidate window positions, ascending
    tokens: list[int]  # [C] chosen token per candidate
    conf: list[float]  # [C] confidence (float64)
    top: list[list[int]] | None = None  # [C][K] the K most likely ids (column 0 = argmax at T = 0)
    logprobs: list[dict[int, float]] | None = None  # [C] per candidate: token id -> log-probability (asked for)


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
    monotone = True  # written tokens never change (a block state never repeats)
    mid_block_stop = True  # a block may end once a stop token has no mask before it (early_stop)

    def __init__(self, p: EngineConfig):
        self.p = p

    def candidates(self, tokens: list[int], allowed: list[bool], mask_id: int) -> list[bool]:
        """[W] positions whose scores the rule reads (before `region`): the masked allowed ones."""
        return [t == mask_id and a for t, a in zip(tokens, allowed)]

    def wants_forward(self, has_mask: bool, ctx) -> bool:
        """Before a forward of the block (ctx: the program's BlockContext): False ends the block."""
        return has_mask

    def advance(self, state: list[int], s: Scored, ctx) -> tuple[list[int], bool]:
        """One step: the next block state, and whether the block is finished (needs no forward)."""
        return self.apply(state, s, ctx.step, ctx.masks_at_start), False

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


def _block_view(state: list[int], s: Scored, mask_id: int):
    """Scores over the block (rules_llada2's inputs): masked, frozen (not a candidate), top, prob [N]."""
    N = len(state)
    cand, top, prob = [False] * N, [-1] * N, [0.0] * N
    for p, t, c in zip(s.positions, s.tokens, s.conf):
        cand[p], top[p], prob[p] = True, t, c
    masked = [c and t == mask_id for c, t in zip(cand, state)]
    return masked, [not c for c in cand], top, prob


def _written(state: list[int], step: L2.Step) -> list[int]:
    nxt = list(state)
    for i, t in step.writes:
        nxt[i] = t
    return nxt


class LLaDA2(Rule):
    """LLaDA2.0 (rules_llada2.llada2_step): per step s of `steps`, the masks with p > threshold when at
    least the schedule's quota pass, else the quota's most probable masks."""

    def wants_forward(self, has_mask, ctx):
        return has_mask and ctx.step < self.p.steps

    def advance(self, state, s, ctx):
        masked, _, top, prob = _block_view(state, s, ctx.mask_id)
        st = L2.llada2_step(masked, top, prob, ctx.step, self.p.steps, self.p.threshold)
        return _written(state, st), st.done


class LLaDA2Edit(Rule):
    """LLaDA2.1 (rules_llada2.llada2_edit_step): masks with p > threshold (else the best one) and, at
    the block's written non-prompt positions, every changed argmax with p > edit_threshold; once the
    block has no mask, at most `max_post_steps` more forwards, until a step edits nothing."""
    monotone = False
    mid_block_stop = False  # a later edit may change the tokens before a stop token, or the stop token

    def candidates(self, tokens, allowed, mask_id):
        return list(allowed)

    def wants_forward(self, has_mask, ctx):
        return not ctx.settled and L2.edit_wants_forward(has_mask, ctx.post, self.p.max_post_steps)

    def advance(self, state, s, ctx):
        masked, frozen, top, prob = _block_view(state, s, ctx.mask_id)
        st = L2.llada2_edit_step(state, masked, frozen, top, prob, self.p.threshold, self.p.edit_threshold)
        return _written(state, st), st.done


RULES: dict[str, type[Rule]] = {"static": Static, "threshold": Threshold, "sub_block": SubBlock,
                                "dynamic": Dynamic, "llada": LLaDA, "dream": Dream,
                                "llada2": LLaDA2, "llada2_edit": LLaDA2Edit}


def make_rule(p: EngineConfig) -> Rule:
    try:
        return RULES[p.rule](p)
    except KeyError:
        raise ValueError(f"unknown rule {p.rule!r}; accepted: {sorted(RULES)}") from None
