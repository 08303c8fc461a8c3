"""Lossless speculative decoding (SPEC §5): FreeDave, FreeDave++, eager, Spiffy give vanilla's tokens.

float64 on the CPU, random checkpoints (block-causal and bidirectional, with and without logits shift)
and peaked ones (scaled head: confident predictions, so drafts are accepted and NFE drops).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.cache_helpers import released_caches

from specfold import LLM, DecodeParams
from specfold.decoding.drafts.calibrate import _Recorder as _CalRecorder
from specfold.decoding.drafts.calibrate import calibrate, count_patterns
from specfold.decoding.drafts.graph import DraftGraph, Node
from specfold.decoding.plugins import Draft, DraftPolicy, Step

PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15, 16], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]]
RULES = {"static": {}, "threshold": {"threshold": 0.6}, "sub_block": {"threshold": 0.6}}
# a hand-made graph exercising branching, vocabulary ranks > 0 and multi-position nodes
MIXED = DraftGraph([Node(0, ((0, 0),)), Node(1, ((0, 0),)), Node(0, ((1, 0),)), Node(0, ((0, 1),)),
                    Node(2, ((0, 0), (1, 0))), Node(0, ((0, 0), (1, 0))), Node(3, ((0, 0),)), Node(4, ((2, 1),))])

MODELS = {  # name -> (checkpoint kwargs); block 8, sub-block 4
    "bc": dict(attention="block_causal"),
    "bc_shift": dict(attention="block_causal", logits_shift=True, seed_token=True),
    "bi": dict(attention="bidirectional"),
    "bi_shift": dict(attention="bidirectional", logits_shift=True),
}


def _llm(checkpoint, name, peaked=0.0):
    return LLM(checkpoint("qwen2", peaked=peaked, block_size=8, sub_block_size=4, **MODELS[name]), dtype="float64")


def _key(kw: dict) -> str:
    return ",".join(f"{k}={'graph' if k == 'graph' else v}" for k, v in sorted(kw.items()))


def _check(llm, base, settings, prompts=PROMPTS):
    """Every setting gives vanilla's ids and never more forwards; returns total NFEs per setting."""
    van = llm.generate(prompts, base)
    totals = {"vanilla": sum(o.stats.nfe for o in van)}
    for kw in settings:
        if kw.get("eager") and llm.spec.attention != "block_causal":
            continue
        outs = llm.generate(prompts, base.replace(**kw))
        for v, o, pr in zip(van, outs, prompts):
            assert o.token_ids == v.token_ids, (kw, pr)
            assert o.finish_reason == v.finish_reason
            assert o.stats.nfe <= v.stats.nfe, (kw, pr, o.stats.nfe, v.stats.nfe)
            if kw.get("method") == "freedave" and kw.get("draft_depth") == 1:
                assert o.stats.nfe == v.stats.nfe
        totals[_key(kw)] = sum(o.stats.nfe for o in outs)
    return totals


SETTINGS = ([dict(method="freedave", draft_depth=d) for d in (1, 3, 8)]
            + [dict(method="freedave", draft_depth=8, eager=True)]
            + [dict(method="spiffy", branches=b, graph=MIXED) for b in (1, 8)]
            + [dict(method="spiffy", branches=8, graph=MIXED, eager=True)])


@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("name", list(MODELS))
def test_lossless_random(checkpoint, name, rule):
    llm = _llm(checkpoint, name)
    base = DecodeParams(draft_budget=64, rule=rule, max_new_tokens=16, **RULES[rule])
    _check(llm, base, SETTINGS)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bc", "bi", "bc_shift"])
def test_lossless_peaked_and_drafts_accepted(checkpoint, name):
    """Confident models: every setting is lossless and the speculative ones really save forwards.
    (With a logits shift, unmasking position j rewrites the random model's prediction at j+1, so the
    argmax chain rarely survives there: only the best setting must save forwards.)"""
    llm = _llm(checkpoint, name, peaked=30.0)
    for rule in RULES:
        base = DecodeParams(draft_budget=64, rule=rule, max_new_tokens=24, early_stop=False, **RULES[rule])
        settings = ([dict(method="freedave", draft_depth=d) for d in (2, 8)]
                    + [dict(method="freedave", draft_depth=8, eager=True)]
                    + [dict(method="spiffy", branches=b, graph=MIXED) for b in (2, 7)]
                    + [dict(method="spiffy", branches=7, graph=MIXED, eager=True)])
        totals = _check(llm, base, settings)
        spec = {k: v for k, v in totals.items() if k != "vanilla"}
        if llm.spec.logits_shift:
            assert min(spec.values()) < totals["vanilla"], (rule, totals)
        else:
            assert all(v < totals["vanilla"] for v in spec.values()), (rule, totals)


