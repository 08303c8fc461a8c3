"""The chooser's host fast paths (engine/budget.py, engine/cost.py, decoding/proposal.py) take the
decisions of the straightforward versions they replaced, which are kept here as references (the
code of 7dcdf9b, verbatim): the choice over random draft forests and costs (dense and folded deltas;
the references' row budget is left unbounded: the scheduler alone enforces it now), the pre-draft
screen, the cost model's f(rows) and its online
refinement, and a proposal's confidence buckets. Tokens are covered by tests/test_budget.py (auto
budgets give vanilla's tokens in float64, one request at a time and batched)."""
from __future__ import annotations

import copy
import random

from specfold.decoding.drafts.acceptance import bucket
from specfold.decoding.plugins import Draft
from specfold.decoding.proposal import Proposal
from specfold.engine import budget as B
from specfold.engine.budget import MARGIN, BudgetChooser, best_closure
from specfold.engine.cost import CostModel, Shape


# ------------------------------------------------------------------ references (7dcdf9b)
def _refbest_closure(c: CostModel, F0: Shape, V0: float, per_req: list[list[tuple]], deltas: list[Shape],
                 max_rows: float = float("inf"), iterations: int = 8) -> list[tuple[int, int]]:
    """The choice, by Dinkelbach's method for ratios: with λ the best step ratio found so far (start:
    no drafts, V0 / T0), every item weighs (expected tokens) - λ·(marginal seconds at the current
    choice), and the heaviest set closed under parents is found per request by one pass over its
    tree (a node is worth its weight plus its children's positive subtree worths; it is taken when
    its subtree is worth more than nothing and its parent is taken); the new set's exact ratio
    (V0 + Σ tokens) / predicted seconds becomes λ, until it stops improving. Exact for linear costs;
    with the sub-linear f it re-linearises at each choice. `per_req[k]`: request k's items (expected
    tokens, parent item index or -1, head rows), parents first; `deltas[k]`: what one of its drafts
    adds, head rows apart -> the chosen (request, item index) pairs. Run from two linearisations (no
    drafts, every draft), the better kept."""
    every = _ref_fit([(k, j) for k, items in enumerate(per_req) for j in range(len(items))], per_req, deltas, F0.rows, max_rows)
    G, V = _ref_shape(F0, V0, every, per_req, deltas)
    best, chosen = V0 / c.predict(F0, host=True), []
    if V / c.predict(G, host=True) > best:
        best, chosen = V / c.predict(G, host=True), every
    r, pre = _ref_best_prefix(c, F0, V0, per_req, deltas, max_rows)
    if r > best:
        best, chosen = r, pre
    # Dinkelbach linearised at no drafts, at every draft and at the best prefix (f is sub-linear:
    # rows are cheaper in bulk, so the linearisation point matters)
    for start in (F0, G, _ref_shape(F0, V0, pre, per_req, deltas)[0]):
        best, chosen = _ref_dinkelbach(c, F0, V0, per_req, deltas, max_rows, iterations, start, best, chosen)
    return chosen


def _ref_best_prefix(c, F0, V0, per_req, deltas, max_rows) -> tuple[float, list[tuple[int, int]]]:
    """Items in an order whose every prefix is closed (groups of parent + denser descendants, sorted
    by density at the base shape, each in list order) -> the best exact ratio over its prefixes."""
    order: list[tuple] = []
    for k, items in enumerate(per_req):
        if not items:
            continue
        d = deltas[k]
        marginal = (c.f_of(F0.rows + d.rows) - c.f_of(F0.rows) + c.c_attn * d.attn + c.fold_row * d.fold
                    + c.host_draft * d.drafts + (c.fold0 if d.fold_calls and not F0.fold_calls else 0.0))
        for g_v, g_c, members in _ref_groups(items, [max(marginal + c.c_head * h, 1e-12) for _, _, h in items]):
            for j in members:
                order.append((-g_v / g_c, k, members[0], j))
    order.sort()
    pick = _ref_fit([(k, j) for _, k, _, j in order], per_req, deltas, F0.rows, max_rows)
    F, V = F0, V0
    best, best_n = V0 / c.predict(F0, host=True), 0
    for n, (k, j) in enumerate(pick, start=1):
        d = deltas[k]
        v, _, h = per_req[k][j]
        F, V = F.plus(Shape(d.rows, d.attn, h, d.fold, d.fold_calls, 0, d.drafts)), V + v
        t = c.predict(F, host=True)
        if V / t > best:
            best, best_n = V / t, n
    return best, pick[:best_n]


