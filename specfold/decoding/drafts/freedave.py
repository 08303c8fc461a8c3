"""FreeDave / FreeDave++ chain drafts, with eager windows (SPEC §5).

With the parent step's confidence ranking p (the step that produced the root):
- static rule (k positions per step): draft j = the parent state with the top-(j+1)·k positions of p
  unmasked to their argmax tokens, i.e. the root plus j·k more ranks (FreeDave);
- threshold / sub-block / dynamic rules: the root is the threshold step; draft j adds j more positions
  by p's static ranking (FreeDave++).
Depth d = `draft_depth`: the root and d-1 drafts in one verification, up to d steps per forward.

The ranking only covers the parent's candidates (its rule region): a position that enters a new
sub-block region after the parent step was never scored, so the chain stops at the region's end
(fewer or no drafts), as it does at block start where there is no parent.

Eager (`eager=True`, block-causal models): when fewer than d·k masks remain, the loop widens the
window into the next block(s) and the chain goes on there once the current block is complete (the
current block is always filled first): first the complete block with the next block untouched (for
seed-token families its first position guessed), then next-block positions by the ranking of the
parent's look-ahead logits (`Step.ahead`, computed in the same forward as the parent's own).
"""
from __future__ import annotations

import torch

from specfold.decoding.drafts import summarize
from specfold.decoding.drafts.graph import DraftGraph
from specfold.decoding.plugins import BlockContext, Draft, DraftPolicy, Step
from specfold.decoding.rules import rank
from specfold.outputs import DecodeStats
from specfold.params import DecodeParams


class FreeDave(DraftPolicy):
    name = "freedave"
    topk = 0

    def __init__(self, params: DecodeParams):
        k = params.tokens_per_step if params.rule == "static" else 1
        self.depth, self.k, self.eager = params.draft_depth, k, bool(params.eager)
        self.graph = DraftGraph.chain(self.depth - 1, k) if self.depth > 1 else None

    def lookahead(self, masked: int, ctx: BlockContext) -> int:
        want = self.depth * self.k
        return want - masked + 1 if self.eager and self.depth > 1 and masked < want else 0

    def drafts(self, root: torch.Tensor, parent: Step | None, ctx: BlockContext) -> list[Draft]:
        if self.graph is None:
            return []
        N = len(root)
        if ctx.width <= N:
            return self.graph.realize(root, parent, ctx)
        return self._eager(root, parent, ctx, N)

    def _eager(self, root: torch.Tensor, parent: Step | None, ctx: BlockContext, N: int) -> list[Draft]:
        if parent is None:
            return []
        M, W = ctx.mask_id, ctx.width
        s = parent.scored
        cur = [(int(s.positions[i]), int(s.tokens[i])) for i in rank(s).tolist() if root[s.positions[i]] == M]
        # (position, token) in fill order; the current block first
        order = list(cur)
        left = int(((root == M) & ctx.allowed).sum()) - len(cur)
        base = torch.cat([root, torch.full((W - N,), M, dtype=root.dtype, device=root.device)])
        extend = left == 0  # the ranking completes the current block: the chain may cross into the next
        if extend and parent.ahead is not None:
            a = parent.ahead
            nxt = [(int(a.positions[i]), int(a.tokens[i])) for i in rank(a).tolist()
                   if int(a.positions[i]) < W and bool(ctx.window_allowed[int(a.positions[i])])]
            if ctx.seed_token:  # vanilla starts each block with its seed filled: guess it first
                first = [x for x in nxt if x[0] % N == 0]
                nxt = first + [x for x in nxt if x[0] % N != 0]
            order += nxt
        out: list[Draft] = []
        st = base
        n_steps = self.depth - 1
        for j in range(1, n_steps + 1):
            take = order[(j - 1) * self.k: j * self.k]
            if not take:
                break
            st = st.clone()
            for pos, tok in take:
                st[pos] = tok
            out.append(Draft(st, len(out), j))
        return out

    def summarize(self, stats: DecodeStats) -> None:
        summarize(stats)
