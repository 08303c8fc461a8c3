"""Draft budgets: which drafts each request verifies in this step (`EngineConfig.draft_budget`).

- An integer N: every verification verifies the first N drafts of its policy's list (a prefix is
  closed under parents); 0 = none (the policy is not even asked).
- "auto": one choice for the whole step, across all requests, that maximises the step's expected
  committed tokens per second, E[tokens] / predicted seconds.

The model of expected tokens. A verification of a root state s and a set S of drafts (closed under
parents) costs one forward; the rule then advances from s, and again from every next state whose
scores the forward stored, until it reaches a state that was not verified. The root's step always
happens: it is worth min(τ, m_s) tokens, τ the mean tokens per rule step (acceptance.py) and m_s the
masks the current block has left. Each draft i in S is *reached* (hit) with probability P_i
(acceptance.py: calibration prior, refined by the hits counted online; optimistic by one posterior
deviation, so a node is tried until it is known not to pay) and then saves a whole rule step, worth
min(τ, m_i) tokens, m_i the masks its state leaves (0 when its state completes the block: reaching it
saves nothing). So E[tokens | S] = Σ_roots min(τ, m_s) + Σ_{i∈S} P_i · min(τ, m_i). Hits of a
node need its ancestors' states stored, which closure under parents guarantees, so P_i is the
node's own marginal rate. Requests that prefill or commit add time and no tokens.

The cost: the step's `Shape` (rows, attention work, head rows, folded rows) priced by the cost model
(cost.py); a draft adds its window's rows (a folded one only (1 - ρ) of them, ρ the running fold ratio,
plus its fold terms), its attention and its own head rows.

The choice. Each draft gets a density P_i·min(τ, m_i) / its marginal cost at the step's base shape;
a child's key is capped at its parent's, so sorting by key (ties: list order) is an order in which every
prefix is closed under parents. The step's ratio is evaluated exactly at every prefix of that order
(the cost is not linear: rows are cheaper in bulk), and the best prefix is taken (the empty one
included: no drafts when none pays). Before drafting, the same choice runs on the policy's graph
nodes with optimistic values (m_i = m_s): a request whose nodes cannot pay even so is not drafted
at all. Host only: integers and floats, no tensor is read.

Invariants: a pick is closed under parents; budgets change which states are verified, never the
rule's decisions, so tokens are those of vanilla for every lossless method.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from specfold.decoding.jobs import Job
from specfold.decoding.proposal import Proposal
from specfold.engine.cost import CostModel, Shape, cost_model_for

RHO_START = 0.5  # fold ratio assumed before the first folded verification
RHO_WEIGHT = 0.05  # EMA weight of a step's fold ratio


@dataclass(slots=True)
class _Item:
    req: int  # index into the step's live proposals
    i: int  # draft (or graph node) index into the proposal's list
    parent: int  # the parent's index in the same list (-1: the root)
    value: float  # expected tokens
    delta: Shape  # what it adds to the step's shape
    rows: int  # token rows it adds (the row budget)


def job_shape(job: Job, folded: bool, rho: float) -> Shape:
    """The cost features of one job; `folded`: a verification that goes through the folded verifier."""
    if job.kind == "reuse":
        return Shape()
    B, T = len(job.tokens), job.width
    kv = job.start if job.cache is not None else 0
    attn = B * T * (kv + T)
    if folded and B > 1:
        D = (B - 1) * T
        return Shape(T + (1.0 - rho) * D, attn, job.head_rows, D, 1)
    return Shape(B * T, attn, job.head_rows)


class BudgetChooser:
    def __init__(self, config, model, spec, program):
        self.budget = config.draft_budget
        self.auto = self.budget == "auto"
        self.model, self.spec, self.program = model, spec, program
        v = program.verifier
        self.folded = v is not None and not getattr(v, "packs_with_model", True)
        self.acceptance = getattr(program, "acceptance", None)
        self.max_seqs, self.max_rows = config.max_num_seqs, config.max_num_batched_tokens
        self.cost: CostModel | None = None
        if self.auto and self.acceptance is not None:  # start-up calibration (or the cached one)
            W = config.block_size or 16
            nodes = len(program.draft_tree() or [0] * 8)
            self.cost = cost_model_for(model, spec, program.verifier, W,
                                       min(self.max_rows, self.max_seqs * (1 + nodes) * W))
        self.rho = RHO_START
        self.chosen = Counter()  # drafts verified per verification -> count (this engine)
        self.steps = 0
        self.predicted = self.measured = self.abs_err = 0.0
        self._last: float | None = None

    # ------------------------------------------------------------------ the choice
    def choose(self, reqs: list, props: list[Proposal], base: list[Job]) -> float | None:
        """Set `req.draft_pick` (block programs) or `req.draft_budget` (causal ones) for every request
        of this step; returns the predicted seconds of the step (auto only)."""
        self._last = None
        if not self.auto:
            for req, p in zip(reqs, props):
                self._fixed(req, p)
            return None
        for req in reqs:
            req.draft_budget = None  # causal programs: their configured branches
        live = [(r, p) for r, p in zip(reqs, props) if p is not None]
        if not live or self.cost is None:
            for r, _ in live:
                r.draft_pick = []
            return None
        F0 = self._base(base, [p for _, p in live])
        tau = self.acceptance.tau
        parents = self.program.draft_tree()
        if parents is None:  # a policy without a graph: every request that may draft is drafted
            wanted = {k for k, (_, p) in enumerate(live) if p.nodes}
        else:  # graph nodes with optimistic values decide who is drafted at all
            wanted = {it.req for it in self._best(F0, live, [self._node_items(k, p, tau, parents)
                                                               for k, (_, p) in enumerate(live)])}
        items = [self._draft_items(k, p, tau) if k in wanted else [] for k, (_, p) in enumerate(live)]
        best = self._best(F0, live, items) if wanted else []
        picks: dict[int, list[int]] = {k: [] for k in range(len(live))}
        F = F0
        for it in best:
            picks[it.req].append(it.i)
            F = F.plus(it.delta)
        for k, (r, _) in enumerate(live):
            r.draft_pick = sorted(picks[k])
        self._last = self.cost.predict(F)
        return self._last

    def _fixed(self, req, p: Proposal | None) -> None:
        n = int(self.budget)
        req.draft_budget = n
        if p is None:
            return
        if n == 0 or not p.nodes:
            req.draft_pick = []
        elif n >= p.nodes:
            req.draft_pick = None
        else:
            req.draft_pick = list(range(min(n, len(p.drafts))))

    def _base(self, base: list[Job], props: list[Proposal]) -> Shape:
        F = Shape()
        for j in base:
            F = F.plus(job_shape(j, self.folded, self.rho))
        for p in props:
            F = F.plus(Shape(p.width, p.width * (p.kv + p.width), p.root_rows))
        return F

    def _delta(self, p: Proposal, head: float) -> Shape:
        W = p.width
        attn = W * (p.kv + W)
        if self.folded:
            return Shape((1.0 - self.rho) * W, attn, head, W, 1)
        return Shape(W, attn, head)

    def _node_items(self, k: int, p: Proposal, tau: float, parents: list[int]) -> list[_Item]:
        """Optimistic items for the policy's graph nodes (before drafting): every node may fill the
        block's remaining masks."""
        v, acc, d = min(tau, p.masked), self.acceptance, self._delta(p, p.root_rows)
        return [_Item(k, n - 1, par - 1, acc.optimistic(n) * v, d, p.width)
                for n, par in enumerate(parents[: p.nodes], start=1)]

    def _draft_items(self, k: int, p: Proposal, tau: float) -> list[_Item]:
        acc, out = self.acceptance, []
        for i, (d, m) in enumerate(zip(p.drafts, p.masks_left())):
            head = max(1, p.root_rows - (p.masked - m))
            out.append(_Item(k, i, d.parent - 1, acc.optimistic(d.node) * min(tau, m), self._delta(p, head), p.width))
        return out

    def _best(self, F0: Shape, live, per_req: list[list[_Item]]) -> list[_Item]:
        """The best prefix, by the exact step ratio, of every item sorted by parent-capped density."""
        cost = self.cost
        T0 = cost.predict(F0)
        V0 = sum(min(self.acceptance.tau, p.masked) for _, p in live)
        order: list[tuple[float, int, int, _Item]] = []
        for k, items in enumerate(per_req):
            keys: list[float] = []
            for j, it in enumerate(items):
                key = it.value / max(cost.predict(F0.plus(it.delta)) - T0, 1e-12)
                if it.parent >= 0:
                    key = min(key, keys[it.parent])
                keys.append(key)
                order.append((key, k, j, it))
        order.sort(key=lambda x: (-x[0], x[1], x[2]))
        best, best_n, V, F, rows = V0 / T0, 0, V0, F0, 0
        for n, (_, _, _, it) in enumerate(order, start=1):
            rows += it.rows
            if rows + F0.rows > self.max_rows:
                break
            F = F.plus(it.delta)
            V += it.value
            r = V / cost.predict(F)
            if r > best:
                best, best_n = r, n
        return [it for *_, it in order[:best_n]]

    # ------------------------------------------------------------------ after the step
    def observe(self, jobs: list[Job], seconds: float, results: list) -> None:
        """The measured time of the step's runner call refines the cost model; fold counts the ratio."""
        if not self.auto or self.cost is None:
            return
        folded = positions = 0
        for r in results:
            st = getattr(r, "stats", None)
            if st and "folded" in st:
                folded += sum(st["folded"])
                positions += sum(st["positions"])
        F = Shape()
        for j in jobs:
            F = F.plus(job_shape(j, self.folded and j.kind == "verify", self.rho))
        if self._last is not None:
            self.steps += 1
            self.predicted += self._last
            self.measured += seconds
            self.abs_err += abs(self._last - seconds)
        self.cost.observe(F, seconds)
        if positions:
            w = RHO_WEIGHT
            self.rho = (1 - w) * self.rho + w * folded / positions

    def record(self, n_drafts: int) -> None:
        self.chosen[n_drafts] += 1

    def report(self) -> dict:
        """Engine-wide: the budgets chosen, predicted against measured step time, acceptance."""
        out = {"draft_budget": self.budget, "budgets": dict(sorted(self.chosen.items())), "steps_predicted": self.steps,
               "predicted_seconds": self.predicted, "measured_seconds": self.measured,
               "prediction_error": self.abs_err / self.measured if self.measured else None,
               "fold_ratio_running": self.rho if self.folded else None}
        if self.acceptance is not None:
            out["acceptance"] = self.acceptance.report()
        if self.cost is not None:
            c = self.cost
            out["cost"] = {"grid": list(c.grid), "f": list(c.f), "c_attn": c.c_attn, "c_head": c.c_head,
                           "fold0": c.fold0, "fold_row": c.fold_row, "observations": c.observations,
                           "calibration_seconds": c.calibration_seconds}
        return out
