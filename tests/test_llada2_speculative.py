"""Lossless speculation on LLaDA2 (float64, a random LLaDA2 checkpoint): FreeDave, Spiffy (a hand-made
graph and a graph calibrated per rule with `calibrate`) and SpecFold at δ = 0 (both draft policies)
give vanilla's tokens, which are the cache-free reference's, under llada2 and llada2_edit (fast and
quality settings), one request at a time and in a batch, never with more forwards.

Drafts under llada2_edit may contain edits (decoding/drafts/graph.py `fillable`): the unit tests
below check what a chain and a calibration make of the parent's suggested edits.
"""
from __future__ import annotations

import pytest
import torch

from specfold import LLM, DecodeParams
from specfold.decoding.drafts.calibrate import calibrate, count_patterns
from specfold.decoding.drafts.graph import DraftGraph, Node
from specfold.decoding.plugins import BlockContext, Step
from specfold.decoding.rules import Scored, make_rule
from tests import llada2_checkpoint as C
from tests.llada2_reference import reference_decode

BLOCK = 8
RULES = {  # name -> rule settings
    "llada2": dict(rule="llada2", steps=8, threshold=0.9),
    "edit_fast": dict(rule="llada2_edit", threshold=0.5, edit_threshold=0.0, max_post_steps=4),
    "edit_quality": dict(rule="llada2_edit", threshold=0.7, edit_threshold=0.5, max_post_steps=16),
}
MIXED = DraftGraph([Node(0, ((0, 0),)), Node(1, ((0, 0),)), Node(0, ((1, 0),)), Node(0, ((0, 1),)),
                    Node(2, ((0, 0), (1, 0))), Node(0, ((0, 0), (1, 0))), Node(3, ((0, 0),)), Node(4, ((2, 1),))])


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder, cfg, w = C.make(tmp_path_factory.mktemp("l2spec") / "ckpt", seed=0, head_scale=4.0, eos_boost=1.0)
    llm = LLM(folder, dtype="float64", overrides=C.overrides(cfg))
    V = cfg["vocab_size"]
    prompts = [torch.randint(0, V - 2, (L,), generator=torch.Generator().manual_seed(L)).tolist() for L in (13, 16, 5)]
    cal = [torch.randint(0, V - 2, (L,), generator=torch.Generator().manual_seed(100 + L)).tolist()
           for L in (3, 7, 9, 12, 18, 20)]
    return llm, cfg, w, prompts, cal


@pytest.mark.parametrize("name", [n if n == "llada2" else pytest.param(n, marks=pytest.mark.slow) for n in RULES])
def test_lossless_under_both_rules(setup, name):
    llm, cfg, w, prompts, cal = setup
    base = DecodeParams(block_size=BLOCK, max_new_tokens=22, draft_budget=64, **RULES[name])
    graph = calibrate(llm, cal, base, branches=7)
    assert graph.meta["rule"] == RULES[name]["rule"] and len(graph) == 7
    van = llm.generate(prompts, base)
    M, eos = llm.spec.mask_token_id, llm.spec.stop_token_ids[0]
    kw = {k: v for k, v in RULES[name].items() if k != "rule"}
    for p, v in zip(prompts, van):
        ref, _ = reference_decode(w, cfg, p, rule=RULES[name]["rule"], max_new_tokens=22, mask_id=M, eos_id=eos,
                                  block=BLOCK, **kw)
        assert v.token_ids == ref
    settings = [dict(method="freedave", draft_depth=1), dict(method="freedave", draft_depth=4),
                dict(method="spiffy", branches=8, graph=MIXED), dict(method="spiffy", branches=7, graph=graph),
                dict(method="specfold", delta=0.0, drafts="freedave", draft_depth=4),
                dict(method="specfold", delta=0.0, drafts="spiffy", branches=7, graph=graph)]
    saved = 0
    for s in settings:
        batch = llm.generate(prompts, base.replace(**s))
        for p, v, b in zip(prompts, van, batch):
            alone = llm.generate([p], base.replace(**s))[0]
            assert alone.token_ids == b.token_ids == v.token_ids, (s, p)
            assert alone.finish_reason == b.finish_reason == v.finish_reason
            assert b.stats.nfe <= v.stats.nfe, (s, b.stats.nfe, v.stats.nfe)
            if s == settings[0]:  # depth 1: no drafts, vanilla's forwards
                assert b.stats.nfe == v.stats.nfe
            saved += v.stats.nfe - b.stats.nfe
    if name != "edit_fast":  # random weights: every fast-mode step edits tokens no draft predicts
        assert saved > 0


