"""What the block-diffusion program and its plug-ins exchange: steps, drafts, the block context, and
the `DraftPolicy` / `Verifier` protocols (SPEC §5-6).

A decode method = a draft policy + a verifier (decoding/methods/). Both are built once per engine
and shared by every request, so they hold no per-request state: hit counts, fold statistics and
timings live on the request (`specfold.decoding.request.Counters`).

Invariants:
- `DraftPolicy.drafts` only reads its arguments; it returns block states in an order where every
  draft's `parent` (0 = root, i = the i-th draft) comes before it, so any prefix of the list is a
  valid verification batch (the scheduler may cut it: drafts change speed, never tokens);
- a verifier maps the verify forwards of a step to logits (device work) and nothing else;
  `returns_hidden` says whether it can also return the per-layer hidden states (eager commits reuse
  them). Policies see host data only (token lists, `Scored` lists), never a tensor.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from specfold.decoding.rules import Rule, Scored
from specfold.models.forward import Forward, ForwardResult


@dataclass(slots=True)
class Step:
    """One applied rule step: the state, its scored candidates and the state it led to (host data)."""
    state: list[int]  # [W]
    scored: Scored
    next: list[int]  # [W]
    region: list[bool]  # [W] candidates of `state`
    ahead: Scored | None = None  # scores (T = 0) at the region the rule reads once `region` is filled
    # (the next sub-block, or in eager windows the next block), from the same forward as `scored`:
    # draft material only, never read by the rule


@dataclass(slots=True)
class Draft:
    tokens: list[int]  # [W]
    parent: int  # index into the verification batch (0 = root)
    node: int = -1  # policy-specific id (Spiffy graph node, FreeDave depth), for hit statistics


@dataclass
class BlockContext:
    """What a draft policy may read about the active block."""
    start: int  # absolute position of window index 0
    allowed: list[bool]  # [W] positions that may be unmasked (current block, within limit)
    block_origin: int  # window index where the current block starts
    mask_id: int
    rule: Rule
    step: int
    masks_at_start: int
    # this verification's window spans `width` positions from `start` (the current block first; more
    # in eager mode); `window_allowed` [width] marks positions that may be unmasked
    width: int = 0
    window_allowed: list[bool] | None = None
    seed_token: bool = False
    # per-block rule counters (the rule reads them, the program advances them): `step` counts the rule
    # steps applied, `post` those applied while the block had no mask (LLaDA2.1's post steps), and
    # `settled` is the last step's "finished" (Rule.advance)
    post: int = 0
    settled: bool = False


class DraftPolicy:
    """Vanilla: no drafts. Subclasses build future states from the parent step's scores."""
    name = "none"
    topk = 0  # vocabulary ranks the drafts read (`Scored.top`); 0 = the argmax only
    reads_ahead = False  # the drafts read `Step.ahead` (the verification then also computes those logits)

    def drafts(self, root: list[int], parent: Step | None, ctx: BlockContext) -> list[Draft]:
        return []

    def lookahead(self, masked: int, ctx: BlockContext) -> int:
        """Eager mode: how many positions beyond the current block's `masked` masks the drafts want
        (0 = the window is the block)."""
        return 0

    def on_step(self, step: Step, ctx: BlockContext) -> None:
        """Called after every rule step of the main trajectory (calibration records them; a policy
        that records is a single-request tool, not for a shared engine)."""

    def summarize(self, stats) -> None:
        """Derive per-request statistics from the counters already written into `stats.extra`."""


@runtime_checkable
class Verifier(Protocol):
    """`verify_many(forwards) -> results`: the verify forwards of one engine step (device work only;
    per-forward statistics in `ForwardResult.stats`). `packs_with_model`: the runner may merge them
    with the step's other forwards into one `forward_many` call (dense verification);
    `returns_hidden`: it can return the per-layer hidden states (eager commits reuse them)."""
    name: str
    returns_hidden: bool
    packs_with_model: bool

    def verify_many(self, forwards: list[Forward]) -> list[ForwardResult]: ...
