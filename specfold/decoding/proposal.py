"""`Proposal`: one verification before its drafts are chosen (host data); `Pick`: the drafts chosen.

Each engine step works in two phases. Every request that must verify proposes its verification: the
root (its window and the rows its rule reads) and the policy's full list of drafts, computed lazily
(`Proposal.drafts`) so that a chooser that wants none never pays for drafting. The engine's chooser (engine/budget.py) then picks, for each request, which drafts to
verify, and only then are the jobs built: the engine passes each request's `Pick` to
`BlockProgram.plan(req, pick)`. The pick is an argument: nothing of the choice is kept on the
request or in its state.

Invariants:
- a proposal reads the request's state and changes nothing in it; the engine proposes once per
  request and step, and the pick carries that proposal to `plan`;
- a pick is closed under parents (a draft's parent branch is picked too, or is the root), so any
  prefix of the policy's list is a valid pick; `subset` renumbers the parents into the new list;
- drafts change speed, never tokens: every lossless method gives vanilla's tokens for any pick.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from specfold.decoding.plugins import Draft


@dataclass
class Proposal:
    """One verification before its drafts are chosen."""
    width: int  # window positions (token rows per branch)
    extra: int  # eager: later blocks in the window
    nodes: int  # drafts the policy may propose at most (0: none, `drafts` is not computed)
    make: object = None  # () -> list[Draft]: the policy's drafts (called once, on first use)
    seconds: float = 0.0  # host time spent drafting
    root_region: tuple | None = None  # the root branch's (rule regions, look-aheads), as the job needs them
    _drafts: list[Draft] | None = field(default=None, repr=False)

    @property
    def drafts(self) -> list[Draft]:
        """The policy's full list (parents first), made on first use."""
        if self._drafts is None:
            t0 = time.perf_counter()
            self._drafts = self.make() if (self.make is not None and self.nodes) else []
            self.seconds += time.perf_counter() - t0
        return self._drafts


@dataclass(slots=True)
class Pick:
    """The chooser's word on one request's verification this step: `plan(req, pick)`'s argument."""
    proposal: Proposal  # this step's `propose(req)`: the verification picked from
    drafts: list[int] | None = None  # indices into proposal.drafts, ascending, closed under parents; None = all
    drafting: bool = False  # verifying none of them, the request still drafts: score the next drafts' material


def subset(drafts: list[Draft], chosen: list[int] | None) -> list[Draft]:
    """The drafts at `chosen` (indices into `drafts`, ascending), with parents renumbered; None = all.
    Raises ValueError when a chosen draft's parent branch is not chosen (the pick is not closed)."""
    if chosen is None:
        return list(drafts)
    new = {0: 0}  # old branch index (0 = root, i = drafts[i-1]) -> new branch index
    out = []
    for i in chosen:
        d = drafts[i]
        if d.parent not in new:
            raise ValueError(f"draft {i}'s parent branch {d.parent} is not in the pick {chosen}")
        out.append(Draft(d.tokens, new[d.parent], d.node))
        new[i + 1] = len(out)
    return out

