"""FreeDave / FreeDave++ chain drafts, with eager windows (SPEC §5).

With the parent step's fill order (`graph.fill_order`: its rule region by confidence, then the region
the rule reads next, `Step.ahead`, by confidence):
- static rule (k positions per step): draft j = the parent state with the first (j+1)·k positions of
  the order unmasked to their argmax tokens, i.e. the root plus j·k more (FreeDave);
- threshold / sub-block / dynamic rules: the root is the threshold step; draft j adds j more positions
  in fill order (FreeDave++).
Depth d = `draft_depth`: the root and d-1 drafts in one verification, up to d steps per forward.

Under the sub-block rule the look-ahead region is the next sub-block, whose logits the parent's
verification computed too, so a chain may complete the current sub-block and start the next one, and
a sub-block's first step is speculated as well. At a block's first step there is no parent (no drafts).

Eager (`eager=True`, block-causal models): when fewer than d·k masks remain, the loop widens the
window into the next block(s); once the parent's region holds the block's last masks, its look-ahead
region is the next block's, so the chain goes on there (the current block is always filled first; for
seed-token families the next block's first position is guessed first).
"""
from __future__ import annotations

from specfold.decoding.drafts import summarize
from specfold.decoding.drafts.graph import DraftGraph
from specfold.decoding.plugins import BlockContext, Draft, DraftPolicy, Step
from specfold.outputs import DecodeStats
from specfold.params import EngineConfig


class FreeDave(DraftPolicy):
    name = "freedave"
    topk = 0
    reads_ahead = True

    def __init__(self, params: EngineConfig):
        k = params.tokens_per_step if params.rule == "static" else 1
        self.depth, self.k, self.eager = params.draft_depth, k, bool(params.eager)
        self.graph = DraftGraph.chain(self.depth - 1, k) if self.depth > 1 else None

    def lookahead(self, masked: int, ctx: BlockContext) -> int:
        want = self.depth * self.k
        return want - masked + 1 if self.eager and self.depth > 1 and masked < want else 0

    def drafts(self, root: list[int], parent: Step | None, ctx: BlockContext) -> list[Draft]:
        if self.graph is None:
            return []
        return self.graph.realize(root, parent, ctx)

    def summarize(self, stats: DecodeStats) -> None:
        summarize(stats)
