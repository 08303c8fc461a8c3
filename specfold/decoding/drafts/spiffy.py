"""Spiffy draft policy: realize a calibrated draft graph from the parent step's logits (SPEC §5).

Default graphs ship in `graphs/` (JSON, one per model fingerprint and rule); `default_graph` picks the
one calibrated for this model and rule (else another rule's graph for this model), so `DecodeParams(method="spiffy")` works on the tiny model
without a graph argument.
"""
from __future__ import annotations

import json
from pathlib import Path


from specfold.decoding.drafts import summarize
from specfold.decoding.drafts.graph import DraftGraph, GraphError, load_graph
from specfold.decoding.plugins import BlockContext, Draft, DraftPolicy, Step
from specfold.models.spec import ModelSpec, fingerprint  # noqa: F401 (fingerprint: re-exported)
from specfold.outputs import DecodeStats
from specfold.params import EngineConfig

GRAPHS = Path(__file__).resolve().parent / "graphs"


def default_graph(spec: ModelSpec, rule: str, branches: int, depth: int | None = None) -> DraftGraph:
    fp = fingerprint(spec)
    found = []
    for f in sorted(GRAPHS.glob("*.json")):
        try:
            meta = json.loads(f.read_text()).get("meta", {})
        except (json.JSONDecodeError, OSError, AttributeError):
            continue
        if meta.get("model") == fp:
            found.append((meta.get("rule"), f))
    # a graph calibrated with this rule first; another rule's graph for this model still drafts (and
    # stays lossless), so it is the fallback
    for r, f in sorted(found, key=lambda x: (x[0] != rule, x[0] != "threshold", str(x[1]))):
        g = DraftGraph.load(f)
        if len(g if depth is None else g.to_depth(depth)) >= branches:
            return g
    have = ", ".join(f"{r} ({f.name})" for r, f in found) or "none"
    raise GraphError(
        f"method 'spiffy' needs a draft graph: pass graph=PATH (or --graph PATH). No shipped default graph "
        f"fits this model ({fp}) with {branches} branches{'' if depth is None else f' at depth <= {depth}'} (shipped for this model: {have}); "
        f"make one with `specfold calibrate --model M --prompts FILE --rule {rule} --branches {branches} "
        f"--out graph.json`")


class Spiffy(DraftPolicy):
    name = "spiffy"
    reads_ahead = True

    def __init__(self, graph: DraftGraph, eager: bool = False):
        self.graph, self.eager = graph, eager
        self.topk = graph.topk if graph.topk > 1 else 0
        reach = [0] * (len(graph) + 1)  # positions a node unmasks beyond the root, through its ancestors
        for i, n in enumerate(graph.nodes, start=1):
            reach[i] = reach[n.parent] + len(n.pairs)
        self.reach = 1 + max(reach)  # the root step unmasks at least one

    def lookahead(self, masked: int, ctx: BlockContext) -> int:
        """Eager windows: as far as the deepest node reaches beyond the current block's masks."""
        return self.reach - masked + 1 if self.eager and masked < self.reach else 0

    def drafts(self, root: list[int], parent: Step | None, ctx: BlockContext) -> list[Draft]:
        return self.graph.realize(root, parent, ctx)

    def summarize(self, stats: DecodeStats) -> None:
        summarize(stats)


def make_policy(spec: ModelSpec, params: EngineConfig) -> Spiffy:
    depth = params.graph_depth
    graph = (default_graph(spec, params.rule, params.branches, depth) if params.graph is None
             else load_graph(params.graph))
    graph.validate(block_size=params.block_size)
    if depth is not None:
        graph = graph.to_depth(depth)
        if len(graph) < params.branches:
            raise GraphError(f"the draft graph has {len(graph)} nodes at depth <= {depth}; branches="
                             f"{params.branches} asks for more (calibrate a bigger graph with `specfold "
                             f"calibrate --branches N`)")
    return Spiffy(graph.first(params.branches), bool(params.eager))