def _ref_groups(items: list[tuple], cost: list[float]) -> list[tuple[float, float, list[int]]]:
    """Merge every group denser than its parent group into it, until densities never rise down the
    tree -> (tokens, seconds, members in list order) per group."""
    head = list(range(len(items)))  # item -> its group's head item
    val = [v for v, _, _ in items]
    sec = list(cost)
    mem = [[j] for j in range(len(items))]

    def find(j: int) -> int:
        while head[j] != j:
            j = head[j]
        return j
    merged = True
    while merged:
        merged = False
        for g in range(len(items)):
            if head[g] != g or items[g][1] < 0:
                continue
            p = find(items[g][1])
            if val[g] * sec[p] > val[p] * sec[g]:  # denser than its parent group: merge
                head[g] = p
                val[p] += val[g]
                sec[p] += sec[g]
                mem[p] = sorted(mem[p] + mem[g])
                merged = True
    return [(val[g], sec[g], mem[g]) for g in range(len(items)) if head[g] == g]


def _ref_dinkelbach(c, F0, V0, per_req, deltas, max_rows, iterations, F, best, chosen):
    for _ in range(iterations):
        pick = []
        for k, items in enumerate(per_req):
            if not items:
                continue
            d = deltas[k]
            fold0 = c.fold0 if d.fold_calls and not F.fold_calls else 0.0
            marginal = (c.f_of(F.rows + d.rows) - c.f_of(F.rows) + c.c_attn * d.attn + c.fold_row * d.fold
                        + c.host_draft * d.drafts + fold0 / max(1, len(items)))
            w = [v - best * (marginal + c.c_head * h) for v, _, h in items]
            worth = list(w)
            for j in range(len(items) - 1, -1, -1):  # children come after parents: bottom-up
                par = items[j][1]
                if par >= 0 and worth[j] > 0:
                    worth[par] += worth[j]
            taken: set[int] = set()
            for j, (_, par, _) in enumerate(items):
                if worth[j] > 0 and (par < 0 or par in taken):
                    taken.add(j)
                    pick.append((k, j))
        pick = _ref_fit(pick, per_req, deltas, F0.rows, max_rows)
        G, V = _ref_shape(F0, V0, pick, per_req, deltas)
        r = V / c.predict(G, host=True)
        if r <= best * (1 + 1e-12):
            break
        best, chosen, F = r, pick, G
    return best, chosen


def _ref_shape(F0: Shape, V0: float, pick, per_req, deltas) -> tuple[Shape, float]:
    F, V = F0, V0
    for k, j in pick:
        d = deltas[k]
        v, _, h = per_req[k][j]
        F, V = F.plus(Shape(d.rows, d.attn, h, d.fold, d.fold_calls, 0, d.drafts)), V + v
    return F, V


def _ref_fit(pick, per_req, deltas, rows0: float, max_rows: float):
    """The pick cut to the row budget: drafts in list order, per request in turn (closed)."""
    rows = rows0 + sum((deltas[k].fold or deltas[k].rows) for k, _ in pick)
    if rows <= max_rows:
        return pick
    out, rows = [], rows0
    for k, j in pick:
        r = deltas[k].fold or deltas[k].rows
        if rows + r <= max_rows:
            out.append((k, j))
            rows += r
    keep = set(out)
    return [(k, j) for k, j in out if per_req[k][j][1] < 0 or (k, per_req[k][j][1]) in keep]


