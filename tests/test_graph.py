"""Draft graph files: round trip, rejection of malformed / wrong-version / mismatched graphs, defaults."""
from __future__ import annotations

import json

import pytest

from specfold import LLM, DecodeParams
from specfold.decoding.drafts.calibrate import count_patterns, read_prompts, select
from specfold.decoding.drafts.graph import DraftGraph, GraphError, Node, load_graph
from specfold.errors import ConfigError, ParamsError

GOOD = {"version": 1, "nodes": [{"parent": 0, "pairs": [[0, 0]]}, {"parent": 1, "pairs": [[0, 0], [2, 1]]},
                                {"parent": 0, "pairs": [[1, 0]]}], "meta": {"block_size": 8, "rule": "threshold"}}


def test_round_trip(tmp_path):
    g = DraftGraph.from_dict(GOOD)
    path = g.save(tmp_path / "g.json")
    back = DraftGraph.load(path)
    assert back.nodes == g.nodes and back.meta == g.meta and back.version == 1
    assert json.loads(path.read_text())["version"] == 1
    assert load_graph(str(path)).nodes == g.nodes and load_graph(GOOD).nodes == g.nodes
    assert back.topk == 2 and len(back.first(2)) == 2
    chain = DraftGraph.chain(3)
    assert [n.parent for n in chain.nodes] == [0, 1, 2] and DraftGraph.from_dict(chain.to_dict()).nodes == chain.nodes


def _bad(**change):
    d = json.loads(json.dumps(GOOD))
    for k, v in change.items():
        if k == "node":
            d["nodes"][1] = v
        else:
            d[k] = v
    return d


@pytest.mark.parametrize("d,match", [
    (_bad(version=2), "version 2 is not supported"),
    ({k: v for k, v in GOOD.items() if k != "version"}, "no 'version'"),
    (_bad(nodes={"a": 1}), "must be a list"),
    (_bad(nodes=[]), "at least one node"),
    (_bad(node={"parent": 2, "pairs": [[0, 0]]}), "parent 2 must be an earlier node"),
    (_bad(node={"parent": -1, "pairs": [[0, 0]]}), "parent -1"),
    (_bad(node={"parent": "0", "pairs": [[0, 0]]}), "parent '0'"),
    (_bad(node={"parent": 0, "pairs": []}), "at least one"),
    (_bad(node={"parent": 0, "pairs": [[0]]}), "not \\[position rank, vocabulary rank\\]"),
    (_bad(node={"parent": 0, "pairs": [[0, "x"]]}), "two integers"),
    (_bad(node={"parent": 0, "pairs": [[8, 0]]}), "position rank 8 is out of range for block size 8"),
    (_bad(node={"parent": 0, "pairs": [[0, 9]]}), "vocabulary rank 9"),
    (_bad(node={"parent": 0, "pairs": [[1, 0], [1, 1]]}), "appears twice"),
    (_bad(node={"parent": 0}), "expected"),
    (_bad(nodes=[{"parent": i, "pairs": [[0, 0]]} for i in range(65)]), "at most 64"),
    ([1, 2], "JSON object"),
])
def test_rejects_bad_graphs(d, match):
    with pytest.raises(GraphError, match=match):
        DraftGraph.from_dict(d)


def test_rejects_bad_files(tmp_path):
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(GraphError, match="not valid JSON"):
        DraftGraph.load(tmp_path / "x.json")
    with pytest.raises(GraphError, match="does not exist"):
        DraftGraph.load(tmp_path / "missing.json")
    (tmp_path / "v.json").write_text(json.dumps(_bad(version=0)))
    with pytest.raises(GraphError, match="v.json.*version 0"):
        DraftGraph.load(tmp_path / "v.json")
    assert issubclass(GraphError, ConfigError)
    with pytest.raises(GraphError, match="has 3 nodes; branches=5"):
        DraftGraph.from_dict(GOOD).first(5)


def test_mismatched_graph_rejected_by_spiffy(checkpoint):
    llm = LLM(checkpoint("qwen2", block_size=4), dtype="float64")
    g = DraftGraph([Node(0, ((5, 0),))])  # rank 5 cannot exist in a block of 4
    with pytest.raises(GraphError, match="out of range for block size 4"):
        llm.generate([[1, 2, 3]], DecodeParams(method="spiffy", branches=1, graph=g, max_new_tokens=4))
    with pytest.raises(GraphError, match="branches=3"):
        llm.generate([[1, 2, 3]], DecodeParams(method="spiffy", branches=3, graph=DraftGraph.chain(2),
                                               max_new_tokens=4))
    with pytest.raises(GraphError, match="needs a draft graph.*specfold calibrate"):
        llm.generate([[1, 2, 3]], DecodeParams(method="spiffy", max_new_tokens=4))


