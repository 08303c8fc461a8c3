"""Draft graphs (SPEC §5): a DAG of draft nodes rooted at the main branch, realized from the parent's logits.

Node 0 is the root (the main-trajectory state being verified). Node i >= 1 has one parent
`parent[i] < i` and a set of (position rank, vocabulary rank) pairs; its block state is its parent
node's state with, for each pair (r, v), the r-th still-masked position of the parent step's fill
order (`fill_order`: its rule region by confidence, `rules.rank`, then the region the rule reads next,
`Step.ahead`, by confidence; restricted to the positions still masked in the parent node) unmasked to
the v-th most likely token of the parent step's logits at that position. So a node may complete the
current sub-block and start the next one (or, in eager windows, the next block). A node whose ranks
run past the fill order is not realized, nor are its descendants.

Nodes are stored in selection order (parents first), so the first B nodes of a graph are a valid graph
of B nodes. FreeDave's chain is the graph whose node j is {(0, 0)}, ..., {(k-1, 0)} under node j-1.

Non-monotone rules (LLaDA2.1 edits written tokens, `Rule.monotone` False): a draft may contain edits.
The positions a node may write (`fillable`) are the parent node's masks in fill order, then its
written positions whose token differs from the parent step's argmax there (the edits the parent's
scores suggest but did not pass tau_edit), in fill order. So position ranks below the mask count mean
what they mean for a monotone rule (a chain fills the masks first, as the rule replayed on the
parent's scores would), and the ranks after them apply suggested edits: once a block has no mask
(its post steps), a chain's drafts are the root with the suggested edits applied one by one.

JSON file: {"version": 1, "nodes": [{"parent": 0, "pairs": [[0, 0]]}, ...], "meta": {...}} where meta
may hold `block_size` (ranks must be below it), `rule`, `counts`, `prompts`, `model` (a fingerprint).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from specfold.decoding.plugins import BlockContext, Draft, Step
from specfold.decoding.rules import Scored, rank
from specfold.errors import ConfigError

VERSION = 1
MAX_NODES = 64  # DecodeParams.branches accepts at most 64
MAX_VOCAB_RANK = 8  # vocabulary ranks 0..7 (Scored.top keeps that many ids)


def fill_order(step: Step, seed_block: int | None = None) -> tuple[list[int], dict[int, tuple[Scored, int]]]:
    """A step's draft material in fill order -> (window positions, position -> (scores, row)): its rule
    region by descending confidence, then its look-ahead region (`Step.ahead`) by descending confidence.
    With `seed_block` = N (seed-token families), a later block's first position leads the look-ahead:
    vanilla starts every block with its seed filled."""
    s, order, src = step.scored, [], {}
    for i in rank(s):
        p = s.positions[i]
        order.append(p)
        src[p] = (s, i)
    a = step.ahead
    if a is not None and a.conf:
        nxt = [(a.positions[i], i) for i in rank(a)]
        if seed_block:
            nxt.sort(key=lambda x: not (x[0] >= seed_block and x[0] % seed_block == 0))  # stable
        for p, i in nxt:
            if p not in src:
                order.append(p)
                src[p] = (a, i)
    return order, src


class GraphError(ConfigError):
    """A draft graph file or object is malformed, of another version, or does not fit the model."""


@dataclass(frozen=True, slots=True)
class Node:
    parent: int  # 0 = root, i = graph node i (1-based; nodes[i - 1])
    pairs: tuple[tuple[int, int], ...]  # (position rank, vocabulary rank), sorted


@dataclass
class DraftGraph:
    nodes: list[Node]
    meta: dict = field(default_factory=dict)
    version: int = VERSION

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ shape
    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def topk(self) -> int:
        """Vocabulary ranks the graph reads (1 = argmax only)."""
        return 1 + max((v for n in self.nodes for _, v in n.pairs), default=0)

    def first(self, b: int) -> "DraftGraph":
        """The graph of its first `b` nodes (valid: parents precede children)."""
        if b > len(self.nodes):
            raise GraphError(f"the draft graph has {len(self.nodes)} nodes; branches={b} asks for more "
                             f"(calibrate one with `specfold calibrate --branches {b}`)")
        return DraftGraph(self.nodes[:b], dict(self.meta), self.version)

    def depths(self) -> list[int]:
        """Depth of every node (a root child is depth 1)."""
        d = [0]
        for n in self.nodes:
            d.append(d[n.parent] + 1)
        return d[1:]

    def to_depth(self, depth: int) -> "DraftGraph":
        """The graph of its nodes at most `depth` deep, in the same order (parents first: a node's
        parent is shallower, so it is kept too). A greedy calibration limited to `depth` picks these
        nodes first, in this order, and then shallow nodes this graph never reached; for B nodes of
        depth <= D calibrate with `specfold calibrate --max-depth D`."""
        keep = [i for i, d in enumerate(self.depths(), start=1) if d <= depth]
        new = {0: 0} | {old: j for j, old in enumerate(keep, start=1)}
        nodes = [Node(new[self.nodes[i - 1].parent], self.nodes[i - 1].pairs) for i in keep]
        if not nodes:
            raise GraphError(f"the draft graph has no node at depth <= {depth}")
        meta = dict(self.meta) | {"graph_depth": depth}
        for name in ("counts", "hit_rate_estimate"):  # per-node calibration lists follow their nodes
            per = meta.get(name)
            if isinstance(per, list) and len(per) >= len(self.nodes):
                meta[name] = [per[i - 1] for i in keep]
        return DraftGraph(nodes, meta, self.version)

    @classmethod
    def chain(cls, depth: int, k: int = 1) -> "DraftGraph":
        """FreeDave: node j = node j-1 plus the next k positions of the ranking (argmax tokens)."""
        pairs = tuple((r, 0) for r in range(k))
        return cls([Node(j, pairs) for j in range(depth)], {"kind": "chain", "k": k})

    # ------------------------------------------------------------------ validation
    def validate(self, block_size: int | None = None) -> None:
        if self.version != VERSION:
            raise GraphError(f"draft graph version {self.version!r} is not supported (this specfold reads "
                             f"version {VERSION}); recalibrate it with `specfold calibrate`")
        if not isinstance(self.nodes, list) or not self.nodes:
            raise GraphError("a draft graph needs at least one node")
        if len(self.nodes) > MAX_NODES:
            raise GraphError(f"the draft graph has {len(self.nodes)} nodes; at most {MAX_NODES} are allowed")
        limit = block_size if block_size is not None else self.meta.get("block_size")
        for i, n in enumerate(self.nodes, start=1):
            if not isinstance(n.parent, int) or isinstance(n.parent, bool) or not 0 <= n.parent < i:
                raise GraphError(f"node {i}: parent {n.parent!r} must be an earlier node index in [0, {i - 1}] "
                                 f"(0 = the root)")
            if not n.pairs:
                raise GraphError(f"node {i}: needs at least one (position rank, vocabulary rank) pair")
            seen = set()
            for pr in n.pairs:
                if (not isinstance(pr, tuple) or len(pr) != 2
                        or not all(isinstance(x, int) and not isinstance(x, bool) for x in pr)):
                    raise GraphError(f"node {i}: pair {pr!r} is not two integers")
                r, v = pr
                if r < 0 or v < 0:
                    raise GraphError(f"node {i}: negative rank in {pr}")
                if limit is not None and r >= limit:
                    raise GraphError(f"node {i}: position rank {r} is out of range for block size {limit}")
                if v >= MAX_VOCAB_RANK:
                    raise GraphError(f"node {i}: vocabulary rank {v} exceeds the maximum {MAX_VOCAB_RANK - 1}")
                if r in seen:
                    raise GraphError(f"node {i}: position rank {r} appears twice")
                seen.add(r)
            if limit is not None and len(n.pairs) > limit:
                raise GraphError(f"node {i}: unmasks {len(n.pairs)} positions, more than block size {limit}")

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict:
        return {"version": self.version,
                "nodes": [{"parent": n.parent, "pairs": [list(p) for p in n.pairs]} for n in self.nodes],
                "meta": self.meta}

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @classmethod
    def from_dict(cls, d) -> "DraftGraph":
        if not isinstance(d, dict):
            raise GraphError(f"a draft graph is a JSON object, got {type(d).__name__}")
        if "version" not in d:
            raise GraphError("the draft graph has no 'version' field (not a specfold draft graph?)")
        if d["version"] != VERSION:
            raise GraphError(f"draft graph version {d['version']!r} is not supported (this specfold reads "
                             f"version {VERSION}); recalibrate it with `specfold calibrate`")
        nodes_raw, meta = d.get("nodes"), d.get("meta", {})
        if not isinstance(nodes_raw, list):
            raise GraphError("the draft graph's 'nodes' must be a list")
        if not isinstance(meta, dict):
            raise GraphError("the draft graph's 'meta' must be an object")
        nodes = []
        for i, n in enumerate(nodes_raw, start=1):
            if not isinstance(n, dict) or set(n) - {"parent", "pairs", "count"} or "parent" not in n \
                    or "pairs" not in n or not isinstance(n["pairs"], list):
                raise GraphError(f"node {i}: expected {{'parent': int, 'pairs': [[position rank, vocabulary "
                                 f"rank], ...]}}, got {n!r}")
            bad = [p for p in n["pairs"] if not (isinstance(p, list) and len(p) == 2 and all(
                isinstance(x, int) and not isinstance(x, bool) for x in p))]
            if bad:
                raise GraphError(f"node {i}: pair {bad[0]!r} is not [position rank, vocabulary rank] "
                                 f"(two integers)")
            pairs = tuple(sorted(tuple(p) for p in n["pairs"]))
            nodes.append(Node(n["parent"], pairs))
        return cls(nodes, meta, d["version"])

    @classmethod
    def load(cls, path: str | os.PathLike) -> "DraftGraph":
        path = Path(path)
        if not path.is_file():
            raise GraphError(f"draft graph file {str(path)!r} does not exist")
        try:
            d = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise GraphError(f"draft graph file {str(path)!r} is not valid JSON: {e}") from None
        try:
            return cls.from_dict(d)
        except GraphError as e:
            raise GraphError(f"{path}: {e}") from None

    # ------------------------------------------------------------------ realization
    def realize(self, root: list[int], parent: Step | None, ctx: BlockContext,
                limit: int | None = None) -> list[Draft]:
        """Block states of the (first `limit`) nodes, filled from the parent step's ranking and scores.

        Duplicate states (and states equal to the root) are dropped; a dropped node's children hang
        from the branch holding its state. Draft.node = graph node index (1-based)."""
        if parent is None or len(parent.scored.conf) + (len(parent.ahead.conf) if parent.ahead else 0) == 0:
            return []
        N = len(root)
        W = max(ctx.width, N)
        allowed = ctx.window_allowed if ctx.window_allowed is not None else ctx.allowed
        order, src = fill_order(parent, N if ctx.seed_token else None)
        order = [p for p in order if p < W and (p < N or allowed[p])]
        M = ctx.mask_id
        edits = not getattr(ctx.rule, "monotone", True)
        root = list(root)
        if order and max(order) >= N:  # eager: the drafts reach into the next block
            root = root + [M] * (W - N)
        states: list[list[int] | None] = [root]
        branch_of: list[int] = [0]  # node -> verification branch index
        seen = {tuple(root): 0}
        drafts: list[Draft] = []
        nodes = self.nodes if limit is None else self.nodes[:limit]
        for i, n in enumerate(nodes, start=1):
            base = states[n.parent]
            st = None if base is None else _fill(base, order, src, n.pairs, M, edits)
            states.append(st)
            if st is None:
                branch_of.append(-1)
                continue
            key = tuple(st)
            if key in seen:
                branch_of.append(seen[key])
                continue
            drafts.append(Draft(st, branch_of[n.parent], i))
            seen[key] = len(drafts)
            branch_of.append(len(drafts))
        return drafts


def fillable(order: list[int], src: dict, base: list[int], M: int, edits: bool = False) -> list[int]:
    """The positions of `order` a draft may still write in `base`: its masks, then (`edits`: a
    non-monotone rule) its written positions whose parent-step argmax differs from the token there."""
    masks = [p for p in order if base[p] == M]
    if not edits:
        return masks
    return masks + [p for p in order if base[p] != M and src[p][0].tokens[src[p][1]] != base[p]]


def _fill(base: list[int], order: list[int], src: dict, pairs, M: int, edits: bool = False) -> list[int] | None:
    """`base` with each (position rank, vocabulary rank) pair filled; None if a rank runs past."""
    avail = fillable(order, src, base, M, edits)
    st = list(base)
    for r, v in pairs:
        if r >= len(avail):
            return None
        p = avail[r]
        sc, row = src[p]
        if v == 0:
            st[p] = sc.tokens[row]
        elif sc.top is not None and v < len(sc.top[row]):
            st[p] = sc.top[row][v]
        else:
            return None
    return st


def load_graph(graph) -> DraftGraph:
    """A DraftGraph, a dict or a path to a JSON file -> DraftGraph."""
    if isinstance(graph, DraftGraph):
        return graph
    if isinstance(graph, dict):
        return DraftGraph.from_dict(graph)
    if isinstance(graph, (str, os.PathLike)):
        return DraftGraph.load(graph)
    raise GraphError(f"graph must be a path, a dict or a DraftGraph, got {type(graph).__name__}")
