"""Draft budgets (engine/budget.py): fixed budgets, and the auto bandit.

- Budgets never change tokens (float64, one request at a time and batched with staggered joins),
  for every speculative method and attention family, under the auto bandit and under a scripted
  sequence of arms that changes every few steps (so every arm, and every change of arm, is met).
- The bandit on synthetic steps (a fake clock): it climbs to the best arm where drafts pay, stays at
  0 and never tries an arm far from the best where they do not, follows a change of machine,
  scores only steps whose neighbours play the same arm, asks for draft material exactly when the
  next step may draft, and learns each batch size's arm on its own.
- Fixed budgets: 0 verifies no draft (vanilla's forwards), N at most N per verification.
- Picks are arguments: nothing of the choice is kept on requests; one proposal per request and step.
- Per-branch head rows: the same logits as the shared layout, and fewer head rows.
"""
from __future__ import annotations

import itertools

import pytest
import torch

from specfold import LLM, EngineConfig, SamplingParams
from specfold.decoding.plugins import Draft
from specfold.decoding.proposal import Proposal
from specfold.engine import budget as B
from specfold.engine.budget import ARMS, BudgetChooser
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
RULE = dict(rule="threshold", threshold=0.6)


def _llm(checkpoint, family="bc"):
    return LLM(checkpoint("qwen2", peaked=30.0, block_size=8, sub_block_size=4, **FAMILIES[family]), dtype="float64")


def _scripted(monkeypatch):
    """The bandit plays arms 0, 1, 2, 3, 0, ... in runs of 2 steps instead of choosing."""
    cycle = itertools.cycle(range(len(ARMS)))
    monkeypatch.setattr(B, "RUN", 2)
    monkeypatch.setattr(BudgetChooser, "_arm_for", lambda self, bucket: next(cycle))


def _budgets(outs) -> dict[int, int]:
    seen: dict[int, int] = {}
    for o in outs:
        for k, v in o.stats.extra["draft_budgets"].items():
            seen[int(k)] = seen.get(int(k), 0) + v
    return seen


# ---------------------------------------------------------------------------- budgets never change tokens
@pytest.mark.slow
@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("family", ["bc", "bc_shift", "bi"])
def test_auto_budgets_never_change_tokens(checkpoint, family, method, monkeypatch):
    if METHODS[method].get("eager") and FAMILIES[family]["attention"] != "block_causal":
        pytest.skip("eager windows need a block-causal family")
    llm = _llm(checkpoint, family)
    cfg = EngineConfig(draft_budget="auto", **RULE, **METHODS[method])
    want = [_batched(llm, EngineConfig(**RULE), [p], [n])[0] for p, n in zip(PROMPTS, MAX_NEW)]
    got = [_batched(llm, cfg, [p], [n])[0] for p, n in zip(PROMPTS, MAX_NEW)]  # the bandit as it is
    _scripted(monkeypatch)
    got += [_batched(llm, cfg, [p], [n])[0] for p, n in zip(PROMPTS, MAX_NEW)]
    for stagger in (0, 1):
        got += _batched(llm, cfg, PROMPTS, MAX_NEW, stagger=stagger)
    for g, w in zip(got, want * 4):
        assert g.token_ids == w.token_ids and g.finish_reason == w.finish_reason
    seen = _budgets(got[len(PROMPTS):])
    assert 0 in seen and len([k for k in seen if k > 0]) >= 2, seen  # the arms really varied


@pytest.mark.slow
def test_auto_is_exact_at_temperature_and_on_the_tiny_model(tiny_llm64, monkeypatch):
    """Sampling keyed by exact states (T > 0) and the shipped model with its graphs: auto = vanilla,
    under the bandit and under scripted arms."""
    llm = tiny_llm64
    qs = [llm.encode(q, SamplingParams()) for q in
          ("Tom has 3 apples and buys 5 more. How many apples?", "What is 7 + 8?", "Sam had 10 pens and lost 4.")]
    n = [32] * len(qs)
    temps = [0.7] * len(qs)
    for rule in ({}, dict(rule="static")):
        van = [o.token_ids for o in _batched(llm, EngineConfig(**rule), qs, n, temps=temps)]
        for kw in (dict(method="freedave"), dict(method="spiffy"), dict(method="specfold", delta=0.0)):
            cfg = EngineConfig(draft_budget="auto", **rule, **kw)
            assert [o.token_ids for o in _batched(llm, cfg, qs, n, temps=temps)] == van, (rule, kw)
            with monkeypatch.context() as m:
                _scripted(m)
                assert [o.token_ids for o in _batched(llm, cfg, qs, n, stagger=1, temps=temps)] == van, (rule, kw)


# ---------------------------------------------------------------------------- the bandit, on synthetic steps
class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class _Program:
    drafts = True


def _proposal(nodes: int = 4) -> Proposal:
    return Proposal(8, 0, nodes, make=lambda: [Draft([0] * 8, 0, i) for i in range(nodes)])


