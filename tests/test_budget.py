"""Draft budgets (engine/budget.py, engine/cost.py, decoding/drafts/acceptance.py).

- The chooser's optimisation against a brute force over every set of drafts closed under parents.
- Auto budgets never change tokens (float64, one request at a time and batched with staggered joins),
  on a cost model of a machine where drafts sometimes pay, so the choice really varies: budgets of
  several sizes, zero, and picks that are not a prefix of the policy's list.
- Fixed budgets: 0 verifies no draft (vanilla's forwards), N at most N per verification.
- The cost model: calibration writes the cache file, the next engine reads it; the key tells a
  widened copy (same fingerprint) apart; online refinement converges to a known cost law.
- Acceptance estimates: calibration priors from the graph meta, refined by counted hits.
- Per-branch head rows: the same logits as the shared layout, and fewer head rows.
"""
from __future__ import annotations

import json
import random

import pytest
import torch

from specfold import LLM, DecodeParams, EngineConfig, SamplingParams
from specfold.decoding.drafts import acceptance as A
from specfold.decoding.drafts.graph import DraftGraph, Node
from specfold.engine import budget as B
from specfold.engine import cost as C
from specfold.engine.budget import BudgetChooser, best_closure
from specfold.engine.cost import CostModel, Shape
from specfold.errors import ParamsError
from specfold.models.forward import Forward
from tests.test_engine import FAMILIES, MAX_NEW, MIXED, PROMPTS, _batched

METHODS = {
    "freedave": dict(method="freedave", draft_depth=6),
    "freedave_eager": dict(method="freedave", draft_depth=6, eager=True),
    "spiffy": dict(method="spiffy", branches=8, graph=MIXED),
    "specfold": dict(method="specfold", drafts="spiffy", branches=8, graph=MIXED, delta=0.0),
    "specfold_chain": dict(method="specfold", drafts="freedave", draft_depth=4, delta=0.0),
}


# ---------------------------------------------------------------------------- the optimisation
def _ratio(F0, V0, per_req, deltas, cost, sel):
    F, V = F0, V0
    for k, j in sel:
        v, _, h = per_req[k][j]
        F, V = F.plus(Shape(deltas[k].rows, deltas[k].attn, h, deltas[k].fold, deltas[k].fold_calls)), V + v
    return V / cost.predict(F)


def _brute(F0, V0, per_req, deltas, cost):
    items = [(k, j) for k, its in enumerate(per_req) for j in range(len(its))]
    best = V0 / cost.predict(F0)
    for mask in range(1 << len(items)):
        sel = [items[i] for i in range(len(items)) if mask >> i & 1]
        have = set(sel)
        if all(per_req[k][j][1] < 0 or (k, per_req[k][j][1]) in have for k, j in sel):
            best = max(best, _ratio(F0, V0, per_req, deltas, cost, sel))
    return best


@pytest.mark.parametrize("shape", ["linear", "sublinear"])
def test_best_closure_against_brute_force(shape):
    """On random forests of drafts (values not monotone along paths), random costs: the chosen set is
    closed under parents and reaches the best ratio of all closed sets (linear costs: exactly;
    sub-linear piecewise costs: to 0.5 %)."""
    rng = random.Random(23)
    worst = 1.0
    for _ in range(150):
        base = rng.uniform(0.5, 2.0)
        if shape == "linear":
            cost = CostModel([8, 16], [base, base + rng.uniform(0.02, 0.4) * base], 0.0, rng.uniform(0, 0.02))
        else:
            f = [base]
            for _ in range(4):
                f.append(f[-1] + rng.uniform(0.05, 1.0) * base)
            cost = CostModel([8, 16, 32, 64, 128], f, 0.0, rng.uniform(0, 0.02))
        per_req, deltas = [], []
        for _ in range(rng.randint(1, 3)):
            items = []
            for j in range(rng.randint(1, 5)):
                items.append((rng.uniform(0, 1), rng.randint(-1, j - 1), rng.randint(1, 8)))
            per_req.append(items)
            deltas.append(Shape(8, 0, 0))
        F0, V0 = Shape(8 * len(per_req), 0, 4 * len(per_req)), float(len(per_req))
        got = best_closure(cost, F0, V0, per_req, deltas)
        have = set(got)
        assert all(per_req[k][j][1] < 0 or (k, per_req[k][j][1]) in have for k, j in got)
        worst = min(worst, _ratio(F0, V0, per_req, deltas, cost, got) / _brute(F0, V0, per_req, deltas, cost))
    assert worst >= (1 - 1e-9 if shape == "linear" else 0.995), worst


def test_best_closure_takes_nothing_when_nothing_pays():
    cost = CostModel([8, 16], [1.0, 2.0], 0.0, 0.0)  # a draft costs as much as a root: it must be sure
    per = [[(0.9, -1, 1), (0.8, 0, 1)]]
    assert best_closure(cost, Shape(8, 0, 1), 1.0, per, [Shape(8, 0, 0)]) == []
    cheap = CostModel([8, 16], [1.0, 1.01], 0.0, 0.0)
    assert best_closure(cheap, Shape(8, 0, 1), 1.0, per, [Shape(8, 0, 0)]) == [(0, 0), (0, 1)]


