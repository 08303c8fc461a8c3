"""Verification windows: plain (the block) or eager (the block and later blocks), one interface.

The block program asks its window object four things; the plain path has no eager branches:
- `new_block(req, start)`: a new block begins (plain: the store is dropped; eager: stored later-block
  logits stay valid, keyed by every token since their window start);
- `extra_blocks(req, policy, masked, ctx, n)`: later blocks this verification's window reaches into;
- `remember(req, branches, hidden, start)`: keep what a commit may reuse from this verification;
- `commit(req, model, state, start, positions, seed_token)`: commit the block without a forward when
  possible -> (done, seed logits row or None).

Eager windows (block-causal, absolutely aligned families only): a branch's block j logits are exact
for (committed prefix + its blocks < j) when those earlier blocks are complete; a block is committed
from the window's K/V (recomputed by `Transformer.write_kv` from the returned hidden states) when a
branch of the last batch holds exactly the committed tokens through it.
"""
from __future__ import annotations

import torch


class PlainWindows:
    wants_hidden = False

    def new_block(self, req, start: int) -> None:
        req.store.clear(start)

    def extra_blocks(self, req, policy, masked: int, ctx, n: int) -> int:
        return 0

    def remember(self, req, branches: torch.Tensor, hidden, start: int) -> None:
        pass

    def commit(self, req, model, state: torch.Tensor, start: int, positions: torch.Tensor,
               seed_token: bool) -> tuple[bool, torch.Tensor | None]:
        return False, None


class EagerWindows(PlainWindows):
    def __init__(self, wants_hidden: bool):
        self.wants_hidden = wants_hidden

    def new_block(self, req, start: int) -> None:
        pass

    def extra_blocks(self, req, policy, masked: int, ctx, n: int) -> int:
        want = policy.lookahead(masked, ctx)
        if want <= 0:
            return 0
        extra = -(-want // n)
        while extra and ctx.start + extra * n >= req.limit:
            extra -= 1
        return extra

    def remember(self, req, branches: torch.Tensor, hidden, start: int) -> None:
        req.last_batch = (branches, hidden, start) if hidden is not None else None

    def commit(self, req, model, state, start, positions, seed_token):
        if req.last_batch is None:
            return False, None
        toks, hidden, origin = req.last_batch
        off, n = start - origin, len(state)
        if off < 0 or off + n > toks.shape[1]:
            return False, None
        target = torch.cat([req.seq[origin: start], state])
        match = (toks[:, : off + n] == target).all(1).nonzero()
        if len(match) == 0:
            return False, None
        b = int(match[0, 0])
        model.write_kv(req.cache, [h[b, off: off + n] for h in hidden[:-1]], positions)
        seed = model.head(hidden[-1][b: b + 1, off + n - 1: off + n])[0, -1] if seed_token else None
        req.counters.commits_reused += 1
        return True, seed