class _RefCost(CostModel):
    """CostModel with the reference f(rows) (linear search) and online refinement."""

    def _interp(self, rows):
        g = self.grid
        i = 0
        while i < len(g) - 2 and rows > g[i + 1]:
            i += 1
        return i, (rows - g[i]) / (g[i + 1] - g[i])

    def f_of(self, rows):
        if rows <= 0:
            return 0.0
        i, w = self._interp(rows)
        return max(1e-7, (1 - w) * self.f[i] + w * self.f[i + 1])

    def observe(self, s: Shape, seconds: float) -> None:
        """Refine the parameters this step used from its measured time: a normalised LMS step where
        each parameter moves in proportion to its own size (relative updates)."""
        if s.rows <= 0 or seconds <= 0:
            return
        if s.rows > 1.5 * self.grid[-1]:  # past the calibrated range: a measured point of f
            rest = self.c_attn * s.attn + self.c_head * s.head + ((self.fold0 + self.fold_row * s.fold) if s.fold_calls else 0)
            self.seen = self.seen + [0.0] * (len(self.f) - len(self.seen)) + [1.0]
            self.grid.append(int(round(s.rows)))
            self.f.append(max(self.f[-1], seconds - rest))
            self.observations += 1
            return
        pred = self.predict(s)
        e = max(-0.5 * pred, min(0.5 * pred, seconds - pred))
        e *= 2 * (0.3 if e > 0 else 1 - 0.3)
        i, w = self._interp(s.rows)
        fold = 1.0 if s.fold_calls else 0.0
        terms = [("f", i, 1.0 - w), ("f", i + 1, w), ("c_attn", None, s.attn), ("c_head", None, s.head),
                 ("fold0", None, fold), ("fold_row", None, s.fold * fold)]
        vals = [(n, k, x, max(abs(self._get(n, k)), _FLOORS[n])) for n, k, x in terms if x]
        den = sum((x * sc) ** 2 for _, _, x, sc in vals)
        if den <= 0:
            return
        seen = self.seen + [0.0] * (len(self.f) - len(self.seen))  # per point: observations' weights
        for n, k, x, sc in vals:
            eta = max(0.15, 0.5 / (1 + seen[k])) if n == "f" else 0.15  # a rarely seen point moves faster
            self._set(n, k, max(_FLOORS[n] if n == "f" else 0.0, self._get(n, k) + eta * e * x * sc * sc / den))
            if n == "f":
                seen[k] += abs(x)
        self.seen = seen
        for k in range(1, len(self.f)):  # more rows never cost less
            self.f[k] = max(self.f[k], self.f[k - 1])
        self.observations += 1

    def observe_host(self, s: Shape, seconds: float) -> None:
        """The host terms' refinement (the code of ebb24c0, with the scales' lower bound of cost.HOST_SHARE)."""
        if seconds <= 0:
            return
        pred = self.host_of(s)
        e = max(-0.5 * max(pred, seconds), min(0.5 * max(pred, seconds), seconds - pred))
        e *= 2 * (0.3 if e > 0 else 1 - 0.3)
        lo = 0.1 * max(pred, seconds)  # each scale at least a tenth of the step's host time
        vals = [(n, x, max(getattr(self, n), _FLOORS[n], lo)) for n, x in
                (("host0", 1.0), ("host_job", s.jobs), ("host_draft", s.drafts), ("host_made", s.made)) if x]
        den = sum((x * sc) ** 2 for _, x, sc in vals)
        for n, x, sc in vals:
            setattr(self, n, max(0.0, getattr(self, n) + 0.15 * e * x * sc * sc / den))
        self.host_observations += 1

    def _get(self, name: str, idx: int | None) -> float:
        return self.f[idx] if name == "f" else getattr(self, name)

    def _set(self, name: str, idx: int | None, v: float) -> None:
        if name == "f":
            self.f[idx] = v
        else:
            setattr(self, name, v)