# ---------------------------------------------------------------------------- budgets never change tokens
def _install_cost(llm, config: EngineConfig, slope: float) -> None:
    """A cost model of a machine where a draft's rows cost `slope` of a root-only step per row (into
    the cost cache the engines read): drafts pay when they are likely to be reached, not always."""
    from specfold.engine.engine import build_program
    cfg = config.resolve(llm.spec)
    prog = build_program(llm.model, llm.spec, cfg)
    key = C.cost_key(llm.model, llm.spec, prog.verifier, cfg.block_size or 16)
    grid = [8 * 2 ** i for i in range(8)]
    m = CostModel(grid, [1.0 + slope * g for g in grid], 0.0, 0.002, fold0=0.05, fold_row=0.002 * slope, key=key)
    m.save(C.cache_path(key))
    C.forget_models()


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("family", ["bc", "bc_shift", "bi"])
def test_auto_budgets_never_change_tokens(checkpoint, family, method):
    if METHODS[method].get("eager") and FAMILIES[family]["attention"] != "block_causal":
        pytest.skip("eager windows need a block-causal family")
    llm = LLM(checkpoint("qwen2", peaked=30.0, block_size=8, sub_block_size=4, **FAMILIES[family]), dtype="float64")
    A.reset_registry()
    van = DecodeParams(rule="threshold", threshold=0.6)
    auto = DecodeParams(rule="threshold", threshold=0.6, draft_budget="auto", **METHODS[method])
    cfg = auto.split()[0]
    _install_cost(llm, cfg, slope=0.06 / 8)
    want = [llm.generate([pr], van.replace(max_new_tokens=n, seed=i))[0] for i, (pr, n) in enumerate(zip(PROMPTS, MAX_NEW))]
    budgets, picks = {}, []
    alone = [llm.generate([pr], auto.replace(max_new_tokens=n, seed=i))[0] for i, (pr, n) in enumerate(zip(PROMPTS, MAX_NEW))]
    for g, w in zip(alone, want):
        assert g.token_ids == w.token_ids and g.finish_reason == w.finish_reason
        assert g.stats.nfe <= w.stats.nfe
        for k, v in g.stats.extra["draft_budgets"].items():
            budgets[k] = budgets.get(k, 0) + v
    for stagger in (0, 1):
        eng_outs = _batched_picks(llm, cfg, stagger, picks)
        for g, w in zip(eng_outs, want):
            assert g.token_ids == w.token_ids and g.finish_reason == w.finish_reason
            for k, v in g.stats.extra["draft_budgets"].items():
                budgets[k] = budgets.get(k, 0) + v
    # the choice really varies: no drafts at some verifications, several budget sizes at others
    assert 0 in budgets and len([k for k in budgets if k > 0]) >= 2, budgets


def test_auto_picks_are_not_only_prefixes(checkpoint):
    """For the graph methods (Spiffy, SpecFold) on the families above, with the same cost model as
    the test above, some pick is a closed subset that is not a prefix of the policy's list (a draft
    skipped while a later sibling is verified). The runs are made here: stops at the first such pick."""
    seen = {}
    for family in ("bc", "bc_shift", "bi"):
        for method in ("spiffy", "specfold"):
            llm = LLM(checkpoint("qwen2", peaked=30.0, block_size=8, sub_block_size=4, **FAMILIES[family]),
                      dtype="float64")
            A.reset_registry()
            cfg = DecodeParams(rule="threshold", threshold=0.6, draft_budget="auto", **METHODS[method]).split()[0]
            _install_cost(llm, cfg, slope=0.06 / 8)
            picks: list = []
            for stagger in (0, 1):
                _batched_picks(llm, cfg, stagger, picks)
            assert picks, (family, method)  # auto verified some drafts: the check below is not vacuous
            seen[(family, method)] = [p for p in picks if p != list(range(len(p)))]
            if seen[(family, method)]:
                return
    pytest.fail(f"every auto pick was a prefix of the policy's list: {seen}")


def _batched_picks(llm, cfg, stagger, picks):
    """`_batched` of test_engine, also recording every pick of a draft the chooser makes."""
    eng = llm.engine(cfg)
    choose = eng.budget.choose

    def spy(ids, props, base):
        out = choose(ids, props, base)
        picks.extend(k.drafts for k in out[0] if k is not None and k.drafts)
        return out
    eng.budget.choose = spy
    outs, ids, nxt, step = {}, [], 0, 0
    while nxt < len(PROMPTS) or eng.has_unfinished():
        while nxt < len(PROMPTS) and step >= nxt * stagger:
            ids.append(eng.add_request(PROMPTS[nxt], SamplingParams(max_new_tokens=MAX_NEW[nxt], seed=nxt)))
            nxt += 1
        for d in eng.step():
            if d.finished:
                outs[d.request_id] = d.output
        step += 1
    return [outs[r] for r in ids]