def test_selection_degree1_parents_first():
    a, b = ((0, 0),), ((1, 0),)
    from collections import Counter
    counts = Counter({(a,): 90, (a, a): 80, (b,): 5, (a, a, a): 70, (b, a): 5})
    nodes, got = select(counts, 100, 3)
    assert nodes == [Node(0, a), Node(1, a), Node(2, a)] and got == [90, 80, 70]
    nodes, _ = select(Counter({(b,): 3}), 10, 3)  # too few patterns: completed with a FreeDave chain
    assert nodes[0] == Node(0, b) and nodes[1:] == [Node(0, a), Node(2, a)]
    assert count_patterns([], 95) == (Counter(), 0)


def test_read_prompts(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"prompt": "a b"}\n{"question": "c", "answer": "d"}\n\nplain line\n')
    assert read_prompts(tmp_path / "p.jsonl") == ["a b", "c", "plain line"]


def test_realize_ranks_relative_to_parent_node():
    from specfold.decoding.plugins import BlockContext, Step
    from specfold.decoding.rules import Scored
    M = 9
    root = [1, M, M, M, M]  # the parent step unmasked position 0
    sc = Scored([0, 1, 2, 3, 4], [1, 2, 3, 4, 5], [0.9, 0.5, 0.7, 0.6, 0.1], [[1, 0], [2, 7], [3, 7], [4, 7], [5, 7]])
    parent = Step([M] * 5, sc, root, [True] * 5)
    ctx = BlockContext(start=0, allowed=[True] * 5, block_origin=0, mask_id=M, rule=None, step=1, masks_at_start=5)
    g = DraftGraph([Node(0, ((0, 0),)), Node(1, ((0, 1),)), Node(0, ((0, 0),)), Node(0, ((4, 0),))])
    d = g.realize(root, parent, ctx)
    # ranking among root's masks: 2 (0.7), 3 (0.6), 1 (0.5), 4 (0.1)
    assert d[0].tokens == [1, M, 3, M, M] and d[0].parent == 0 and d[0].node == 1
    assert d[1].tokens == [1, M, 3, 7, M] and d[1].parent == 1  # rank 0 among node 1's masks, 2nd token
    assert len(d) == 2  # node 3 duplicates node 1; node 4's rank 4 does not exist
    assert g.realize(root, None, ctx) == []


def test_selection_by_count_alone():
    from collections import Counter
    a, b = ((0, 0),), ((1, 1),)
    counts = Counter({(a,): 90, (a, a): 60, (a, a, a): 20, (a, b): 2, (b,): 30})
    deg1, _ = select(counts, 100, 3)
    assert deg1 == [Node(0, a), Node(1, a), Node(1, b)]  # (a, b): 2 + 90 beats (a, a, a): 20 + 60
    cnt, _ = select(counts, 100, 3, "count")
    assert cnt == [Node(0, a), Node(1, a), Node(0, b)]


