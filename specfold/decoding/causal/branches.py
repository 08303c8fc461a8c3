"""Alternative drafts of multi-branch LinearSpec, from the draft forwards' own distributions (host).

Every draft forward of a round already returns a distribution at each position it scores. Besides the
main draft (exactly the single-branch draft), a round can verify, in the same batched causal forward:
- **lower thresholds**: after each draft forward but the last, the block with every remaining mask
  filled by that forward's argmax (what a smaller threshold would have drafted; none at τ = 0);
- **top-2 swaps**: the main draft with position i replaced by its second most likely token, for the
  positions with the highest `reach(i) · p2(i)`, where reach(i) = Π_{0<j<i} p1(j) estimates the chance
  that the main draft is still accepted before i (p1, p2: the top-2 probabilities of the forward that
  committed position i).
Branch 0 is the main draft; every alternative's parent is branch 0 (folded verification inherits
from it: a swap at i is bit-identical to branch 0 at every position before i under the causal mask).
Duplicates are dropped. No forward is spent here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from specfold.decoding.readout import Row


@dataclass
class DraftRecord:
    """What the draft forwards of one round said, per block position (position 0 = last committed)."""
    p1: list[float]  # [n] probability of the committed draft token (1 at position 0)
    t2: list[int]  # [n] second most likely token (-1 where unknown)
    p2: list[float]  # [n] its probability (0 where unknown)
    fills: list[list[int]] = field(default_factory=list)  # [n] lower-threshold drafts

    @classmethod
    def empty(cls, n: int) -> "DraftRecord":
        return cls([1.0] * n, [-1] * n, [0.0] * n)


def observe(rec: DraftRecord, before: list[int], after: list[int], pos: list[int], rows: list[Row],
            mask_id: int) -> None:
    """Record one draft forward: block `before` -> `after`; `rows` (top-2 ids and probabilities, mask
    excluded) at block positions `pos`."""
    for p, r in zip(pos, rows):
        if before[p] == mask_id and after[p] != mask_id:
            rec.p1[p] = r.top_probs[0]
            if len(r.top) > 1:
                rec.t2[p], rec.p2[p] = r.top[1], r.top_probs[1]
    if mask_id in after:
        fill = list(after)
        for p, r in zip(pos, rows):
            if fill[p] == mask_id:
                fill[p] = r.top[0]
        if mask_id not in fill:
            rec.fills.append(fill)


def build(rec: DraftRecord, main: list[int], budget: int) -> list[list[int]]:
    """Up to `budget` distinct drafts [n], main first (then the first lower-threshold fill, the
    top-2 swaps by score, the other fills)."""
    out: list[list[int]] = [list(main)]
    seen = {tuple(main)}

    def add(t: list[int]) -> None:
        if len(out) < budget and tuple(t) not in seen:
            seen.add(tuple(t))
            out.append(t)

    if rec.fills:
        add(rec.fills[0])
    n = len(main)
    if n > 1:
        reach, acc = [1.0, 1.0], 1.0  # reach[i] = Π_{0<j<i} p1(j)
        for i in range(2, n):
            acc *= rec.p1[i - 1]
            reach.append(acc)
        gain = [reach[i] * rec.p2[i] if rec.t2[i] >= 0 else -1.0 for i in range(n)]
        gain[0] = -1.0
        for i in sorted(range(n), key=lambda i: -gain[i]):
            if len(out) >= budget or gain[i] < 0:
                break
            swap = list(main)
            swap[i] = rec.t2[i]
            add(swap)
    for f in rec.fills[1:]:
        add(f)
    return out