def test_auto_is_exact_at_temperature_and_on_the_tiny_model():
    """Sampling keyed by exact states (T > 0) and the shipped model with its graphs: auto = vanilla."""
    llm = LLM("tiny", dtype="float64")
    qs = ["Tom has 3 apples and buys 5 more. How many apples?", "What is 7 + 8?", "Sam had 10 pens and lost 4."]
    for rule in (None, "static"):
        base = DecodeParams(chat_template=True, max_new_tokens=32, rule=rule, temperature=0.7, seed=5)
        van = [o.token_ids for o in llm.generate(qs, base)]
        for kw in (dict(method="freedave"), dict(method="spiffy"), dict(method="specfold", delta=0.0)):
            p = base.replace(draft_budget="auto", **kw)
            assert [o.token_ids for o in llm.generate(qs, p)] == van, (rule, kw)
            assert [llm.generate([q], p)[0].token_ids for q in qs] == van, (rule, kw)


def test_auto_skips_the_choice_where_drafts_never_pay(checkpoint):
    """On a machine where a draft's rows cost far more than it can save, the pre-draft screen passes
    nobody, so the chooser backs off (steps not even evaluated: 0, 1, 3, then 7 at most after 1, 2,
    3, 4+ such steps in a row); tokens are vanilla's, no draft is verified. Where drafts pay, it drafts."""
    llm = LLM(checkpoint("qwen2", peaked=30.0, block_size=8, sub_block_size=4), dtype="float64")
    A.reset_registry()
    auto = DecodeParams(rule="threshold", threshold=0.6, draft_budget="auto", **METHODS["spiffy"])
    cfg = auto.split()[0]
    want = _batched(llm, DecodeParams(rule="threshold", threshold=0.6).split()[0], PROMPTS, MAX_NEW)
    for slope, drafts in ((10.0, False), (0.06 / 8, True)):
        _install_cost(llm, cfg, slope=slope)
        eng = llm.engine(cfg)
        outs, ids = {}, [eng.add_request(p, SamplingParams(max_new_tokens=n, seed=i))
                         for i, (p, n) in enumerate(zip(PROMPTS, MAX_NEW))]
        verify_steps = 0
        while eng.has_unfinished():
            verify_steps += any(r.state is not None and r.state.phase == "denoise" for r in eng.running)
            for d in eng.step():
                if d.finished:
                    outs[d.request_id] = d.output
        got = [outs[r] for r in ids]
        assert [g.token_ids for g in got] == [w.token_ids for w in want]
        verified = sum(g.stats.extra["drafts_verified"] for g in got)
        if drafts:
            assert verified > 0
        else:
            assert verified == 0 and eng.budget.steps < 0.6 * verify_steps, (eng.budget.steps, verify_steps)
    ch = BudgetChooser.__new__(BudgetChooser)
    ch._idle = [0, 0]
    seen = []
    for passed in (False, False, False, False, False, True, False, False):
        ch._idle_after(passed)
        seen.append(ch._idle[0])
    assert seen == [0, 1, 3, 7, 7, 0, 0, 1]


def test_drafts_that_paid_skip_the_screen(checkpoint, monkeypatch):
    """Where drafts pay, a request whose drafts were chosen at its last choice is not screened again
    (its drafts are made and weighed at once): the screen runs on fewer requests than have their
    drafts made, never on a request whose drafts paid, and the tokens are vanilla's."""
    llm = LLM(checkpoint("qwen2", peaked=30.0, block_size=8, sub_block_size=4), dtype="float64")
    A.reset_registry()
    cfg = DecodeParams(rule="threshold", threshold=0.6, draft_budget="auto", **METHODS["spiffy"]).split()[0]
    _install_cost(llm, cfg, slope=0.06 / 8)
    screened, made = [], []
    screen, choose = BudgetChooser._worth_drafting, BudgetChooser.choose

    def spy_screen(self, F0, live, parents, ratio=None, skip=frozenset()):
        screened.append([r in self._paid for k, (r, p) in enumerate(live) if k not in skip and p.nodes])
        return screen(self, F0, live, parents, ratio, skip)

    def spy_choose(self, ids, props, base):
        out = choose(self, ids, props, base)
        made.append(sum(1 for p in props if p is not None and p.computed))
        return out
    monkeypatch.setattr(BudgetChooser, "_worth_drafting", spy_screen)
    monkeypatch.setattr(BudgetChooser, "choose", spy_choose)
    for name in ("observe", "observe_host"):  # the machine stays the one installed (refinement would
        monkeypatch.setattr(CostModel, name, lambda *a, **k: None)  # move it to this CPU's)
    want = _batched(llm, DecodeParams(rule="threshold", threshold=0.6).split()[0], PROMPTS, MAX_NEW)
    got = _batched(llm, cfg, PROMPTS, MAX_NEW)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert sum(g.stats.extra["drafts_verified"] for g in got) > 0
    assert not any(any(paid) for paid in screened)  # a request whose drafts paid is never screened
    # without the skip every request whose drafts are made was screened in that step: screens >= made
    assert sum(len(x) for x in screened) < sum(made), (sum(len(x) for x in screened), sum(made))