def test_all_depths_and_branches(checkpoint):
    llm = _llm(checkpoint, "bc", peaked=30.0)
    base = DecodeParams(draft_budget=64, rule="threshold", threshold=0.6, max_new_tokens=16, early_stop=False)
    _check(llm, base, [dict(method="freedave", draft_depth=d, eager=e) for d in range(1, 9) for e in (False, True)]
           + [dict(method="spiffy", branches=b, graph=MIXED) for b in range(1, 9)], prompts=PROMPTS[:2])


def test_static_k2_and_dynamic_rules(checkpoint):
    llm = _llm(checkpoint, "bc_shift", peaked=30.0)
    for rule, kw in (("static", dict(tokens_per_step=2)), ("dynamic", dict(tokens_per_step=2, threshold=0.6)),
                     ("llada", dict(steps=4))):
        base = DecodeParams(draft_budget=64, rule=rule, max_new_tokens=16, **kw)
        _check(llm, base, [dict(method="freedave", draft_depth=4), dict(method="spiffy", branches=4, graph=MIXED)],
               prompts=PROMPTS[:2])


def test_temperature_lossless_for_fixed_seed(checkpoint):
    llm = _llm(checkpoint, "bc", peaked=3.0)
    base = DecodeParams(draft_budget=64, rule="threshold", threshold=0.6, temperature=0.7, seed=3, max_new_tokens=16)
    _check(llm, base, [dict(method="freedave", draft_depth=8), dict(method="spiffy", branches=8, graph=MIXED)],
           prompts=PROMPTS[:2])


def test_calibrated_graph_lossless_and_saves_forwards(checkpoint, tmp_path):
    llm = _llm(checkpoint, "bc", peaked=30.0)
    base = DecodeParams(draft_budget=64, rule="threshold", threshold=0.6, max_new_tokens=24, early_stop=False)
    g = torch.Generator().manual_seed(0)
    cal = [torch.randint(0, 90, (int(n),), generator=g).tolist() for n in torch.randint(3, 20, (8,), generator=g)]
    graph = calibrate(llm, cal, base, branches=7)
    assert len(graph) == 7 and all(n.parent < i for i, n in enumerate(graph.nodes, start=1))
    assert graph.meta["rule"] == "threshold" and graph.meta["block_size"] == 8
    path = graph.save(tmp_path / "g.json")
    totals = _check(llm, base, [dict(method="spiffy", branches=7, graph=str(path))])
    assert min(v for k, v in totals.items() if k != "vanilla") < totals["vanilla"]