_FLOORS = {"f": 1e-6, "c_attn": 1e-13, "c_head": 1e-9, "fold0": 1e-6, "fold_row": 1e-9,
           "host0": 1e-6, "host_job": 1e-6, "host_draft": 1e-7, "host_made": 1e-7}


def _cost(rng, cls=CostModel):
    base = rng.uniform(0.5, 2.0)
    f = [base]
    for _ in range(rng.randint(1, 6)):
        f.append(f[-1] + rng.uniform(0.0, 1.2) * base)  # sub-linear, linear or super-linear pieces
    grid = [8 * 2 ** i for i in range(len(f))]
    return cls(grid, f, rng.uniform(0, 1e-5), rng.uniform(0, 0.02), fold0=rng.uniform(0, 0.2),
               fold_row=rng.uniform(0, 0.01), host0=rng.uniform(0, 0.1), host_job=rng.uniform(0, 0.05),
               host_draft=rng.uniform(0, 0.05))


def _instance(rng):
    per_req, deltas = [], []
    folded = rng.random() < 0.4
    for _ in range(rng.randint(1, 6)):
        items = [(rng.uniform(0, 1) if rng.random() > 0.1 else 0.0, rng.randint(-1, j - 1), rng.randint(1, 8))
                 for j in range(rng.randint(0, 7))]
        per_req.append(items)
        W = rng.choice([4, 8, 16])
        kv = rng.randint(0, 200)
        rho = rng.uniform(0, 1)
        deltas.append(Shape((1 - rho) * W, W * (kv + W), 0.0, W, 1, 0, 1) if folded else
                      Shape(W, W * (kv + W), 0.0, drafts=1))
    n = len(per_req)
    F0 = Shape(16.0 * n, 3000.0 * n, 4.0 * n, 0.0, 0, float(n), 0.0)
    V0 = float(n) * rng.uniform(0.5, 2)
    return F0, V0, per_req, deltas


def test_choice_is_the_reference_choice():
    """Over 3000 random instances the fast choice is the reference's, pair for pair, wherever two or
    more requests have drafts (one request's choice is exact: the next test)."""
    rng = random.Random(2323)
    differ = nonempty = compared = 0
    for _ in range(3000):
        c = _cost(rng)
        F0, V0, per_req, deltas = _instance(rng)
        if sum(1 for items in per_req if items) < 2:
            continue
        compared += 1
        want = _refbest_closure(c, F0, V0, per_req, deltas)
        got = best_closure(c, F0, V0, per_req, deltas, t0=c.predict(F0, host=True))
        differ += got != want
        nonempty += bool(want)
    assert differ == 0
    assert compared > 2000 and 0.1 * compared < nonempty < compared  # both outcomes exercised


def _step_ratio(c, F0, V0, items, d, sel):
    F, V = F0, V0
    for j in sel:
        v, _, h = items[j]
        F, V = F.plus(Shape(d.rows, d.attn, h, d.fold, d.fold_calls, 0, d.drafts)), V + v
    return V / c.predict(F, host=True)


def _brute_one(c, F0, V0, items, d) -> float:
    """The best ratio over every closed set of one request's items."""
    best = V0 / c.predict(F0, host=True)
    for mask in range(1, 1 << len(items)):
        sel = [j for j in range(len(items)) if mask >> j & 1]
        if all(items[j][1] < 0 or items[j][1] in sel for j in sel):
            best = max(best, _step_ratio(c, F0, V0, items, d, sel))
    return best