def _probing_run(llm, cfg, monkeypatch, slope: float):
    """One engine over PROMPTS twice (one request at a time) on a chooser that never
    chooses a draft itself (`_best` refuses all), its cost model past warm-up: per choice, whether
    a probe ran and the picks; the shapes the refinement observed; the outputs."""
    _install_cost(llm, cfg, slope=slope)
    monkeypatch.setattr(BudgetChooser, "_best", lambda self, *a, **k: [])
    observed, log = [], []
    real_observe, choose = CostModel.observe, BudgetChooser.choose
    monkeypatch.setattr(CostModel, "observe", lambda self, s, t: observed.append(s))  # the machine stays
    monkeypatch.setattr(CostModel, "observe_host", lambda *a, **k: None)  # the one installed

    def spy_choose(self, ids, props, base):
        out = choose(self, ids, props, base)
        log.append((self._probed, [k.drafts for k in out[0] if k is not None]))
        return out
    monkeypatch.setattr(BudgetChooser, "choose", spy_choose)
    eng = llm.engine(cfg)
    eng.budget.cost.observations = B.REFINE_WARM  # warm: only every REFINE_EVERY-th step is observed
    outs = []
    for i, (p, n) in enumerate(zip(PROMPTS * 2, MAX_NEW * 2)):
        rid = eng.add_request(p, SamplingParams(max_new_tokens=n, seed=i % len(PROMPTS)))
        while eng.has_unfinished():
            outs += [d.output for d in eng.step() if d.finished and d.request_id == rid]
    monkeypatch.setattr(CostModel, "observe", real_observe)
    return eng, outs, observed, log


def test_a_refused_shape_is_probed_and_measured(checkpoint, monkeypatch):
    """Where the chooser verifies no draft for EXPLORE_EVERY steps in a row, the next evaluated step
    verifies one first-level draft (a probe) if that is predicted within EXPLORE_GAP of the best, and
    the refinement observes that step even past warm-up (so a model that overprices drafts measures
    them); no probe where a draft is predicted far worse. Tokens are vanilla's (float64)."""
    llm = LLM(checkpoint("qwen2", peaked=30.0, block_size=8, sub_block_size=4), dtype="float64")
    A.reset_registry()
    cfg = DecodeParams(rule="threshold", threshold=0.6, draft_budget="auto", **METHODS["spiffy"]).split()[0]
    want = [llm.generate([p], DecodeParams(rule="threshold", threshold=0.6, max_new_tokens=n, seed=i))[0]
            for i, (p, n) in enumerate(zip(PROMPTS, MAX_NEW))] * 2
    eng, outs, observed, log = _probing_run(llm, cfg, monkeypatch, slope=0.06 / 8)  # drafts nearly free
    assert [o.token_ids for o in outs] == [w.token_ids for w in want]
    probes = [i for i, (probed, _) in enumerate(log) if probed]
    assert len(probes) == eng.budget.probes >= 4, (len(log), probes)
    for i, (probed, picks) in enumerate(log):  # drafts only at probes, one first-level draft each
        assert sum(map(len, picks)) == (1 if probed else 0), (i, picks)
    assert min(b - a for a, b in zip(probes, probes[1:])) > B.EXPLORE_EVERY
    assert sum(o.stats.extra["drafts_verified"] for o in outs) == len(probes)
    # every probe's step was observed (it holds the only verified drafts), not one in REFINE_EVERY
    assert sum(1 for s in observed if s.drafts) == len(probes)
    assert len(observed) < len(probes) + eng.budget._ticks / B.REFINE_EVERY + 1
    got = _batched(llm, cfg, PROMPTS * 2, MAX_NEW * 2, stagger=3)  # in a batch: one request's draft
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert sum(g.stats.extra["drafts_verified"] for g in got) >= 1
    eng, outs, observed, log = _probing_run(llm, cfg, monkeypatch, slope=10.0)  # a draft: 10x a step
    assert [o.token_ids for o in outs] == [w.token_ids for w in want]
    assert eng.budget.probes == 0 and not any(s.drafts for s in observed)
    assert sum(o.stats.extra["drafts_verified"] for o in outs) == 0


