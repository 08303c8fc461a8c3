"""Spiffy graph calibration (SPEC §5): replay vanilla decoding, count rank patterns, pick B nodes.

For every main-trajectory root s_t of a block (one that has a parent step s_{t-1} -> s_t with logits
p), walk the following transitions s_t -> s_{t+1} -> ... and express each one as a pattern: the set of
(position rank, vocabulary rank) pairs of the positions it unmasks, ranks taken in p (position rank
in p's fill order, `graph.fill_order`, among the positions still masked before the transition;
vocabulary rank of the chosen token in p's top-k). The fill order runs on into the region the rule
reads next (the next sub-block), so patterns that cross the sub-block boundary are recorded, and
sub-block first steps are roots too. The path of patterns from the root is a candidate node whose
parent is the path without its last pattern; its count is how often the trajectory followed it. A
transition not expressible in p (a position outside p's fill order, a token beyond the top-k) ends
the walk. Under a non-monotone rule (LLaDA2.1) a transition's edits are expressible too when they
apply the edits p suggests (`graph.fillable`: ranks after the masks).

Nodes are picked greedily by degree-1 accumulation: among the candidates whose parent is already in
the graph (the root's children first), take the one with the highest count + its parent's count (the
root counts 0), so a frequent continuation of a frequent node wins over a rare sibling; nodes are
thus listed parents first and the first B of a graph form a graph. If fewer than B patterns occurred, the
graph is completed with a FreeDave chain so it always has B nodes.

`calibrate(llm, prompts, params, branches) -> DraftGraph`; `specfold calibrate` (calibrate_cli.py)
wraps it, and tiny/graphs.py remakes the shipped graphs of the tiny model with it.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Sequence

from specfold.decoding.drafts.graph import MAX_NODES, DraftGraph, Node, fill_order, fillable
from specfold.decoding.plugins import BlockContext, DraftPolicy, Step
from specfold.errors import ParamsError
from specfold.models.spec import fingerprint
from specfold.params import DecodeParams
from specfold.text import read_text_lines

TOPK = 4  # vocabulary ranks considered
MAX_DEPTH = 8  # transitions followed from a root


class _Recorder(DraftPolicy):
    """No drafts (vanilla); records every block's steps."""
    name = "calibrate"
    topk = TOPK
    reads_ahead = True

    def __init__(self):
        self.blocks: list[list[Step]] = []
        self.edits = False  # the rule rewrites written tokens (patterns may contain edits)

    def on_step(self, step: Step, ctx: BlockContext) -> None:
        self.edits = self.edits or not getattr(ctx.rule, "monotone", True)
        if ctx.step == 0:
            self.blocks.append([])
        self.blocks[-1].append(step)


def _pattern(order: list[int], src: dict, cur: list[int], nxt: list[int], mask_id: int, edits: bool = False):
    avail = fillable(order, src, cur, mask_id, edits)
    rank_of = {pos: r for r, pos in enumerate(avail)}
    pairs = []
    for pos in (i for i, (a, b) in enumerate(zip(cur, nxt)) if a != b):
        if pos not in rank_of:
            return None
        sc, i = src[pos]
        row = sc.top[i]
        tok = nxt[pos]
        if tok not in row:
            return None
        pairs.append((rank_of[pos], row.index(tok)))
    return tuple(sorted(pairs)) if pairs else None


def count_patterns(blocks: list[list[Step]], mask_id: int, max_depth: int = MAX_DEPTH,
                   edits: bool = False) -> tuple[Counter, int]:
    """Pattern paths from every root and the number of roots; `edits`: a non-monotone rule, whose
    transitions may apply the parent's suggested edits (graph.fillable)."""
    counts: Counter = Counter()
    roots = 0
    for steps in blocks:
        for t in range(1, len(steps)):
            order, src = fill_order(steps[t - 1])
            roots += 1
            path: tuple = ()
            for k in range(t, min(len(steps), t + max_depth)):
                pat = _pattern(order, src, steps[k].state, steps[k].next, mask_id, edits)
                if pat is None:
                    break
                path += (pat,)
                counts[path] += 1
    return counts, roots