def test_one_request_is_chosen_exactly():
    """Where a single request has drafts (batch 1: FreeDave's chain, a Spiffy graph), the choice is
    the best of every closed set (brute force), never worse than the
    reference's linearisations, on random trees of up to 9 drafts, among them stars that only the
    pruning of drafts that cannot pay brings under the enumeration's limit of 64 closed sets (a
    tree still above it is left to the linearisations)."""
    rng = random.Random(4141)
    exact = nonempty = 0
    for trial in range(2000):
        c = _cost(rng)
        F0, V0, per_req, deltas = _instance(rng)
        k = rng.randrange(len(per_req))
        n = rng.randint(1, 9)
        star = trial % 3 == 0  # node 0 the root, every other a child of it (a calibrated Spiffy graph)
        items = [(rng.uniform(0, 1) if rng.random() > 0.1 else 0.0,
                  (-1 if j == 0 else 0) if star else rng.randint(-1, j - 1), rng.randint(1, 8)) for j in range(n)]
        if star:  # most children rarely reached, as calibrated graphs have them
            items = [(v * (1 if j < 3 else 0.05), par, h) for j, (v, par, h) in enumerate(items)]
        per_req = [items if i == k else [] for i in range(len(per_req))]
        got = best_closure(c, F0, V0, per_req, deltas, t0=c.predict(F0, host=True))
        sel = sorted(j for _, j in got)
        assert all(kk == k for kk, _ in got) and len(set(sel)) == len(sel)
        assert all(items[j][1] < 0 or items[j][1] in sel for j in sel)
        r, want = _step_ratio(c, F0, V0, items, deltas[k], sel), _brute_one(c, F0, V0, items, deltas[k])
        ref = _refbest_closure(c, F0, V0, per_req, deltas)
        r_ref = _step_ratio(c, F0, V0, items, deltas[k], [j for _, j in ref])
        assert r >= r_ref * (1 - 1e-12)
        d = deltas[k]
        enumerated = B._one_tree(B._Memo(c), B._tup(F0), V0, c.predict(F0, host=True), items,
                                 (d.rows, d.attn, d.fold, d.fold_calls, d.drafts))
        if enumerated is not None:
            assert abs(r - want) <= 1e-12 * want, (r, want)
            exact += 1
        nonempty += bool(sel)
    assert exact > 1500  # the rest: trees of over 64 closed sets after pruning, the reference's choice
    assert 200 < nonempty < 1900


def test_the_pruned_enumeration_gives_way_on_large_trees():
    """A tree whose closed sets stay above the limit after pruning is left to the linearisations
    (the reference's choice), and pruning keeps every draft that could pay."""
    c = CostModel([16, 32, 64, 128, 256], [1.0, 1.05, 1.1, 1.2, 1.4], 0.0, 0.0)  # drafts nearly free
    star = [(0.9, -1, 1)] + [(0.5, 0, 1)] * 8  # 2**8 + 1 closed sets, every one worth taking
    F0, d = Shape(16, 0, 1), Shape(16, 0, 0, drafts=1)
    assert B._one_tree(B._Memo(c), B._tup(F0), 1.0, c.predict(F0, host=True), star,
                       (d.rows, d.attn, d.fold, d.fold_calls, d.drafts)) is None
    got = best_closure(c, F0, 1.0, [star], [d], t0=c.predict(F0, host=True))
    assert got == _refbest_closure(c, F0, 1.0, [star], [d], float("inf")) == [(0, j) for j in range(9)]
    worthless = [(0.9, -1, 1)] + [(0.5, 0, 1)] * 2 + [(1e-6, 0, 1)] * 6  # 6 drafts that cannot pay
    assert B._keep(worthless, 0.05, 0.0, 1.0 / c.predict(F0, host=True)) == [True] * 3 + [False] * 6
    assert best_closure(c, F0, 1.0, [worthless], [d], t0=c.predict(F0, host=True)) == [(0, 0), (0, 1), (0, 2)]