def test_refinement_samples_the_steps_once_warm(checkpoint):
    """Until the cost model has REFINE_WARM observations every predicted step refines it; after that
    one in REFINE_EVERY does (model and host terms alike), while every predicted step is still
    predicted and measured for the report."""
    llm = LLM(checkpoint("qwen2", peaked=30.0, block_size=8, sub_block_size=4), dtype="float64")
    A.reset_registry()
    cfg = DecodeParams(rule="threshold", threshold=0.6, draft_budget="auto", **METHODS["spiffy"]).split()[0]
    _install_cost(llm, cfg, slope=0.06 / 8)
    eng = llm.engine(cfg)
    c = eng.budget.cost
    start = c.observations = c.host_observations = B.REFINE_WARM - 3
    for i, (p, n) in enumerate(zip(PROMPTS * 2, MAX_NEW * 2)):  # one at a time: more steps
        eng.add_request(p, SamplingParams(max_new_tokens=n, seed=i))
        while eng.has_unfinished():
            eng.step()
    ticks, obs = eng.budget._ticks, start
    for t in range(1, ticks + 1):
        obs += obs < B.REFINE_WARM or t % B.REFINE_EVERY == 0
    assert ticks > 2 * B.REFINE_EVERY and eng.budget.steps == ticks
    assert c.observations == c.host_observations == obs < start + ticks


# ---------------------------------------------------------------------------- picks are arguments
CAUSAL = {"ar": {}, "linear_spec": {}, "linear_spec_multi": dict(branches=4),
          "linear_specfold": dict(branches=4, delta=0.0)}


@pytest.mark.parametrize("budget", ["auto", 2])
def test_picks_are_arguments(checkpoint, tmp_path, budget):
    """Every method (block and causal), batched with staggered joins and an abort: the chooser is
    given request ids only; after every step each running request has the attributes of a request
    that never met the chooser, and its program state the fields of its type, nothing more; what
    the chooser remembers of a request is forgotten when it ends. Every verification that runs was
    proposed once in its step, and no request proposes twice in a step (vanilla: by `plan` itself)."""
    from collections import Counter
    from dataclasses import fields

    from specfold.engine.request import Request
    from tests.causal_helpers import nld_checkpoint
    block = LLM(checkpoint("qwen2", peaked=30.0, block_size=8, sub_block_size=4), dtype="float64")
    causal = LLM(nld_checkpoint(tmp_path, focus=2.0, mask_like=15, mask_mix=0.7, layer_scale=0.6), dtype="float64",
                 overrides={"stop_token_ids": [94]})
    never = set(vars(Request("r", [1], SamplingParams(), EngineConfig(), set())))
    runs = [(block, dict(method="vanilla", rule="threshold", threshold=0.6))]
    runs += [(block, dict(rule="threshold", threshold=0.6, **kw)) for kw in METHODS.values()]
    runs += [(causal, dict(method=m, **kw)) for m, kw in CAUSAL.items()]
    for llm, kw in runs:
        A.reset_registry()
        cfg = EngineConfig(draft_budget=budget, **kw)
        drafting = kw["method"] in ("freedave", "spiffy", "specfold")
        if budget == "auto" and drafting:
            _install_cost(llm, cfg, slope=0.06 / 8)
        eng = llm.engine(cfg)
        calls, proposals, remembered = Counter(), [0], False
        propose, choose, run = getattr(eng.program, "propose", None), eng.budget.choose, eng.runner.run

        def spy_propose(req):
            calls[req.id] += 1
            p = propose(req)
            proposals[0] += p is not None
            return p

        def spy_choose(ids, props, base):
            assert all(isinstance(i, str) for i in ids)
            return choose(ids, props, base)

        def spy_run(jobs):
            assert proposals[0] == sum(j.kind == "verify" for j in jobs) and max(calls.values(), default=1) == 1
            return run(jobs)
        if propose is not None:
            eng.program.propose = spy_propose
            eng.runner.run = spy_run
        eng.budget.choose = spy_choose
        ids, step = [], 0
        while len(ids) < len(PROMPTS) or eng.has_unfinished():
            if len(ids) < len(PROMPTS):
                ids.append(eng.add_request(PROMPTS[len(ids)], SamplingParams(max_new_tokens=MAX_NEW[len(ids)])))
            if step == 6:
                eng.abort(ids[1])
            calls.clear()
            proposals[0] = 0
            eng.step()
            step += 1
            for req in eng.running:
                assert set(vars(req)) == never, (kw, set(vars(req)) ^ never)
                assert set(vars(req.state)) == {f.name for f in fields(req.state)}, kw
            remembered |= bool(eng.budget._backoff or eng.budget._paid)
        assert not eng.budget._backoff and not eng.budget._paid, kw
        assert remembered == (budget == "auto" and drafting), kw


