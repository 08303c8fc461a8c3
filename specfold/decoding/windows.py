"""Verification windows: plain (the block) or eager (the block and later blocks), one interface.

The block program asks its window object four things; the plain path has no eager branches:
- `new_block(st, start)`: a new block begins (plain: the store is dropped; eager: stored later-block
  scores stay valid, keyed by every token since their window start);
- `extra_blocks(st, policy, masked, ctx, n, limit)`: later blocks this verification's window reaches;
- `remember(st, branches, hidden, start)`: keep what a commit may reuse from this verification;
- `reuse(st, state, start)`: the K/V of a completed block from the last verification, when a branch
  of it holds exactly the committed tokens through the block -> (per-layer hidden rows, final rows)
  or None (then the block needs a commit forward).

Eager windows (block-causal, absolutely aligned families only): a branch's block j scores are exact
for (committed prefix + its blocks < j) when those earlier blocks are complete; a block is committed
from the window's K/V (recomputed by `Transformer.write_kv` from the returned hidden states). The
match is on host lists; the hidden states stay on the device.
"""
from __future__ import annotations

from specfold.decoding.jobs import HiddenRows


class PlainWindows:
    wants_hidden = False

    def new_block(self, st, start: int) -> None:
        st.store.clear(start)

    def extra_blocks(self, st, policy, masked: int, ctx, n: int, limit: int) -> int:
        return 0

    def remember(self, st, branches: list[list[int]], hidden, start: int) -> None:
        pass

    def reuse(self, st, state: list[int], start: int):
        return None


class EagerWindows(PlainWindows):
    def __init__(self, wants_hidden: bool):
        self.wants_hidden = wants_hidden

    def new_block(self, st, start: int) -> None:
        pass

    def extra_blocks(self, st, policy, masked: int, ctx, n: int, limit: int) -> int:
        want = policy.lookahead(masked, ctx)
        if want <= 0:
            return 0
        extra = -(-want // n)
        while extra and ctx.start + extra * n >= limit:
            extra -= 1
        return extra

    def remember(self, st, branches, hidden, start: int) -> None:
        st.last_batch = (branches, hidden, start) if hidden is not None else None

    def reuse(self, st, state, start):
        if st.last_batch is None:
            return None
        toks, hidden, origin = st.last_batch
        off, n = start - origin, len(state)
        if off < 0 or off + n > len(toks[0]):
            return None
        target = st.seq[origin: start] + list(state)
        b = next((i for i, t in enumerate(toks) if t[: off + n] == target), None)
        if b is None:
            return None
        return HiddenRows(hidden, b, off, off + n)