class _NoAhead:
    """The same policy with the look-ahead hidden: drafts stop at the rule region's end (the old reach)."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    reads_ahead = False

    def drafts(self, root, parent, ctx):
        if parent is not None:
            parent = Step(parent.state, parent.scored, parent.next, parent.region, None)
        return self.inner.drafts(root, parent, ctx)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bc", "bi"])
def test_drafts_cross_the_sub_block_boundary(checkpoint, name, tmp_path):
    """Under the sub-block rule the drafts complete the current sub-block and start the next one (its
    logits come from the same verification), so a sub-block's first step is speculated: vanilla's
    tokens, and for FreeDave++ chains (plain and eager) fewer forwards than the same drafts stopped at
    the sub-block's end. Calibration expresses the steps across the boundary; Spiffy with that graph
    stays lossless (its forward count against the stopped drafts depends on the graph, so only the
    chains' is asserted)."""
    llm = _llm(checkpoint, name, peaked=30.0)
    base = DecodeParams(draft_budget=64, rule="sub_block", threshold=0.999, max_new_tokens=32, early_stop=False)
    prompts = PROMPTS
    van = [llm.decoder(base).run(llm.encode(pr, base)) for pr in prompts]
    cal = [[40 + i, 41, 42 + i] for i in range(6)]
    rec, dec = _CalRecorder(), llm.decoder(base)
    dec.policy = rec
    for pr in cal:
        dec.run(llm.encode(pr, base))
    counts, roots = count_patterns(rec.blocks, llm.spec.mask_token_id)
    # one token per step (τ = 0.999): every root's next step is expressible, also a sub-block's first
    assert sum(c for path, c in counts.items() if len(path) == 1) == roots > 0
    graph = calibrate(llm, cal, base, branches=7)
    settings = [dict(method="freedave", draft_depth=8), dict(method="spiffy", branches=7, graph=graph)]
    if name == "bc":
        settings.append(dict(method="freedave", draft_depth=8, eager=True))
    for kw in settings:
        p = base.replace(**kw)
        nfe = {}
        for reach in ("ahead", "region"):
            dec = llm.decoder(p)
            if reach == "region":
                dec.policy = _NoAhead(dec.policy)
            got = [dec.run(llm.encode(pr, p)) for pr in prompts]
            for (ids, fin, _), (vids, vfin, _) in zip(got, van):
                assert ids == vids and fin == vfin, (kw, reach)
            nfe[reach] = sum(st.nfe for _, _, st in got)
        assert nfe["ahead"] <= sum(st.nfe for _, _, st in van), (kw, nfe)
        if kw["method"] == "freedave":
            assert nfe["ahead"] < nfe["region"], (kw, nfe)


def test_stats_fields(checkpoint):
    llm = _llm(checkpoint, "bc", peaked=30.0)
    out = llm.generate([PROMPTS[0]], DecodeParams(draft_budget=64, rule="static", method="freedave", draft_depth=8,
                                                  max_new_tokens=16, early_stop=False))[0]
    ex = out.stats.extra
    assert out.stats.verify_forwards > 0
    assert ex["accepted_per_verify"] == pytest.approx(ex["reused_states"] / out.stats.verify_forwards)
    assert ex["reused_states"] > 0 and set(ex["node_hit_rate"]) <= set(range(1, 8))
    assert all(0.0 <= r <= 1.0 for r in ex["node_hit_rate"].values())
    for k in ("draft_seconds", "model_seconds", "other_seconds"):
        assert ex[k] >= 0.0
    json.dumps(out.stats.to_dict())


# ---------------------------------------------------------------------------- the exact-state invariant
class _Recorder(DraftPolicy):
    def __init__(self):
        self.future: dict[tuple, list[list[int]]] = {}
        self.block: list[list[int]] = []

    def on_step(self, step, ctx):
        if ctx.step == 0:
            self.block = []
        self.block.append(step.state)
        for i, s in enumerate(self.block):  # every earlier state of the block -> the states after it
            self.future[tuple(s)] = self.block[i + 1:] + [step.next]


class _NearMiss(DraftPolicy):
    """Drafts the true future main states (exact=True) or states one token away from them."""

    def __init__(self, future, mask_id, exact):
        self.future, self.M, self.exact = future, mask_id, exact

    def drafts(self, root, parent, ctx):
        out = []
        for s in self.future.get(tuple(root), [])[:4]:
            if self.exact:
                out.append(Draft(list(s), 0))
                continue
            filled = [i for i, (a, r) in enumerate(zip(s, root)) if a != self.M and r == self.M]
            masked = [i for i, (a, ok) in enumerate(zip(s, ctx.allowed)) if a == self.M and ok]
            if filled:  # one more token differs
                a = list(s)
                a[filled[0]] = (a[filled[0]] + 1) % self.M
                out.append(Draft(a, 0))
                b = list(s)
                b[filled[-1]] = self.M  # one token fewer
                out.append(Draft(b, 0))
            if masked:  # one token more
                c = list(s)
                c[masked[0]] = 3
                out.append(Draft(c, 0))
        keys = {tuple(root)}
        if not self.exact:  # a near miss must not coincide with a true main state
            keys |= {tuple(x) for x in self.future.get(tuple(root), [])}
        uniq = []
        for d in out:
            if tuple(d.tokens) not in keys:
                keys.add(tuple(d.tokens))
                uniq.append(d)
        return uniq


class _Poison:
    """Dense verification, but every draft branch gets wrong (strongly peaked, shuffled) logits."""
    name, returns_hidden, packs_with_model = "poison", False, False

    def __init__(self, inner):
        self.inner = inner
        self.poisoned = 0

    def verify_many(self, forwards):
        out = self.inner.verify_many(forwards)
        for f, r in zip(forwards, out):
            B, T = f.tokens.shape
            if B == 1:
                continue
            g = torch.Generator().manual_seed(7)
            r.logits = r.logits.clone()
            if f.head_rows is not None:  # each branch's own rows (flat b*T + t): poison b >= 1
                bad = f.head_rows >= T
                r.logits[0, bad] = torch.randn(r.logits[0, bad].shape, generator=g, dtype=r.logits.dtype) * 50
            else:
                r.logits[1:] = torch.randn(r.logits[1:].shape, generator=g, dtype=r.logits.dtype) * 50
            self.poisoned += B - 1
        return out


@pytest.mark.parametrize("rule", ["threshold", "sub_block"])
@pytest.mark.parametrize("name", ["bc_shift", "bi"])
def test_advance_reads_only_the_exact_states_logits(checkpoint, name, rule):
    llm = _llm(checkpoint, name, peaked=30.0)
    p = DecodeParams(draft_budget=64, rule=rule, threshold=0.6, max_new_tokens=16, early_stop=False)
    rec = _Recorder()
    dec = llm.decoder(p)
    dec.policy = rec
    van = [dec.run(llm.encode(pr, p))[0] for pr in PROMPTS]
    for exact in (False, True):
        dec = llm.decoder(p)
        dec.policy = _NearMiss(rec.future, llm.spec.mask_token_id, exact)
        dec.verifier = _Poison(dec.verifier)
        got = [dec.run(llm.encode(pr, p))[0] for pr in PROMPTS]
        assert dec.verifier.poisoned > 0
        if exact:  # teeth: poisoned logits of exact future states do change the output
            assert got != van
        else:
            assert got == van


# ---------------------------------------------------------------------------- the embedded tiny model
TINY = Path(__file__).resolve().parents[1] / "specfold" / "tiny" / "model"


@pytest.mark.slow
@pytest.mark.skipif(not (TINY / "config.json").is_file(), reason="the tiny model is not trained yet")
def test_lossless_tiny_model(tiny_llm64):
    llm = tiny_llm64
    rows = [json.loads(x) for x in (TINY / "heldout.jsonl").read_text().splitlines()[:3]]
    prompts = [r["question"] for r in rows]
    for rule, kw in (("static", {}), ("sub_block", {}), ("threshold", {"threshold": 0.9})):
        base = DecodeParams(draft_budget=64, rule=rule, max_new_tokens=48, chat_template=True, **kw)
        settings = [dict(method="freedave", draft_depth=8), dict(method="freedave", draft_depth=8, eager=True),
                    dict(method="spiffy", branches=7, graph=MIXED), dict(method="spiffy", branches=7)]
        _check(llm, base, settings, prompts)  # the last one uses the shipped default graph


# ---------------------------------------------------------------------------- eager windows
@pytest.mark.parametrize("name", ["bc", "bc_shift"])
def test_eager_commit_reuses_exact_kv(checkpoint, name):
    """Eager commits from the window's K/V: the prefix cache ends up equal to vanilla's (commit
    forwards), forwards are saved, tokens are identical."""
    llm = _llm(checkpoint, name, peaked=30.0)
    base = DecodeParams(draft_budget=64, rule="static", max_new_tokens=40, early_stop=False)
    reused = 0
    with released_caches() as caches:
        for prompt in PROMPTS:
            caches.clear()
            van = llm.generate([prompt], base)[0]
            eag = llm.generate([prompt], base.replace(method="freedave", draft_depth=8, eager=True))[0]
            assert eag.token_ids == van.token_ids and eag.stats.nfe <= van.stats.nfe
            reused += eag.stats.extra.get("commits_reused", 0)
            (n, ak, av), (m, bk, bv) = caches
            assert m == n and n >= 32
            assert torch.allclose(ak, bk, atol=1e-12, rtol=0) and torch.allclose(av, bv, atol=1e-12, rtol=0)
    assert reused > 0