@pytest.mark.parametrize("budget", ["auto", 2])
def test_the_row_budget_is_the_schedulers(checkpoint, budget):
    """A row budget of two windows (16 rows) for 5 requests: the chooser picks drafts without it, and
    the scheduler defers the requests whose jobs do not fit (the first always runs), so no step runs
    more rows than the budget unless it runs one request alone. Tokens are vanilla's."""
    llm = LLM(checkpoint("qwen2", peaked=30.0, block_size=8, sub_block_size=4), dtype="float64")
    A.reset_registry()
    cfg = EngineConfig(rule="threshold", threshold=0.6, draft_budget=budget, max_num_batched_tokens=16,
                       **METHODS["spiffy"])
    if budget == "auto":
        _install_cost(llm, cfg, slope=0.06 / 8)
    want = _batched(llm, EngineConfig(rule="threshold", threshold=0.6), PROMPTS, MAX_NEW)
    eng = llm.engine(cfg)
    select, deferred = eng.scheduler.select, [0]

    def spy(plans):
        chosen = select(plans)
        assert len(chosen) == 1 or sum(j.rows for _, jobs in chosen for j in jobs) <= 16
        deferred[0] += len(plans) - len(chosen)
        return chosen
    eng.scheduler.select = spy
    ids = [eng.add_request(p, SamplingParams(max_new_tokens=n, seed=i)) for i, (p, n) in enumerate(zip(PROMPTS, MAX_NEW))]
    outs = {}
    while eng.has_unfinished():
        outs.update((d.request_id, d.output) for d in eng.step() if d.finished)
    assert [outs[r].token_ids for r in ids] == [w.token_ids for w in want]
    assert deferred[0] > 0 and sum(outs[r].stats.extra["drafts_verified"] for r in ids) > 0


# ---------------------------------------------------------------------------- fixed budgets
def test_fixed_budgets(checkpoint):
    llm = LLM(checkpoint("qwen2", peaked=30.0, block_size=8, sub_block_size=4), dtype="float64")
    base = DecodeParams(rule="threshold", threshold=0.6, max_new_tokens=24, early_stop=False)
    van = llm.generate(PROMPTS[:3], base)
    for n in (0, 1, 3):
        outs = llm.generate(PROMPTS[:3], base.replace(method="spiffy", branches=8, graph=MIXED, draft_budget=n))
        for o, v in zip(outs, van):
            assert o.token_ids == v.token_ids
            assert max(o.stats.extra["draft_budgets"]) <= n
            if n == 0:
                assert o.stats.nfe == v.stats.nfe and o.stats.extra["drafts_verified"] == 0
    full = llm.generate(PROMPTS[:3], base.replace(method="spiffy", branches=8, graph=MIXED, draft_budget=64))
    assert sum(o.stats.nfe for o in full) < sum(o.stats.nfe for o in van)  # teeth: drafts do save forwards


def test_draft_budget_validation():
    for bad in (-1, 1.5, True, "many", None):
        with pytest.raises(ParamsError, match="draft_budget must be 'auto' or an integer >= 0"):
            EngineConfig(draft_budget=bad)
    with pytest.raises(ParamsError, match="draft_budget"):
        DecodeParams(draft_budget=-2)
    assert EngineConfig().draft_budget == "auto" and DecodeParams().draft_budget == "auto"
    assert EngineConfig(draft_budget="3").draft_budget == 3 and EngineConfig(draft_budget=0).draft_budget == 0


