"""LLaDA2.0 and LLaDA2.1 decoding rules as pure functions of host data (docs/LLADA2.md).

Inputs describe one block of N positions at the start of a step: `tokens` [N] (the mask id where
masked), `masked` [N] (True = a mask now), `frozen` [N] (True = a prompt position inside the
block), and from the step's logits `top` [N] (argmax with the mask token's logit at -inf) and
`prob` [N] (its softmax probability, float64). Every position of the block is read, including
those past prompt + max_new_tokens in the last block (LLaDA2 decodes that block in full; the
output is cut afterwards). A step returns the positions to write and their tokens (`Step.writes`)
and whether the block needs no further forward once they are written (`Step.done`).

Invariants (temperature 0, the official `generate` of both model cards):
- thresholds are strict (`prob > threshold`); a threshold of 0.0 passes every position;
- LLaDA2.0: the quota of step s is `schedule(block, steps)[s]` (block // steps, plus 1 for the
  first block % steps steps; trailing zeros when steps > block); if fewer masked positions than
  the quota pass the threshold, the `min(quota, masks)` most probable masked positions are taken
  instead (not the passing ones plus some); nothing is ever remasked;
- LLaDA2.1: every masked position with prob > threshold is committed, or else the single most
  probable masked one; every position that was not a mask when the step started and is not
  frozen is rewritten to its argmax when that differs and prob > edit_threshold (so a token
  committed in this step is not edited in it, and earlier blocks never are); the block is done
  after a step that started with no mask and edited nothing, or before a forward once
  `max_post_steps` forwards have run with no mask (`edit_wants_forward`);
- ties in a top-k go to the lower position.
Nothing here imports torch or the engine (only `steps_for` from the settings).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from specfold.params import steps_for  # noqa: F401 (the per-request cap of `steps`, defined with the settings)


@dataclass(frozen=True, slots=True)
class Step:
    writes: tuple[tuple[int, int], ...]  # (block position, token), ascending positions
    edits: int  # how many writes rewrote a committed token (LLaDA2.1)
    done: bool  # the block needs no further forward after these writes


def schedule(block: int, steps: int) -> list[int]:
    """Per-step commit quota of LLaDA2.0: block // steps, plus 1 for the first block % steps steps."""
    if steps <= 0:
        return []
    base, extra = divmod(block, steps)
    return [base + (1 if s < extra else 0) for s in range(steps)]


def _best(candidates: Sequence[int], prob: Sequence[float], k: int) -> list[int]:
    """The k most probable candidates, ties to the lower position."""
    return sorted(sorted(candidates, key=lambda i: (-prob[i], i))[:k])


def llada2_select(masked: Sequence[bool], prob: Sequence[float], quota: int, threshold: float) -> list[int]:
    """Positions LLaDA2.0 unmasks in a step with this quota."""
    cand = [i for i, m in enumerate(masked) if m]
    passing = [i for i in cand if prob[i] > threshold]
    if len(passing) >= quota:
        return passing
    return _best(cand, prob, min(quota, len(cand)))


def llada2_step(masked: Sequence[bool], top: Sequence[int], prob: Sequence[float], step: int,
                steps: int, threshold: float) -> Step:
    """One LLaDA2.0 step (step index `step` < `steps`, the capped steps per block)."""
    quotas = schedule(len(masked), steps)
    chosen = llada2_select(masked, prob, quotas[step], threshold)
    left = sum(masked) - len(chosen)
    return Step(tuple((i, top[i]) for i in chosen), 0, left == 0 or step + 1 >= steps)


def edit_select(tokens: Sequence[int], masked: Sequence[bool], frozen: Sequence[bool], top: Sequence[int],
                prob: Sequence[float], threshold: float, edit_threshold: float) -> tuple[list[int], list[int]]:
    """(committed masks, edited positions) of one LLaDA2.1 step."""
    cand = [i for i, m in enumerate(masked) if m]
    commit = [i for i in cand if prob[i] > threshold] or _best(cand, prob, 1)
    edit = [i for i, (m, f) in enumerate(zip(masked, frozen))
            if not m and not f and top[i] != tokens[i] and prob[i] > edit_threshold]
    return commit, edit


def llada2_edit_step(tokens: Sequence[int], masked: Sequence[bool], frozen: Sequence[bool],
                     top: Sequence[int], prob: Sequence[float], threshold: float,
                     edit_threshold: float) -> Step:
    """One LLaDA2.1 step (a post step when nothing is masked)."""
    commit, edit = edit_select(tokens, masked, frozen, top, prob, threshold, edit_threshold)
    writes = tuple((i, top[i]) for i in sorted(commit + edit))
    return Step(writes, len(edit), not any(masked) and not edit)


def edit_wants_forward(has_mask: bool, post_steps: int, max_post_steps: int) -> bool:
    """Before a LLaDA2.1 forward: False ends the block. `post_steps` = forwards already run for this
    block while it had no mask (the limit is checked before each forward)."""
    return has_mask or post_steps < max_post_steps


def settled_stop(generated: Sequence[int], mask_id: int, stop_ids: Sequence[int]) -> int | None:
    """Index of the first stop token in `generated` (the tokens after the prompt, masks included)
    when no mask precedes it, else None. LLaDA2.0 may end a block there once a step commits a stop
    token (its `eos_early_stop`); both rules may stop after a block that holds one. Neither changes
    the output: it is cut at the first stop token, and a finished block never changes again."""
    stops = set(stop_ids)
    for i, t in enumerate(generated):
        if t in stops:
            return i
        if t == mask_id:
            return None
    return None