def test_realize_crosses_into_the_look_ahead_region():
    """A node may complete the parent's region (the sub-block) and go on in the region the rule reads
    next (`Step.ahead`), ranked by its own confidences; the fill order puts the region first."""
    from specfold.decoding.drafts.graph import fill_order
    from specfold.decoding.plugins import BlockContext, Step
    from specfold.decoding.rules import Scored
    M = 9
    parent_state = [M] * 8
    root = [1, 2, 3, M, M, M, M, M]  # the parent step unmasked 0..2; position 3 is left
    sc = Scored([0, 1, 2, 3], [1, 2, 3, 4], [0.9, 0.95, 0.97, 0.5], [[1, 0], [2, 0], [3, 0], [4, 8]])
    ahead = Scored([4, 5, 6, 7], [5, 6, 7, 8], [0.2, 0.8, 0.6, 0.1], [[5, 0], [6, 1], [7, 2], [8, 3]])
    region = [True] * 4 + [False] * 4
    parent = Step(parent_state, sc, root, region, ahead)
    order, src = fill_order(parent)
    assert order == [2, 1, 0, 3, 5, 6, 4, 7]
    assert src[6][0] is ahead and src[6][1] == 2 and src[3][0] is sc
    ctx = BlockContext(start=0, allowed=[True] * 8, block_origin=0, mask_id=M, rule=None, step=1, masks_at_start=8)
    g = DraftGraph([Node(0, ((0, 0),)), Node(1, ((0, 0),)), Node(1, ((1, 1),)), Node(0, ((0, 0), (1, 0)))])
    d = g.realize(root, parent, ctx)
    assert d[0].tokens == [1, 2, 3, 4, M, M, M, M]  # completes the sub-block
    assert d[1].tokens == [1, 2, 3, 4, M, 6, M, M] and d[1].parent == 1  # starts the next one
    assert d[2].tokens == [1, 2, 3, 4, M, M, 2, M]  # 2nd ahead position, 2nd most likely token
    assert len(d) == 3  # node 4 (two positions at once) is the state of node 2: dropped as a duplicate
    # without look-ahead material the chain stops at the sub-block's end
    alone = g.realize(root, Step(parent_state, sc, root, region, None), ctx)
    assert [x.tokens for x in alone] == [[1, 2, 3, 4, M, M, M, M]]
    # seed-token families: a later block's first position leads the look-ahead
    seeded = Step(parent_state, sc, root, region, Scored([8, 9], [1, 1], [0.1, 0.9]))
    assert fill_order(seeded, 8)[0][4:] == [8, 9] and fill_order(seeded)[0][4:] == [9, 8]


def test_graph_depth_keeps_the_shallow_nodes_in_order():
    """`to_depth(D)` = what greedy selection picks when paths deeper than D are not counted; the
    `graph_depth` setting applies it before taking the first `branches` nodes."""
    from collections import Counter
    a, b, c = ((0, 0),), ((1, 0),), ((0, 1),)
    counts = Counter({(a,): 90, (a, a): 60, (a, a, a): 40, (b,): 30, (a, b): 20, (c,): 10, (b, a): 5})
    full = DraftGraph(select(counts, 100, 7)[0])
    for depth in (1, 2, 3):
        shallow = Counter({k: v for k, v in counts.items() if len(k) <= depth})
        n = sum(1 for k in shallow)
        assert full.to_depth(depth).nodes == select(shallow, 100, n)[0], depth
    assert max(full.to_depth(2).depths()) == 2 and full.depths() == [1, 2, 2, 3, 1, 2, 1]
    with pytest.raises(GraphError, match="no node at depth"):
        DraftGraph([Node(0, a)]).to_depth(0)


def test_graph_depth_setting(checkpoint):
    llm = LLM(checkpoint("qwen2", block_size=8), dtype="float64")
    g = DraftGraph([Node(0, ((0, 0),)), Node(1, ((0, 0),)), Node(0, ((1, 0),)), Node(2, ((0, 0),))])
    from specfold.decoding.drafts.spiffy import make_policy
    p = DecodeParams(method="spiffy", graph=g, branches=2, graph_depth=1).resolve(llm.spec)
    assert make_policy(llm.spec, p).graph.nodes == [Node(0, ((0, 0),)), Node(0, ((1, 0),))]
    with pytest.raises(GraphError, match="2 nodes at depth <= 1; branches=3"):
        make_policy(llm.spec, p.replace(branches=3))
    with pytest.raises(ParamsError, match="graph_depth must be in"):
        DecodeParams(graph_depth=0)


def test_calibrate_max_depth(checkpoint):
    """`calibrate(..., max_depth=D)`: no node deeper than D (the FreeDave completion too), and the
    greedy picks of depth <= D come first in the unlimited graph as well (`to_depth`)."""
    from specfold.decoding.drafts.calibrate import calibrate
    from specfold.errors import ParamsError
    llm = LLM(checkpoint("qwen2", peaked=30.0, block_size=8), dtype="float64")
    base = DecodeParams(rule="static", max_new_tokens=16, early_stop=False)
    cal = [[40 + i, 41, 42 + i] for i in range(4)]
    for d in (1, 2):
        g = calibrate(llm, cal, base, branches=6, max_depth=d)
        assert max(g.depths()) <= d and g.meta["max_depth"] == d
        deep = calibrate(llm, cal, base, branches=24)
        shallow = deep.to_depth(d).nodes
        assert g.nodes[: len(shallow)] == shallow[: len(g.nodes)]
    with pytest.raises(ParamsError, match="max_depth must be in"):
        calibrate(llm, cal, base, branches=3, max_depth=0)