# ---------------------------------------------------------------------------- the cost model
def test_calibration_is_cached_and_keyed(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    C.forget_models()
    llm = LLM("tiny", dtype="float32")
    eng = llm.engine(EngineConfig(method="spiffy"))
    first = eng.budget.cost
    files = list((tmp_path / "specfold").glob("cost-*.json"))
    assert len(files) == 1 and first.calibration_seconds < 10
    saved = json.loads(files[0].read_text())
    assert saved["key"]["model"] and saved["key"]["hidden"] == llm.spec.hidden_size
    assert saved["key"]["threads"] == torch.get_num_threads() and saved["key"]["dtype"] == "torch.float32"
    assert len(saved["grid"]) >= 2 and all(b >= a for a, b in zip(saved["f"], saved["f"][1:]))
    for _ in range(300):  # refinements stay in the process: the file keeps the calibration
        first.observe(Shape(first.grid[0], 1e4, 8), 3 * first.f[0])
    assert first.f[0] > saved["f"][0] and json.loads(files[0].read_text()) == saved
    C.forget_models()
    again = llm.engine(EngineConfig(method="spiffy")).budget.cost
    assert again is not first and again.f == saved["f"] and again.calibration_seconds == saved["calibration_seconds"]
    # a widened copy computes the same function (same fingerprint) but not at the same cost
    import dataclasses
    spec = llm.spec
    wide = dataclasses.replace(spec, hidden_size=spec.hidden_size * 2,
                               extra={**spec.extra, "widened_from": {"fingerprint": C.cost_key(llm.model, spec, None, 16)["model"]}})
    k1, k2 = C.cost_key(llm.model, spec, None, 16), C.cost_key(llm.model, wide, None, 16)
    assert k1["model"] == k2["model"] and k1 != k2 and C.cache_path(k1) != C.cache_path(k2)
    C.forget_models()


def test_one_slow_call_does_not_set_the_attention_term():
    """The attention term's short- and long-prefix forwards, timed from a known law (2e-7 s per unit
    of work, 64 rows × 112 extra cached tokens), with noise that only adds time: one call of each
    slowed by a neighbour (as on a shared core) leaves the term within 5 % of the law; the first
    pair alone would have read it 9x too high."""
    work, base, coef = 64 * 112, 0.4, 2e-7

    def timed(extra: list[float], long: bool):
        calls = iter(extra)
        return lambda: base + (coef * work if long else 0.0) + next(calls, 0.0)

    slow_long = [0.012, 0.0, 0.003]  # the long prefix's first call is 12 ms slow, its third 3 ms
    slow_short = [0.0, 0.004, 0.0]  # and the short one's second 4 ms
    got = C.attention_coefficient(timed(slow_short, False), timed(slow_long, True), work, passes=3)
    assert abs(got - coef) <= 0.05 * coef, got
    first_pair = C.attention_coefficient(timed(slow_short, False), timed(slow_long, True), work, passes=1)
    assert first_pair > 8 * coef  # what one pair read (the code before)
    assert C.attention_coefficient(lambda: 0.5, lambda: 0.4, work, passes=3) == 0.0  # never negative


def test_online_refinement_converges_to_the_machine():
    """Steps timed from a known cost law (±3 % noise): the model, started far off, predicts it within 5 %."""
    def law(s: Shape) -> float:
        return 0.004 + 2e-4 * s.rows + 1e-7 * s.attn + 5e-5 * s.head + (0.003 + 1e-4 * s.fold if s.fold_calls else 0)
    grid = [16, 32, 64, 128, 256, 512]
    m = CostModel(grid, [0.02 + 1e-3 * g for g in grid], 1e-6, 1e-3, 0.01, 1e-3)
    rng = random.Random(0)
    shapes = []
    for _ in range(8000):  # the low-expectile steps are slower upwards: a few thousand steps
        rows = rng.choice(grid) * rng.uniform(0.6, 1.0)
        fold = rng.choice([0, 0, rows * 0.5])
        s = Shape(rows, rows * rng.uniform(16, 96), rows * rng.uniform(0.2, 0.6), fold, int(fold > 0))
        shapes.append(s)
        m.observe(s, law(s) * rng.uniform(0.97, 1.03))
    err = max(abs(m.predict(s) - law(s)) / law(s) for s in shapes[-200:])
    assert err < 0.05, err


def test_a_rarely_reached_point_leaves_its_calibration_in_a_few_steps():
    """The steps of a batch-1 run sit at one window's rows, and a draft's row count is reached only
    when a draft is verified. With the second point calibrated 30 % high (as under load), four
    observations there bring it within 6 % of the machine (the fixed step size alone: 12 %), while
    the first point, seen every step, still tracks its own cost."""
    def law(s: Shape) -> float:
        return 0.08 + 0.0045 * s.rows  # 16 rows: 152 ms, 32 rows: 224 ms (the 0.5B proxy's measured)
    m = CostModel([16, 32, 64], [0.152, 0.224 * 1.3, 0.368], 0.0, 0.0)
    rng = random.Random(3)
    for t in range(64):
        rows = 32.0 if t % 16 == 15 else 16.0  # a draft verified one step in 16
        s = Shape(rows, 0.0, 0.0)
        m.observe(s, law(s) * rng.uniform(0.99, 1.01))
    assert abs(m.f[1] / 0.224 - 1) < 0.06, m.f
    assert abs(m.f[0] / 0.152 - 1) < 0.03, m.f
    assert m.seen[:2] == [60.0, 4.0]
    fixed = CostModel([16, 32, 64], [0.152, 0.224 * 1.3, 0.368], 0.0, 0.0, seen=[1e9] * 3)  # ETA only
    for _ in range(4):
        fixed.observe(Shape(32.0, 0.0, 0.0), 0.224)
    assert fixed.f[1] / 0.224 - 1 > 0.10, fixed.f


def test_host_terms_learn_a_drafts_cost_from_zero():
    """Host times from a known law (a step's fixed work plus 0.13 ms per verified draft, ±5 % noise),
    the terms started at zero: each verified draft's host cost is learnt (a relative step from the
    parameter floors alone left it at zero, so the chooser saw drafts as free of host work)."""
    m = CostModel([16, 32], [1e-3, 2e-3])
    rng = random.Random(1)
    for _ in range(3000):
        s = Shape(16.0, jobs=1.0, drafts=float(rng.choice([0, 1, 2])))
        m.observe_host(s, (1.6e-4 + 1.3e-4 * s.drafts) * rng.uniform(0.95, 1.05))
    assert 1.0e-4 < m.host_draft < 1.6e-4, m.host_draft
    for d in (0, 1, 2):
        law = 1.6e-4 + 1.3e-4 * d
        assert abs(m.host_of(Shape(16.0, jobs=1.0, drafts=d)) - law) < 0.1 * law


def test_host_terms_tell_making_drafts_from_verifying_them():
    """The law measured on `tiny` at batch 1 (Spiffy, static rule): 0.37 ms of host work per step,
    0.37 ms more when the request's drafts are made and weighed (whether none, one or two are then
    verified), 0.2 ms per verified draft. The terms learn the two apart: a second draft is priced at
    its own host work, not at the making's (lumped into the per-draft term, as before `host_made`,
    it was learnt at about 0.33 ms)."""
    m = CostModel([16, 32], [1e-3, 2e-3])
    rng = random.Random(3)
    for _ in range(4000):
        made = rng.random() < 0.75
        s = Shape(16.0, jobs=1.0, drafts=float(rng.choice([0, 1, 1, 2]) if made else 0), made=float(made))
        m.observe_host(s, (3.7e-4 + 3.7e-4 * s.made + 2e-4 * s.drafts) * rng.uniform(0.95, 1.05))
    assert 1.5e-4 < m.host_draft < 2.5e-4, m.host_draft
    assert 2.7e-4 < m.host_made < 4.7e-4, m.host_made
    for made, d in ((0, 0), (1, 0), (1, 1), (1, 2)):
        law = 3.7e-4 + 3.7e-4 * made + 2e-4 * d
        assert abs(m.host_of(Shape(16.0, jobs=1.0, drafts=d, made=made)) - law) < 0.1 * law


# ---------------------------------------------------------------------------- acceptance
def test_acceptance_priors_and_online_counts(tmp_path):
    g = DraftGraph([Node(0, ((0, 0),)), Node(1, ((0, 0),)), Node(0, ((1, 0),))],
                   {"hit_rate_estimate": [0.6, 0.3, 0.05], "counts": [60, 30, 5], "roots": 100})
    acc = A.Acceptance(A.graph_priors(g))
    assert acc.p(1) == pytest.approx(0.6) and acc.p(3) == pytest.approx(0.05)
    assert acc.optimistic(2) > acc.p(2)
    for _ in range(200):
        acc.drafted(3)
        acc.hit(3)
    assert acc.p(3) > 0.95  # the online counts outweigh the prior
    assert acc.best(2) == max(acc.p(1), acc.p(2)) and acc.best(3) == acc.p(3)  # memoised, yet current
    r = sorted((acc.p(1), acc.p(2), acc.p(3)), reverse=True)
    assert acc.cumulative(3) == [r[0], r[0] + r[1], r[0] + r[1] + r[2]]
    acc.drafted(1)
    assert acc.best(1) == acc.p(1) < 0.6 and acc.cumulative(1) == [acc.p(1)]
    chain = A.graph_priors(DraftGraph.chain(3))
    assert chain[1][0] > chain[2][0] > chain[3][0]
    # the shipped graphs carry their calibration's estimates, and to_depth keeps them per node
    from specfold.decoding.drafts.spiffy import GRAPHS
    shipped = DraftGraph.load(GRAPHS / "tiny_static.json")
    pri = A.graph_priors(shipped)
    assert len(pri) == len(shipped) and pri[1][1] == A.PRIOR_WEIGHT
    cut = shipped.to_depth(1)
    assert len(A.graph_priors(cut)) == len(cut)


# ---------------------------------------------------------------------------- per-branch head rows
def test_head_rows_equal_the_shared_layout(checkpoint):
    llm = LLM(checkpoint("qwen2", block_size=8), dtype="float64")
    m = llm.model
    g = torch.Generator().manual_seed(0)
    toks = torch.randint(0, 90, (3, 8), generator=g)
    pos = torch.arange(8)
    at = torch.tensor([1, 4, 6])
    rows = torch.tensor([1, 4, 8 + 2, 16 + 4, 16 + 6])  # branch 0: 1, 4; branch 1: 2; branch 2: 4, 6
    shared, own = m.forward_many([Forward(toks, pos, logits_at=at), Forward(toks, pos, head_rows=rows)])
    flat = shared.logits.new_zeros(3, 8, shared.logits.shape[-1])
    flat[:, at] = shared.logits
    assert own.logits.shape == (1, 5, shared.logits.shape[-1])
    for i, r in enumerate(rows.tolist()):
        if r % 8 in at.tolist():
            assert torch.allclose(own.logits[0, i], flat[r // 8, r % 8], atol=1e-12, rtol=0)


def test_a_verification_pays_the_head_only_for_its_own_rows(checkpoint):
    llm = LLM(checkpoint("qwen2", peaked=30.0, block_size=8), dtype="float64")
    eng = llm.engine(EngineConfig(method="freedave", draft_depth=6, rule="static", tokens_per_step=1, draft_budget=64))
    eng.add_request([5, 6, 7], SamplingParams(max_new_tokens=16))
    fewer = 0
    while eng.has_unfinished():
        for req in eng.running:  # plan is pure: the jobs this step will run
            for j in eng.program.plan(req):
                if j.kind == "verify" and len(j.tokens) > 1:
                    union = {r % j.width for r in j.rows_at}
                    assert j.head_rows <= len(j.tokens) * len(union)
                    fewer += j.head_rows < len(j.tokens) * len(union)
        eng.step()
    assert fewer > 0