@pytest.mark.parametrize("name", ["llada2", "edit_quality"])
def test_lossless_at_temperature_for_a_fixed_seed(setup, name):
    """T > 0: a row's noise is keyed by its exact block state, so drafts (and revisited 2.1 states)
    change nothing, alone or in a batch."""
    llm, _, _, prompts, _ = setup
    base = DecodeParams(block_size=BLOCK, max_new_tokens=16, draft_budget=64, temperature=0.8, seed=5, **RULES[name])
    van = llm.generate(prompts, base)
    for s in (dict(method="freedave", draft_depth=4), dict(method="spiffy", branches=8, graph=MIXED)):
        assert [o.token_ids for o in llm.generate(prompts, base.replace(**s))] == [v.token_ids for v in van]
    assert [llm.generate([p], base)[0].token_ids for p in prompts] == [v.token_ids for v in van]


def _ctx(rule, allowed):
    return BlockContext(start=0, allowed=allowed, block_origin=0, mask_id=9, rule=rule, step=1, masks_at_start=3,
                        width=len(allowed), window_allowed=allowed)


def test_a_chain_under_llada2_edit_fills_masks_then_applies_suggested_edits():
    """Parent scores over the block: positions 0-3 written (0 is prompt, not scored), 4-5 masked.
    The root keeps 1 and 3 as written while the parent's argmax there differs (suggested edits that
    did not pass tau_edit); a chain fills the masks in confidence order first, then the edits."""
    M = 9
    edit, mono = make_rule(DecodeParams(rule="llada2_edit").split()[0]), make_rule(DecodeParams(rule="llada2").split()[0])
    allowed = [False, True, True, True, True, True]
    parent = Step(state=[1, 2, 3, 4, M, M], scored=Scored([1, 2, 3, 4, 5], [5, 3, 6, 7, 8], [0.4, 0.9, 0.3, 0.6, 0.8],
                                                           [[5, 0], [3, 0], [6, 0], [7, 0], [8, 0]]),
                  next=[1, 2, 3, 4, M, 8], region=allowed)
    root = [1, 2, 3, 4, M, 8]  # 5 committed; 1 (2 -> 5) and 3 (4 -> 6) suggested, 2 agrees, 4 is the mask
    chain = DraftGraph.chain(4)
    got = [d.tokens for d in chain.realize(root, parent, _ctx(edit, allowed))]
    # fill order by parent confidence: 2 (0.9), 5, 4 (mask), 1 (0.4, edit), 3 (0.3, edit)
    assert got == [[1, 2, 3, 4, 7, 8], [1, 5, 3, 4, 7, 8], [1, 5, 3, 6, 7, 8]]
    assert [d.tokens for d in chain.realize(root, parent, _ctx(mono, allowed))] == [[1, 2, 3, 4, 7, 8]]
    # a post step (no mask left): the drafts are the suggested edits, most confident first
    full = [1, 2, 3, 4, 7, 8]
    assert [d.tokens for d in chain.realize(full, parent, _ctx(edit, allowed))] == [[1, 5, 3, 4, 7, 8],
                                                                                   [1, 5, 3, 6, 7, 8]]


def test_calibration_expresses_suggested_edits_only_for_an_editing_rule():
    M = 9
    parent = Step(state=[1, 2, M, M], scored=Scored([0, 1, 2, 3], [1, 5, 6, 7], [0.9, 0.4, 0.8, 0.3],
                                                    [[1, 0], [5, 0], [6, 0], [7, 0]]),
                  next=[1, 2, 6, M], region=[True] * 4)
    step = Step(state=[1, 2, 6, M], scored=parent.scored, next=[1, 5, 6, 7], region=[True] * 4)  # edit 1, commit 3
    counts, roots = count_patterns([[parent, step]], M, edits=True)
    assert roots == 1 and counts == {(((0, 0), (1, 0)),): 1}  # mask 3 is rank 0, edit 1 is rank 1 (after masks)
    counts, _ = count_patterns([[parent, step]], M, edits=False)
    assert counts == {}  # a monotone rule never rewrites: not expressible


def test_eager_is_refused_for_llada2_rules(setup):
    from specfold.errors import ParamsError
    llm = setup[0]
    for rule in ("llada2", "llada2_edit"):
        with pytest.raises(ParamsError, match="eager"):
            DecodeParams(rule=rule, eager=True, method="freedave").resolve(llm.spec)
