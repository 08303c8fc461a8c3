"""Alternative drafts of multi-branch LinearSpec, from the draft forwards' own distributions.

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

import torch


@dataclass
class DraftRecord:
    """What the draft forwards of one round said, per block position (position 0 = last committed)."""
    p1: torch.Tensor  # [n] float64: probability of the committed draft token (1 at position 0)
    t2: torch.Tensor  # [n] long: second most likely token (-1 where unknown)
    p2: torch.Tensor  # [n] float64: its probability (0 where unknown)
    fills: list[torch.Tensor] = field(default_factory=list)  # [n] lower-threshold drafts

    @classmethod
    def empty(cls, n: int, device) -> "DraftRecord":
        return cls(torch.ones(n, dtype=torch.float64, device=device),
                   torch.full((n,), -1, dtype=torch.long, device=device),
                   torch.zeros(n, dtype=torch.float64, device=device))


def observe(rec: DraftRecord, before: torch.Tensor, after: torch.Tensor, pos: torch.Tensor,
            logits: torch.Tensor, mask_id: int) -> None:
    """Record one draft forward: block `before` -> `after` ([n]); `logits` [C, V] at block `pos` [C]."""
    lg = logits.double().clone()
    lg[:, mask_id] = float("-inf")
    top = torch.softmax(lg, dim=-1).topk(min(2, lg.shape[-1]), dim=-1)
    new = (before[pos] == mask_id) & (after[pos] != mask_id)
    p = pos[new]
    rec.p1[p] = top.values[new, 0]
    if top.values.shape[1] > 1:
        rec.t2[p] = top.indices[new, 1]
        rec.p2[p] = top.values[new, 1]
    if bool((after == mask_id).any()):
        fill = after.clone()
        still = fill[pos] == mask_id
        fill[pos[still]] = top.indices[still, 0]
        if not bool((fill == mask_id).any()):
            rec.fills.append(fill)


def build(rec: DraftRecord, main: torch.Tensor, budget: int) -> list[torch.Tensor]:
    """Up to `budget` distinct drafts [n], main first (then the first lower-threshold fill, the
    top-2 swaps by score, the other fills)."""
    out: list[torch.Tensor] = [main]
    seen = {tuple(main.tolist())}

    def add(t: torch.Tensor) -> None:
        key = tuple(t.tolist())
        if len(out) < budget and key not in seen:
            seen.add(key)
            out.append(t)

    if rec.fills:
        add(rec.fills[0])
    n = main.shape[0]
    if n > 1:
        reach = torch.cat([rec.p1.new_ones(2), torch.cumprod(rec.p1[1:], 0)[:-1]])  # [n]: Π_{0<j<i} p1
        gain = torch.where(rec.t2 >= 0, reach * rec.p2, torch.full_like(reach, -1.0))
        gain[0] = -1.0
        for i in torch.sort(gain, descending=True, stable=True).indices.tolist():
            if len(out) >= budget or gain[i] < 0:
                break
            swap = main.clone()
            swap[i] = rec.t2[i]
            add(swap)
    for f in rec.fills[1:]:
        add(f)
    return out