def test_a_single_chain_is_chosen_as_the_reference_chooses():
    """One request whose drafts form a chain (FreeDave at batch 1), where the fast choice skips the
    linearisations: over 3000 random instances it is the reference's choice, and the best ratio over
    every prefix of the chain."""
    rng = random.Random(2929)
    nonempty = 0
    for _ in range(3000):
        c = _cost(rng)
        F0, V0, per_req, deltas = _instance(rng)
        k = rng.randrange(len(per_req))
        chain = [(rng.uniform(0, 1) if rng.random() > 0.1 else 0.0, j - 1, rng.randint(1, 8)) for j in range(rng.randint(1, 8))]
        per_req = [chain if i == k else [] for i in range(len(per_req))]
        want = _refbest_closure(c, F0, V0, per_req, deltas)
        got = best_closure(c, F0, V0, per_req, deltas, t0=c.predict(F0, host=True))
        assert got == want
        nonempty += bool(got)
        F, V, ratios = F0, V0, [V0 / c.predict(F0, host=True)]
        for j, (v, _, h) in enumerate(chain):
            d = deltas[k]
            F, V = F.plus(Shape(d.rows, d.attn, h, d.fold, d.fold_calls, 0, d.drafts)), V + v
            ratios.append(V / c.predict(F, host=True))
        n = len(got)
        assert got == [(k, j) for j in range(n)] and ratios[n] >= max(ratios) * (1 - 1e-12)
    assert 300 < nonempty < 2900


def test_cost_model_fast_paths_match_the_reference():
    rng = random.Random(19)
    for _ in range(300):
        a = _cost(rng)
        b = _RefCost(list(a.grid), list(a.f), a.c_attn, a.c_head, a.fold0, a.fold_row)
        a = CostModel(list(a.grid), list(a.f), a.c_attn, a.c_head, a.fold0, a.fold_row)
        for _ in range(40):
            rows = rng.choice([rng.uniform(-2, 1.2 * a.grid[-1]), float(rng.choice(a.grid)), rng.uniform(0, 4)])
            assert a.f_of(rows) == b.f_of(rows)
            fc = rng.random() < 0.5
            s = Shape(max(1.0, rows), rng.uniform(0, 1e5), rng.randint(0, 64), rng.uniform(0, 64) if fc else 0.0,
                      int(fc))
            sec = a.predict(s) * rng.uniform(0.3, 2.0)
            a.observe(s, sec)
            _RefCost.observe(b, s, sec)
            assert (a.grid, a.f, a.c_attn, a.c_head, a.fold0, a.fold_row, a.seen) == \
                (b.grid, b.f, b.c_attn, b.c_head, b.fold0, b.fold_row, b.seen)


def test_host_refinement_matches_the_reference():
    """The host terms move exactly as the reference's, from zero and from random starts."""
    rng = random.Random(23)
    for trial in range(300):
        h = [0.0] * 4 if trial % 3 == 0 else [rng.uniform(0, 1e-3) for _ in range(4)]
        a = CostModel([8, 16], [1.0, 2.0], host0=h[0], host_job=h[1], host_draft=h[2], host_made=h[3])
        b = _RefCost([8, 16], [1.0, 2.0], host0=h[0], host_job=h[1], host_draft=h[2], host_made=h[3])
        for _ in range(40):
            jobs = rng.randint(0, 16)
            s = Shape(16.0, 0.0, 0.0, jobs=float(jobs), drafts=float(rng.choice([0, 0, rng.randint(1, 40)])),
                      made=float(rng.choice([0, rng.randint(0, jobs)])))
            sec = rng.choice([0.0, -1e-4, rng.uniform(1e-6, 3e-3)])
            a.observe_host(s, sec)
            _RefCost.observe_host(b, s, sec)
            assert (a.host0, a.host_job, a.host_draft, a.host_made, a.host_observations) == \
                (b.host0, b.host_job, b.host_draft, b.host_made, b.host_observations)
        assert a.host0 + a.host_job + a.host_draft + a.host_made > 0  # it learnt something