def _play(ch: BudgetChooser, clock: _Clock, steps: int, gain, cost, batch: int = 1) -> list[int]:
    """`steps` synthetic steps of `batch` requests: a step verifying n drafts per request fills
    gain(n) positions per request and takes cost(n) seconds. Returns the budget played at each step."""
    played = []
    for _ in range(steps):
        ch.start_step()
        picks = ch.choose([_proposal() for _ in range(batch)])
        n = len(picks[0].drafts) if picks[0].drafts is not None else picks[0].proposal.nodes
        played.append(n)
        clock.t += cost(n)
        ch.end_step(batch * gain(n))
    return played


def _chooser() -> tuple[BudgetChooser, _Clock]:
    ch = BudgetChooser(EngineConfig(draft_budget="auto"), _Program(), torch.device("cpu"))
    ch.clock = clock = _Clock()
    return ch, clock


def test_the_bandit_climbs_to_the_best_budget_where_drafts_pay():
    ch, clock = _chooser()
    gain = {0: 1.0, 1: 1.8, 2: 2.4, 4: 2.6}  # per step; a step costs 1 + 0.2 per draft: budget 2 is the best
    played = _play(ch, clock, 3000, gain.__getitem__, lambda n: 1.0 + 0.2 * n)
    late = played[1000:]
    assert late.count(2) > 0.9 * len(late), {k: late.count(k) for k in ARMS}
    assert set(played) == set(ARMS)  # it tried each on its way


def test_the_bandit_stays_at_zero_where_drafts_never_pay():
    ch, clock = _chooser()
    gain = {0: 1.0, 1: 1.3, 2: 1.5, 4: 1.6}  # per step; a step costs 1 + 0.8 per draft: none pays
    played = _play(ch, clock, 3000, gain.__getitem__, lambda n: 1.0 + 0.8 * n, batch=16)
    assert played.count(0) > 0.95 * len(played)
    assert 2 not in played and 4 not in played  # never tried far from the best


def test_the_bandit_follows_a_change_of_machine():
    ch, clock = _chooser()
    gain = {0: 1.0, 1: 1.8, 2: 2.4, 4: 2.6}.__getitem__
    _play(ch, clock, 2000, gain, lambda n: 1.0 + 0.8 * n)  # drafts do not pay: 0
    late = _play(ch, clock, 4000, gain, lambda n: 1.0 + 0.05 * n)[2000:]  # now they do: 2 and 4 are near
    assert late.count(0) < 0.1 * len(late), {k: late.count(k) for k in ARMS}


def test_a_step_is_scored_only_between_steps_of_its_arm_and_material_is_read_before_drafts():
    ch, clock = _chooser()
    arms, scored, drafting = [], [], []
    for i in range(400):
        ch.start_step()
        picks = ch.choose([_proposal()])
        arms.append(ch._arm)
        scored.append(ch._played is not None)
        drafting.append(picks[0].drafting)
        assert picks[0].drafting == (ARMS[ch._next] > 0)  # the next step's arm decides the material
        clock.t += 1.0
        ch.end_step(1 + i % 3)
    for i in range(1, len(arms) - 1):
        if scored[i]:
            assert arms[i - 1] == arms[i] == arms[i + 1]
    assert sum(scored) > len(scored) / 2 and sum(a != b for a, b in zip(arms, arms[1:])) > 2


def test_each_batch_size_learns_its_own_arm():
    """Drafts pay at batch 1 and not at batch 16 (a CPU): each bucket settles on its own arm, and a
    change of batch size ends the run at once (no step of batch 16 plays batch 1's arm by inertia)."""
    ch, clock = _chooser()
    gain = {0: 1.0, 1: 1.8, 2: 2.4, 4: 2.6}.__getitem__
    for _ in range(20):
        _play(ch, clock, 100, gain, lambda n: 1.0 + 0.2 * n, batch=1)
        big = _play(ch, clock, 100, gain, lambda n: 16 * (1.0 + 1.2 * n), batch=16)
        assert 2 not in big and 4 not in big  # batch 16 climbs from its own 0, never from batch 1's 2
    assert ch._best(0) == 2 and ch._best(4) == 0
    assert set(ch.arms) == {0, 4}  # buckets: 1 running request, 9-16


def test_a_step_without_drafts_to_choose_is_not_scored():
    ch, clock = _chooser()
    for _ in range(50):
        ch.start_step()
        ch.choose([None, _proposal(nodes=0)])  # a prefill and a block's first verification: nothing to pick
        assert ch._played is None
        clock.t += 1.0
        ch.end_step(1)
    assert all(a.plays == 0 for arms in ch.arms.values() for a in arms)