SELECTIONS = ("degree1", "count")


def select(counts: Counter, roots: int, branches: int, selection: str = "degree1",
           max_depth: int | None = None) -> tuple[list[Node], list[int]]:
    """Greedy among the candidates whose parent is already chosen, by degree-1 accumulation (count +
    parent's count; the default, as Spiffy) or by the count alone (`selection="count"`: the expected
    hits of the node itself)."""
    if selection not in SELECTIONS:
        raise ParamsError(f"selection={selection!r}; accepted: {SELECTIONS}")

    def score(path):
        if selection == "count":
            return counts[path]
        return counts[path] + (counts[path[:-1]] if len(path) > 1 else 0)
    children: dict[tuple, list[tuple]] = {}
    for path in counts:
        children.setdefault(path[:-1], []).append(path)
    chosen: list[tuple] = []
    index = {(): 0}
    frontier = list(children.get((), []))
    while frontier and len(chosen) < branches:
        best = min(frontier, key=lambda q: (-score(q), len(q), q))
        frontier.remove(best)
        index[best] = len(chosen) + 1
        chosen.append(best)
        frontier += children.get(best, [])
    step = ((0, 0),)  # one argmax position, next in rank
    chain = (step,)
    while len(chosen) < branches and (max_depth is None or len(chain) <= max_depth):
        # too few patterns seen: complete with a FreeDave chain (no deeper than max_depth)
        if chain not in index:
            index[chain] = len(chosen) + 1
            chosen.append(chain)
        chain = chain + (step,)
    nodes = [Node(index[q[:-1]], q[-1]) for q in chosen]
    return nodes, [counts.get(q, 0) for q in chosen]


def calibrate(llm, prompts: Sequence, params: DecodeParams | None = None, branches: int = 7,
              selection: str = "degree1", max_depth: int = MAX_DEPTH) -> DraftGraph:
    """Replay vanilla decoding of `prompts` (strings or token-id lists) with `params`' rule and return
    a draft graph of `branches` nodes, none deeper than `max_depth` (a graph of depth D at fixed B)."""
    if not 1 <= branches <= MAX_NODES:
        raise ParamsError(f"branches must be in [1, {MAX_NODES}], got {branches}")
    if not prompts:
        raise ParamsError("calibration needs at least one prompt")
    if not 1 <= max_depth <= MAX_DEPTH:
        raise ParamsError(f"max_depth must be in [1, {MAX_DEPTH}], got {max_depth}")
    params = (params or DecodeParams()).replace(method="vanilla", temperature=0.0)
    dec = llm.decoder(params)
    rec = _Recorder()
    dec.policy = rec
    for pr in prompts:
        dec.run(llm.encode(pr, params))
    counts, roots = count_patterns(rec.blocks, llm.spec.mask_token_id, max_depth, rec.edits)
    nodes, node_counts = select(counts, roots, branches, selection, max_depth)
    rp = dec.config
    meta = {"model": fingerprint(llm.spec), "rule": rp.rule, "threshold": rp.threshold, "block_size": rp.block_size,
            "sub_block_size": rp.sub_block_size, "prompts": len(prompts), "roots": roots, "selection": selection, "max_depth": max_depth,
            "counts": node_counts, "hit_rate_estimate": [c / roots if roots else 0.0 for c in node_counts]}
    return DraftGraph(nodes, meta)


def read_prompts(path: str | Path) -> list[str]:
    """JSON Lines with a "prompt" or "question" field per line, or plain text (one prompt per line)."""
    lines = read_text_lines(path, "--prompts")
    out = []
    for i, ln in enumerate(lines, start=1):
        if ln.lstrip().startswith("{"):
            try:
                row = json.loads(ln)
            except json.JSONDecodeError as e:
                raise ParamsError(f"{path}:{i}: not valid JSON: {e}") from None
            text = row.get("prompt", row.get("question"))
            if not isinstance(text, str):
                raise ParamsError(f"{path}:{i}: a JSON line needs a 'prompt' or 'question' string")
            out.append(text)
        else:
            out.append(ln)
    return out