def _ref_buckets(p):
    conf = {}
    st = p.parent
    for sc in ((st.ahead, st.scored) if st is not None else ()):
        if sc is not None:
            conf.update(zip(sc.positions, sc.conf))
    root, M, n = p.root, p.mask_id, len(p.root)
    return [bucket(min((conf.get(i, 1.0) for i in range(len(d.tokens)) if d.tokens[i] != M and (i >= n or root[i] == M)),
                       default=1.0), p.kind) for d in p.drafts]


class _Scores:
    def __init__(self, positions, conf):
        self.positions, self.conf = positions, conf


class _Step:
    def __init__(self, ahead, scored):
        self.ahead, self.scored = ahead, scored


def test_buckets_match_the_reference():
    rng = random.Random(5)
    M = 99
    for _ in range(500):
        n = rng.randint(1, 12)
        root = [M if rng.random() < 0.6 else rng.randint(0, 9) for _ in range(n)]
        drafts = []
        for _ in range(rng.randint(0, 6)):
            L = rng.randint(1, n + 6)
            drafts.append(Draft([root[i] if i < n and root[i] != M else (M if rng.random() < 0.4 else rng.randint(0, 9))
                                 for i in range(L)], 0, 1))
        pos = rng.sample(range(n + 6), rng.randint(0, n + 6))
        st = _Step(_Scores(pos[: len(pos) // 2], [rng.random() for _ in pos[: len(pos) // 2]]),
                   _Scores(pos[len(pos) // 2:], [rng.random() for _ in pos[len(pos) // 2:]])) \
            if rng.random() < 0.9 else None
        p = Proposal(n, 0, 1, 1, 0, len(drafts), make=lambda d=drafts: d, mask_id=M, root=root, parent=st)
        assert p.buckets() == _ref_buckets(copy.copy(p))


def test_screen_is_the_reference_screen():
    """The pre-draft screen (which requests are drafted at all) against its reference formula, dense
    and folded, one width and mixed widths, with and without a cost of making a request's drafts;
    requests it is told to skip are not screened, and the others' verdicts do not change."""
    rng = random.Random(7)

    class Acc:
        def __init__(self, rates, tau):
            self.rates, self.tau = rates, tau

        def p(self, i, b=None):
            return self.rates[i - 1]

        def best(self, n):
            return max(self.p(i) for i in range(1, n + 1))

        def cumulative(self, n):
            r = sorted(self.rates[:n], reverse=True)
            return [sum(r[:j]) for j in range(1, n + 1)]

    for _ in range(1000):
        ch = BudgetChooser.__new__(BudgetChooser)
        ch.cost = _cost(rng)
        ch.cost.host_made = rng.choice([0.0, rng.uniform(0, 0.05)])
        ch.folded = rng.random() < 0.4
        ch.rho = rng.uniform(0, 1)
        ch.acceptance = Acc([rng.uniform(0, 1) for _ in range(8)], rng.uniform(1, 3))
        live = []
        for _ in range(rng.randint(1, 16)):
            W = rng.choice([8, 8, 16])
            live.append((None, Proposal(W, rng.randint(0, 300), rng.randint(1, W), rng.randint(0, W), 0,
                                        rng.choice([0, 3, 7]))))
        F0 = ch._base([], [p for _, p in live])
        parents = [0] * 7
        c, acc, tau = ch.cost, ch.acceptance, ch.acceptance.tau
        # the reference (7dcdf9b)
        n = max(p.nodes for _, p in live)
        want = []
        if n:
            top = max(acc.p(i) for i in range(1, min(n, len(parents)) + 1))
            full = F0
            for _, p in live:
                d = ch._delta(p)
                full = full.plus(Shape(d.rows * p.nodes, d.attn * p.nodes, p.root_rows * p.nodes, d.fold * p.nodes,
                                       d.fold_calls if p.nodes else 0, 0, p.nodes))
            ratio = sum(min(tau, p.masked) for _, p in live) / c.predict(F0, host=True)
            for k, (_, p) in enumerate(live):
                if not p.nodes:
                    continue
                d = ch._delta(p)
                marginal = max(c.f_of(full.rows) - c.f_of(full.rows - d.rows), 1e-12) + c.c_attn * d.attn \
                    + c.fold_row * d.fold + c.c_head + c.host_draft
                u = min(tau, p.masked) * (1 - MARGIN)  # since this change: the items' own discount
                share = 0.0
                if ch.folded and not F0.fold_calls and c.fold0:  # since ac0a119: the folded call's fixed cost
                    share = c.fold0 / len([q for _, q in live if q.nodes])
                share += c.host_made  # since host_made: the request's own making and weighing
                if share:
                    rates = sorted(acc.rates[: min(p.nodes, len(parents))], reverse=True)
                    best = max(u * sum(rates[:j]) / (j * marginal + share)
                               for j in range(1, len(rates) + 1))
                    if best > ratio:
                        want.append(k)
                elif top * u / marginal > ratio:
                    want.append(k)
        assert ch._worth_drafting(F0, live, parents) == want
        V0 = sum(min(tau, p.masked) for _, p in live)
        assert ch._worth_drafting(F0, live, parents, V0 / c.predict(F0, host=True)) == want
        skip = {k for k in range(len(live)) if rng.random() < 0.3}  # drafts that paid last time: not screened
        assert ch._worth_drafting(F0, live, parents, skip=skip) == [k for k in want if k not in skip]


def _ref_job_shape(job, folded: bool, rho: float) -> Shape:
    """One job's cost features (the code of ebb24c0, verbatim)."""
    if job.kind == "reuse":
        return Shape(jobs=1)
    B, T = len(job.tokens), job.width
    kv = job.start if job.cache is not None else 0
    attn = B * T * (kv + T)
    if folded and B > 1:
        D = (B - 1) * T
        return Shape(T + (1.0 - rho) * D, attn, job.head_rows, D, 1, 1, B - 1)
    return Shape(B * T, attn, job.head_rows, jobs=1, drafts=B - 1 if job.kind == "verify" else 0)


def test_step_shape_is_the_sum_of_the_jobs_shapes():
    """A step's shape (summed in floats) is the reference's Shape.plus over each job's, verifications
    folded when the verifier folds (the reference's measured step; its chooser base folded every
    job, which is the same for the block program's one-branch non-verify jobs, checked here too)."""
    from specfold.decoding.jobs import Job
    from specfold.engine.budget import jobs_shape
    rng = random.Random(41)
    cache = object()
    for _ in range(500):
        jobs = []
        for _ in range(rng.randint(0, 6)):
            B, T = rng.randint(1, 5), rng.choice([4, 8, 16])
            kind = rng.choice(["verify", "verify", "prefill", "commit", "reuse"])
            rows_at = sorted(rng.sample(range(B * T), rng.randint(0, B * T))) if rng.random() < 0.7 else None
            jobs.append(Job([[0] * T for _ in range(B)], rng.randint(0, 300), cache if rng.random() < 0.8 else None,
                            rows_at=rows_at, logits_at=[0, 1] if rows_at is None and rng.random() < 0.5 else None,
                            kind=kind))
        rho, folded = rng.uniform(0, 1), rng.random() < 0.5
        want = Shape()
        for j in jobs:
            want = want.plus(_ref_job_shape(j, folded and j.kind == "verify", rho))
        assert jobs_shape(jobs, folded, rho) == want
        one = [j for j in jobs if j.kind == "verify" or len(j.tokens) == 1]  # what a block program makes
        base = Shape()
        for j in one:
            base = base.plus(_ref_job_shape(j, folded, rho))
        assert jobs_shape(one, folded, rho) == base