# ---------------------------------------------------------------------------- fixed budgets
def test_fixed_budgets(checkpoint):
    llm = _llm(checkpoint)
    n = [24] * 3
    van = _batched(llm, EngineConfig(**RULE, early_stop=False), PROMPTS[:3], n)
    for b in (0, 1, 3):
        cfg = EngineConfig(**RULE, early_stop=False, draft_budget=b, **METHODS["spiffy"])
        outs = _batched(llm, cfg, PROMPTS[:3], n)
        for o, v in zip(outs, van):
            assert o.token_ids == v.token_ids
            assert max(o.stats.extra["draft_budgets"]) <= b
            if b == 0:
                assert o.stats.nfe == v.stats.nfe and o.stats.extra["drafts_verified"] == 0
    full = _batched(llm, EngineConfig(**RULE, early_stop=False, draft_budget=64, **METHODS["spiffy"]), PROMPTS[:3], n)
    assert sum(o.stats.nfe for o in full) < sum(o.stats.nfe for o in van)  # teeth: drafts do save forwards


def test_draft_budget_validation():
    for bad in (-1, 1.5, True, "many", None):
        with pytest.raises(ParamsError, match="draft_budget must be 'auto' or an integer >= 0"):
            EngineConfig(draft_budget=bad)
    assert EngineConfig().draft_budget == "auto"
    assert EngineConfig(draft_budget="3").draft_budget == 3 and EngineConfig(draft_budget=0).draft_budget == 0


# ---------------------------------------------------------------------------- picks are arguments
CAUSAL = {"ar": {}, "linear_spec": {}, "linear_spec_multi": dict(branches=4),
          "linear_specfold": dict(branches=4, delta=0.0)}


@pytest.mark.parametrize("budget", ["auto", 2])
def test_picks_are_arguments(checkpoint, tmp_path, budget, monkeypatch):
    """Every method (block and causal), batched with staggered joins and an abort, under scripted
    arms: after every step each running request has the attributes of a request that never met the
    chooser, and its program state the fields of its type, nothing more. Every verification that
    runs was proposed once in its step, and no request proposes twice in a step."""
    from collections import Counter
    from dataclasses import fields

    from specfold.engine.request import Request
    from tests.causal_helpers import nld_checkpoint
    _scripted(monkeypatch)
    block = _llm(checkpoint)
    causal = LLM(nld_checkpoint(tmp_path, focus=2.0, mask_like=15, mask_mix=0.7, layer_scale=0.6), dtype="float64",
                 overrides={"stop_token_ids": [94]})
    never = set(vars(Request("r", [1], SamplingParams(), EngineConfig(), set())))
    runs = [(block, dict(method="vanilla", **RULE))]
    runs += [(block, dict(**RULE, **kw)) for kw in METHODS.values()]
    runs += [(causal, dict(method=m, **kw)) for m, kw in CAUSAL.items()]
    for llm, kw in runs:
        eng = llm.engine(EngineConfig(draft_budget=budget, **kw))
        calls, proposals = Counter(), [0]
        propose, run = getattr(eng.program, "propose", None), eng.runner.run

        def spy_propose(req):
            calls[req.id] += 1
            p = propose(req)
            proposals[0] += p is not None
            return p

        def spy_run(jobs):
            assert proposals[0] == sum(j.kind == "verify" for j in jobs) and max(calls.values(), default=1) == 1
            return run(jobs)
        if propose is not None:
            eng.program.propose = spy_propose
            eng.runner.run = spy_run
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


@pytest.mark.parametrize("budget", ["auto", 2])
def test_the_row_budget_is_the_schedulers(checkpoint, budget, monkeypatch):
    """A row budget of two windows (16 rows) for 5 requests: the chooser picks drafts without it, and
    the scheduler defers the requests whose jobs do not fit (the first always runs), so no step runs
    more rows than the budget unless it runs one request alone. Tokens are vanilla's."""
    _scripted(monkeypatch)
    llm = _llm(checkpoint)
    cfg = EngineConfig(**RULE, draft_budget=budget, max_num_batched_tokens=16, **METHODS["spiffy"])
    want = _batched(llm, EngineConfig(**RULE), PROMPTS, MAX_NEW)
    eng = llm.engine(cfg)
    select, deferred = eng.scheduler.select, [0]

    def spy(plans):
        chosen = select(plans)
        assert len(chosen) == 1 or sum(j.rows for _, jobs in chosen for j in jobs) <= 16
        deferred[0] += len(plans) - len(chosen)
        return chosen
    eng.scheduler.select = spy
    ids = [eng.add_request(p, SamplingParams(max_new_tokens=n, seed=i))
           for i, (p, n) in enumerate(zip(PROMPTS, MAX_NEW))]
    outs = {}
    while eng.has_unfinished():
        outs.update((d.request_id, d.output) for d in eng.step() if d.finished)
    assert [outs[r].token_ids for r in ids] == [w.token_ids for w in want]
    assert deferred[0] > 0 and sum(outs[r].stats.extra["drafts_verified"] for r in ids) > 0


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
