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
(acceptance.py: the posterior mean of a calibration prior refined by the hits counted online, per
node and confidence bucket; each discounted by MARGIN) and then saves a whole rule step, worth
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
included: no drafts when none pays); Dinkelbach's method then improves on it (`best_closure`).
Where a single request has drafts (batch 1), its exact best set is found instead: drafts that
cannot pay at any set size are dropped, and every closed set of the rest is evaluated (`_one_tree`).
Before drafting, the same choice runs on the policy's graph nodes with optimistic values
(m_i = m_s): a request whose nodes cannot pay even so is not drafted at all (a request whose drafts
were chosen at its last choice skips this screen), and a request whose drafts were made but none
chosen skips drafting for 1, 3, 7, then 15 steps (reset when drafts are chosen again). After k
steps in a row in which the screen passed no request that could draft, the next min(2^(k-1) - 1, 7)
steps of the whole engine are not evaluated at all (no drafts, nothing predicted or observed), so
that auto costs about what budget 0 costs where drafting does not pay. After EXPLORE_EVERY steps in
a row that verified no draft, the next evaluated step probes: if nothing is chosen, it verifies one
request's most valuable first-level draft, provided the predicted ratio is within EXPLORE_GAP of the
best, and the refinement observes that step (`_probe`: the cost model measures the shape it
refuses). Host only: integers and floats, no tensor is read.

The picks are what `choose` returns (one `Pick` per request that verifies, for the engine to pass
to `plan(req, pick)`); whatever the chooser remembers of a request between steps (its back-off,
whether its drafts paid) is kept here by request id, and forgotten when the request ends
(`forget`). The row budget (`max_num_batched_tokens`) is not the chooser's: the scheduler alone
enforces it, on the jobs built from the picks (scheduler.py). Causal programs (multi-branch LinearSpec) have no proposals: a fixed N caps their
alternative drafts (their config's `draft_budget`), and under "auto" they verify their configured
branches.

Invariants: a pick is closed under parents; budgets change which states are verified, never the
rule's decisions, so tokens are those of vanilla for every lossless method.
"""
from __future__ import annotations

import time
from collections import Counter

from specfold.decoding.jobs import Job
from specfold.decoding.proposal import Pick, Proposal
from specfold.engine.cost import CostModel, Shape, clock_for, cost_model_for, host_seconds, model_seconds

RHO_START = 0.5  # fold ratio assumed before the first folded verification
RHO_WEIGHT = 0.05  # EMA weight of a step's fold ratio
BACKOFF_MAX = 4  # drafting skipped at most 2**4 - 1 steps after drafts that were not chosen
IDLE_BITS, IDLE_MAX = 4, 7  # engine-wide back-off: at most 7 steps skipped between two choices
MARGIN = 0.03  # a draft's expected tokens are discounted by 3 %: a choice within noise verifies fewer
TREE_SETS = 64  # one request's closed sets of drafts, after pruning, are evaluated exactly up to this many
EXPLORE_EVERY, EXPLORE_GAP = 16, 0.1  # after 16 steps in a row that verified no draft, one draft is
# verified if its predicted ratio is within 10 % of the best: the model measures the shape it refuses
REFINE_WARM, REFINE_EVERY = 256, 4  # the cost model refines from every step until it has 256
# observations, then from every 4th predicted step: a refinement costs 25-45 µs of host time after
# a forward (cold caches), about 1 % of a batch-1 step on `tiny`, and every step would pay it


def jobs_shape(jobs: list[Job], folded: bool, rho: float) -> Shape:
    """The cost features of a step's jobs, summed (Shape.plus over each job's own, in plain floats:
    this runs every step). `folded`: verifications go through the folded verifier (every other job
    of a block program has one branch, so it is dense either way)."""
    rows = attn = head = fold = jobs_n = drafts = 0.0
    fold_calls = 0
    for job in jobs:
        kind = job.kind
        jobs_n += 1
        if kind == "reuse":
            continue
        B, T = len(job.tokens), len(job.tokens[0])
        kv = job.start if job.cache is not None else 0
        attn += B * T * (kv + T)
        head += job.head_rows
        if folded and B > 1 and kind == "verify":
            D = (B - 1) * T
            rows += T + (1.0 - rho) * D
            fold += D
            fold_calls = 1
            drafts += B - 1
        else:
            rows += B * T
            if kind == "verify":
                drafts += B - 1
    return Shape(rows, attn, head, fold, fold_calls, jobs_n, drafts)


class BudgetChooser:
    def __init__(self, config, model, spec, program, verifier=None):
        """`model`, `verifier`: what the cost model calibrates on (default the program's verifier;
        under tensor parallelism engine/mirror.py's mirrored pair)."""
        self.budget = config.draft_budget
        self.auto = self.budget == "auto"
        self.model, self.spec, self.program = model, spec, program
        v = program.verifier
        self.folded = v is not None and not getattr(v, "packs_with_model", True)
        self.acceptance = getattr(program, "acceptance", None)
        self.parents = program.draft_tree() if self.acceptance is not None else None  # fixed per program
        self.drafts = self.acceptance is not None  # the program proposes drafts (else: nothing to choose)
        self.cost: CostModel | None = None
        if self.auto and self.acceptance is not None:  # start-up calibration (or the cached one)
            W = config.block_size or 16
            nodes = len(self.parents or [0] * 8)
            self.cost = cost_model_for(model, spec, verifier or program.verifier, W,
                                       min(config.max_num_batched_tokens, config.max_num_seqs * (1 + nodes) * W))
        self.rho = RHO_START
        self.chosen = Counter()  # drafts verified per verification -> count (this engine)
        self.steps = 0
        self.predicted = self.measured = self.abs_err = 0.0
        self._last: float | None = None
        self.clock = clock_for(model.device)  # the clock step costs are measured on (cost.py)
        self._step_t0 = 0.0
        self._model_s = 0.0  # this step's model call on that clock
        self._shape: Shape | None = None  # this step's jobs
        self._idle = [0, 0]  # [steps left to skip, steps in a row the screen passed nobody]: `_idle_after`
        self._ticks = 0  # predicted steps seen by `observe` (every REFINE_EVERY-th refines, once warm)
        self._made = 0  # requests whose drafts this step's choice made and weighed (host work)
        self._dry = 0  # steps in a row, since drafts were last verified, where a request could draft
        self._probed = False  # this step verifies a probe (`_probe`): the refinement observes it
        self.probes = 0
        # per request id: [steps left to skip drafting, refusals in a row] (`_backing_off`), and the
        # requests whose drafts were chosen at their last choice (they skip the pre-draft screen)
        self._backoff: dict[str, list[int]] = {}
        self._paid: set[str] = set()

    # ------------------------------------------------------------------ the choice
    def choose(self, ids: list[str], props: list[Proposal | None],
               base: list[Job]) -> tuple[list[Pick | None], float | None]:
        """The step's requests (their ids), their proposals (None: not verifying) and the jobs of the
        step that are not verifications -> each request's `Pick` (None where it has no proposal), and
        the predicted seconds of the step (auto only)."""
        self._last, self._made, self._probed = None, 0, False
        if not self.auto:
            return [self._fixed(p) for p in props], None
        live = [(r, p) for r, p in zip(ids, props) if p is not None]
        offer = any(p.nodes for _, p in live)  # some request could draft
        if live and self._idle[0] > 0:  # the screen passed nobody in the last steps: `_idle_after`
            self._idle[0] -= 1
            self._dry += offer
            material = self._idle[0] <= 1  # the next choice's drafts are made from it
            return _aligned(props, [Pick(p, [], material) for _, p in live]), None  # not predicted nor observed
        if not live or self.cost is None:
            if self.cost is not None:  # a step of prefills and commits only: predicted all the same
                self._last = self.cost.predict(self._base(base, []), host=True)
            return _aligned(props, [Pick(p, []) for _, p in live]), self._last
        F0 = self._base(base, [p for _, p in live])
        tau, acc = self.acceptance.tau, self.acceptance
        V0 = sum(min(tau, p.masked) for _, p in live)  # the roots' tokens
        T0 = self.cost.predict(F0, host=True)  # the step without drafts
        parents = self.parents
        if parents is None:  # a policy without a graph: every request that may draft is drafted
            wanted = [k for k, (_, p) in enumerate(live) if p.nodes]
        else:  # a request whose drafts were chosen at its last choice skips the screen: they paid
            paid = {k for k, (r, p) in enumerate(live) if p.nodes and r in self._paid}
            wanted = sorted(paid) if len(paid) == len(live) else \
                sorted(paid.union(self._worth_drafting(F0, live, parents, V0 / T0, skip=paid)))
            if offer:  # (a step where each is in its block's first step: no sign)
                self._idle_after(bool(wanted))
        wanted = [k for k in wanted if not self._backing_off(live[k][0])]
        probe = None  # a request whose drafts are made to measure a refused shape: `_probe`
        if offer and self._dry >= EXPLORE_EVERY:
            self._dry = 0
            probe = next(k for k, (_, p) in enumerate(live) if p.nodes)
            if probe not in wanted:
                wanted = sorted(wanted + [probe])
        if wanted:  # their drafts are made and weighed now: host work whatever is then verified
            self._made = len(wanted)
            F0.made = float(len(wanted))
            T0 = self.cost.predict(F0, host=True)
        items: list[list] = [[] for _ in live]
        rate: dict = {}  # (node, bucket) -> acceptance estimate, this step
        keep = 1 - MARGIN
        for k in wanted:
            p = live[k][1]
            add, rows0 = items[k].append, p.root_rows - p.masked
            for d, m, b in zip(p.drafts, p.masks_left(), p.buckets()):
                a = rate.get((d.node, b))
                if a is None:
                    a = rate[(d.node, b)] = acc.p(d.node, b)
                add((a * min(tau, m) * keep, d.parent - 1, max(1, rows0 + m)))
        picks: list[list[int]] = [[] for _ in live]
        for k, j in (self._best(F0, live, items, V0, T0) if wanted else []):
            picks[k].append(j)
        drafting = [False] * len(live)  # verifying no draft, the request still drafts (reads draft material)
        for k in wanted:  # drafts that were all worth nothing here (each completes the block) are no
            # sign that drafting does not pay: no back-off, and the next step's material is still read
            if k == probe and not picks[k]:
                continue  # a refusal the chooser itself sought: no back-off
            if picks[k] or any(v > 0 for v, _, _ in items[k]):
                self._outcome(live[k][0], bool(picks[k]))
            else:
                drafting[k] = True
        if probe is not None and not any(picks):
            j = self._probe(F0, V0, T0, live[probe][1], items[probe])
            if j is not None:
                picks[probe], self._probed = [j], True
                self.probes += 1
        self._dry = 0 if any(picks) else self._dry + offer
        if offer and self._dry >= EXPLORE_EVERY - 1:  # the next step may probe: its drafts' material
            for k, (_, p) in enumerate(live):
                if p.nodes and not picks[k]:
                    drafting[k] = True
        F = F0
        for k, (_, p) in enumerate(live):
            if picks[k]:
                d = self._delta(p)
                n = len(picks[k])
                F = F.plus(Shape(d.rows * n, d.attn * n, sum(items[k][j][2] for j in picks[k]), d.fold * n,
                                 d.fold_calls, 0, n))
        self._last = T0 if F is F0 else self.cost.predict(F, host=True)
        return _aligned(props, [Pick(p, sorted(picks[k]), drafting[k]) for k, (_, p) in enumerate(live)]), self._last

    def _probe(self, F0: Shape, V0: float, T0: float, p: Proposal, items: list[tuple]) -> int | None:
        """The draft a probing step verifies where no draft was chosen: the most valuable of `p`'s
        first-level drafts, if the step's predicted ratio with it is within EXPLORE_GAP of the ratio
        without (else None). After EXPLORE_EVERY steps in a row that verified no draft, one step
        measures the shape the chooser refuses: refinement only ever moves the parameters of the
        shapes that run, so a cost model that overprices a draft (a calibration under load, or the
        root-only rows refined down while the draft's stay as calibrated) would otherwise refuse
        for ever. The gap bounds what a probe can lose: 10 % of one step in 16 at most."""
        top = [j for j, (v, parent, _) in enumerate(items) if parent < 0 and v > 0]
        if not top:
            return None
        j = max(top, key=lambda i: items[i][0])
        d = self._delta(p)
        T = self.cost.predict(F0.plus(Shape(d.rows, d.attn, items[j][2], d.fold, d.fold_calls, 0, 1)), host=True)
        return j if (V0 + items[j][0]) * T0 >= (1 - EXPLORE_GAP) * V0 * T else None

    def _idle_after(self, passed: bool) -> None:
        """After k steps in a row in which requests could draft and the pre-draft screen passed none
        of them (even optimistically no draft pays), the next min(2^(k-1) - 1, IDLE_MAX) steps skip
        the choice (no drafts; the cost model neither predicts nor observes them): where drafting
        does not pay, as under a rule whose drafts are rarely hit or at a full batch on a CPU, auto
        then costs about what budget 0 costs. A request passing the screen resets it (drafts it made
        and that were not chosen are the request's own back-off, `_backing_off`). The last skipped
        steps read the draft material (look-aheads, top-k) again, so that the next choice's drafts
        are made from it."""
        st = self._idle
        st[1] = 0 if passed else min(st[1] + 1, IDLE_BITS)
        st[0] = 0 if passed else min(2 ** max(st[1] - 1, 0) - 1, IDLE_MAX)

    def _backing_off(self, rid: str) -> bool:
        """A request whose drafts were made and none chosen skips drafting for 1, 3, 7, 15 steps after
        1, 2, 3, 4+ such steps in a row (the policy's host work is not free when nothing pays)."""
        st = self._backoff.get(rid)
        if st is None or st[0] <= 0:
            return False
        st[0] -= 1
        return True

    def _outcome(self, rid: str, chosen: bool) -> None:
        st = self._backoff.setdefault(rid, [0, 0])
        st[1] = 0 if chosen else min(st[1] + 1, BACKOFF_MAX)
        st[0] = 0 if chosen else 2 ** st[1] - 1
        (self._paid.add if chosen else self._paid.discard)(rid)

    def forget(self, rid: str) -> None:
        """The request ended: what the chooser kept of it goes."""
        self._backoff.pop(rid, None)
        self._paid.discard(rid)

    def _fixed(self, p: Proposal | None) -> Pick | None:
        if p is None:
            return None
        n = int(self.budget)
        if n == 0 or not p.nodes:
            return Pick(p, [])
        return Pick(p) if n >= p.nodes else Pick(p, list(range(min(n, len(p.drafts)))))

    def _base(self, base: list[Job], props: list[Proposal]) -> Shape:
        F = jobs_shape(base, self.folded, self.rho)
        rows, attn, head, jobs = F.rows, F.attn, F.head, F.jobs
        for p in props:  # the roots (the same sums as Shape.plus, without a Shape per root)
            W = p.width
            rows += W
            attn += W * (p.kv + W)
            head += p.root_rows
            jobs += 1
        return Shape(rows, attn, head, F.fold, F.fold_calls, jobs, F.drafts)

    def _delta(self, p: Proposal) -> Shape:
        """What one draft of `p` adds to the step's shape, head rows apart."""
        W = p.width
        attn = W * (p.kv + W)
        if self.folded:
            return Shape((1.0 - self.rho) * W, attn, 0.0, W, 1, 0, 1)
        return Shape(W, attn, 0.0, drafts=1)

    def _worth_drafting(self, F0: Shape, live, parents: list[int], ratio: float | None = None,
                        skip: set[int] | frozenset = frozenset()) -> list[int]:
        """The requests whose drafts might pay: a draft's density is at most (the best node rate)
        × min(τ, masks) over its cheapest marginal cost (at the shape with every node of every
        request: f is sub-linear), and a set of drafts is only taken if its density beats the step
        ratio without drafts (`ratio`: V0 / T0, when the caller has it). When the drafts would start
        the step's folded verification, its fixed cost counts too, shared by every request that may
        draft: j drafts are then worth at most the j best node rates over j marginals plus that
        share, and plus the request's own cost of making and weighing its drafts (`host_made`).
        Cheap: no draft is made for the others, and f is evaluated once per distinct draft row count
        (a full batch of one width: twice in all). `skip`: requests not to screen (their drafts paid
        at their last choice; they still count in the step's rows)."""
        c, acc, tau = self.cost, self.acceptance, self.acceptance.tau
        n = max(p.nodes for _, p in live)
        if not n:
            return []
        top = acc.best(min(n, len(parents)))
        folded, keep = self.folded, 1.0 - self.rho
        full_rows = F0.rows  # the rows with every node of every request
        for _, p in live:
            full_rows = full_rows + (keep * p.width if folded else p.width) * p.nodes
        if ratio is None:
            ratio = sum(min(tau, p.masked) for _, p in live) / c.predict(F0, host=True)
        f_full = c.f_of(full_rows)
        f_less: dict[float, float] = {}
        c_attn, fold_row, c_head, host_draft = c.c_attn, c.fold_row, c.c_head, c.host_draft
        # a folded verification's fixed cost, when the step has none yet: shared at best by every
        # request that may draft, each with all its nodes
        share = c.fold0 / sum(1 for _, p in live if p.nodes) if folded and not F0.fold_calls and c.fold0 else 0.0
        share += c.host_made  # making and weighing its drafts: paid however many are then verified
        out = []
        for k, (_, p) in enumerate(live):
            if not p.nodes or k in skip:
                continue
            W = p.width
            d_rows = keep * W if folded else W
            fl = f_less.get(d_rows)
            if fl is None:
                fl = f_less[d_rows] = c.f_of(full_rows - d_rows)
            marginal = max(f_full - fl, 1e-12) + c_attn * (W * (p.kv + W)) \
                + fold_row * (W if folded else 0.0) + c_head + host_draft
            u = min(tau, p.masked) * (1 - MARGIN)  # the items' own discount: still a bound on their values
            if share:  # the best density of j drafts at the j best node rates, j = 1 .. nodes
                sums = acc.cumulative(min(p.nodes, len(parents)))
                if max(u * sums[j - 1] / (j * marginal + share) for j in range(1, len(sums) + 1)) > ratio:
                    out.append(k)
            elif top * u / marginal > ratio:
                out.append(k)
        return out

    def _best(self, F0: Shape, live, per_req: list[list[tuple]], V0: float | None = None,
              T0: float | None = None) -> list[tuple[int, int]]:
        if V0 is None:
            V0 = sum(min(self.acceptance.tau, p.masked) for _, p in live)
        return best_closure(self.cost, F0, V0, per_req, [self._delta(p) for _, p in live], t0=T0)

    # ------------------------------------------------------------------ after the step
    def start_step(self) -> None:
        """The engine's step begins (its host work is timed from here, on `self.clock`)."""
        self._step_t0 = self.clock()
        self._shape = None

    def end_step(self, filled: int = 0) -> float:
        """The step's work is done (before its deltas are built): returns its seconds on the cost
        clock; under auto budgets its host time (less the model call) refines the host terms."""
        total = self.clock() - self._step_t0
        if not self.auto or self.cost is None or self._last is None:
            return total
        if self._shape is not None:  # a step the refinement samples (`observe`)
            self.cost.observe_host(self._shape, total - self._model_s)
        self.steps += 1
        self.predicted += self._last
        self.measured += total
        self.abs_err += abs(self._last - total)
        return total

    def observe(self, jobs: list[Job], seconds: float, results: list) -> None:
        """The measured time of the step's runner call (on `self.clock`) refines the cost model, from
        every step while it has fewer than REFINE_WARM observations and from every REFINE_EVERY-th
        after that; fold counts refine the ratio every step (not for a step the chooser skipped:
        `_idle_after`)."""
        if not self.auto or self.cost is None or self._last is None:
            return
        self._ticks += 1
        c = self.cost
        if c.observations < REFINE_WARM or self._ticks % REFINE_EVERY == 0 or self._probed:
            F = jobs_shape(jobs, self.folded, self.rho)
            F.made = float(self._made)
            self._shape, self._model_s = F, seconds
            c.observe(F, seconds)
        if not self.folded:
            return
        folded = positions = 0
        for r in results:
            st = getattr(r, "stats", None)
            if st and "folded" in st:
                folded += sum(st["folded"])
                positions += sum(st["positions"])
        if positions:
            w = RHO_WEIGHT
            self.rho = (1 - w) * self.rho + w * folded / positions

    def record(self, n_drafts: int) -> None:
        self.chosen[n_drafts] += 1

    def report(self) -> dict:
        """Engine-wide: the budgets chosen, predicted against measured step time, acceptance."""
        out = {"draft_budget": self.budget, "budgets": dict(sorted(self.chosen.items())), "steps_predicted": self.steps,
               "clock": "thread_cpu" if self.clock is time.thread_time else "wall",
               "probes": self.probes, "predicted_seconds": self.predicted, "measured_seconds": self.measured,
               "prediction_error": self.abs_err / self.measured if self.measured else None,
               "fold_ratio_running": self.rho if self.folded else None}
        if self.acceptance is not None:
            out["acceptance"] = self.acceptance.report()
        if self.cost is not None:
            c = self.cost
            out["cost"] = {"grid": list(c.grid), "f": list(c.f), "c_attn": c.c_attn, "c_head": c.c_head,
                           "fold0": c.fold0, "fold_row": c.fold_row, "fold_roots": c.fold_roots,
                           "observations": c.observations,
                           "host0": c.host0, "host_job": c.host_job, "host_draft": c.host_draft,
                           "host_made": c.host_made,
                           "calibration_seconds": c.calibration_seconds}
        return out


def _aligned(props: list[Proposal | None], picks: list[Pick]) -> list[Pick | None]:
    """The picks of the requests with a proposal, in order, spread back over every request."""
    it = iter(picks)
    return [None if p is None else next(it) for p in props]


def best_closure(c: CostModel, F0: Shape, V0: float, per_req: list[list[tuple]], deltas: list[Shape],
                 iterations: int = 8, t0: float | None = None) -> list[tuple[int, int]]:
    """The choice, by Dinkelbach's method for ratios: with λ the best step ratio found so far (start:
    no drafts, V0 / T0), every item weighs (expected tokens) - λ·(marginal seconds at the current
    choice), and the heaviest set closed under parents is found per request by one pass over its
    tree (a node is worth its weight plus its children's positive subtree worths; it is taken when
    its subtree is worth more than nothing and its parent is taken); the new set's exact ratio
    (V0 + Σ tokens) / predicted seconds becomes λ, until it stops improving. Exact for linear costs;
    with the sub-linear f it re-linearises at each choice. `per_req[k]`: request k's items (expected
    tokens, parent item index or -1, head rows), parents first; `deltas[k]`: what one of its drafts
    adds, head rows apart; `t0`: the predicted seconds of F0 (whole step), when the caller has them
    -> the chosen (request, item index) pairs. Run from three linearisations (no drafts, every draft,
    the best prefix), the best kept. Where a single request has drafts (batch 1, or one request past
    the screen) its exact optimum is found instead (`_one_tree`), unless its tree has too many
    closed sets.

    Host cost: shapes are plain tuples of floats here (no dataclass per item), the predicted seconds
    of one shape are computed once, and f(rows) is evaluated once per distinct row count of an
    iteration; the arithmetic is the same, term by term, as `CostModel.predict` on `Shape`s, so the
    choice is the one the Shape-based version makes (tests/test_budget.py compares them)."""
    c = _Memo(c)
    S0 = _tup(F0)
    T0 = _t(c, S0) if t0 is None else t0
    dd = [(d.rows, d.attn, d.fold, d.fold_calls, d.drafts) for d in deltas]
    live = [k for k, items in enumerate(per_req) if items]
    if len(live) == 1:
        k = live[0]
        got = _one_tree(c, S0, V0, T0, per_req[k], dd[k])
        if got is not None:
            return [(k, j) for j in got]
    every = [(k, j) for k, items in enumerate(per_req) for j in range(len(items))]
    G, V = _shape(S0, V0, every, per_req, dd)
    best, chosen = V0 / T0, []
    rG = V / _t(c, G)
    if rG > best:
        best, chosen = rG, every
    r, pre, P = _best_prefix(c, S0, V0, T0, per_req, dd)
    if r > best:
        best, chosen = r, pre
    # Dinkelbach linearised at no drafts, at every draft and at the best prefix (f is sub-linear:
    # rows are cheaper in bulk, so the linearisation point matters)
    for start in (S0, G, P):
        best, chosen = _dinkelbach(c, S0, V0, per_req, dd, iterations, start, best, chosen)
    return chosen


class _Memo:
    """The cost model's terms for one choice, f(rows) memoised (the same rows recur across the
    linearisations and prefixes)."""
    __slots__ = ("f_of", "least_step", "c_attn", "c_head", "fold0", "fold_row", "host0", "host_job", "host_draft",
                 "host_made")

    def __init__(self, c: CostModel):
        memo: dict[float, float] = {}
        f_of = c.f_of

        def f(rows: float) -> float:
            v = memo.get(rows)
            if v is None:
                v = memo[rows] = f_of(rows)
            return v
        self.f_of = f
        self.least_step = c.least_step
        self.c_attn, self.c_head, self.fold0, self.fold_row = c.c_attn, c.c_head, c.fold0, c.fold_row
        self.host0, self.host_job, self.host_draft, self.host_made = c.host0, c.host_job, c.host_draft, c.host_made


def _tup(F: Shape) -> tuple:
    return (F.rows, F.attn, F.head, F.fold, F.fold_calls, F.jobs, F.drafts, F.made)


def _t(c: CostModel, s: tuple) -> float:
    """`c.predict(Shape(*s), host=True)` on a plain tuple (the same formula, cost.py)."""
    rows, attn, head, fold, fc, jobs, drafts, made = s
    return model_seconds(c, rows, attn, head, fold, fc) + host_seconds(c, jobs, drafts, made)


def _best_prefix(c, S0, V0, T0, per_req, dd) -> tuple[float, list[tuple[int, int]], tuple]:
    """Items in an order whose every prefix is closed (groups of parent + denser descendants, sorted
    by density at the base shape, each in list order) -> the best exact ratio over its prefixes,
    that prefix and its shape."""
    order: list[tuple] = []
    rows0, fc0 = S0[0], S0[4]
    f0 = c.f_of(rows0)
    for k, items in enumerate(per_req):
        if not items:
            continue
        d_rows, d_attn, d_fold, d_fc, d_drafts = dd[k]
        marginal = (c.f_of(rows0 + d_rows) - f0 + c.c_attn * d_attn + c.fold_row * d_fold
                    + c.host_draft * d_drafts + (c.fold0 if d_fc and not fc0 else 0.0))
        for g_v, g_c, members in _groups(items, [max(marginal + c.c_head * h, 1e-12) for _, _, h in items]):
            for j in members:
                order.append((-g_v / g_c, k, members[0], j))
    order.sort()
    pick = [(k, j) for _, k, _, j in order]
    best, best_n, best_s = V0 / T0, 0, S0
    for n, (s, V) in enumerate(_prefixes(S0, V0, pick, per_req, dd), start=1):
        r = V / _t(c, s)
        if r > best:
            best, best_n, best_s = r, n, s
    return best, pick[:best_n], best_s


def _one_tree(c, S0: tuple, V0: float, T0: float, items: list[tuple], d: tuple) -> list[int] | None:
    """One request's items (a tree in list order, parents first: FreeDave's chain, a Spiffy graph)
    -> the indices of its exact best closed set, ascending; None where the tree left after pruning
    still has more than TREE_SETS closed sets (the caller's linearisations then run).

    Every draft of one request adds the same rows, attention and fold work (`d`), so a draft's
    marginal seconds are at least what d_rows more rows cost at f's least slope between the set
    sizes that can occur (`CostModel.least_step`), plus its own linear terms (the fold's fixed cost,
    paid once, only adds). An item whose subtree holds no draft whose tokens reach the step's ratio
    without drafts (V0 / T0) at that lower bound is in no best set (`_keep`) and is dropped. The
    closed sets of the rest are evaluated exactly, each after the sets it extends along the list
    (a chain: its prefixes, shortest first), and the first best is kept: ties go to fewer drafts."""
    d_rows, d_attn, d_fold, d_fc, d_drafts = d
    rows0, n = S0[0], len(items)
    floor = c.least_step(rows0, rows0 + n * d_rows, d_rows) + c.c_attn * d_attn + c.fold_row * d_fold \
        + c.host_draft * d_drafts
    keep = _keep(items, floor, c.c_head, V0 / T0)
    if _closed_sets(items, keep) > TREE_SETS:
        return None
    order = [j for j in range(n) if keep[j]]
    taken = [False] * n
    best = [V0 / T0, []]

    def visit(pos: int, s: tuple, V: float, m: int) -> None:
        if pos == len(order):
            if m:
                r = V / _t(c, s)
                if r > best[0]:
                    best[0], best[1] = r, [j for j in order if taken[j]]
            return
        visit(pos + 1, s, V, m)
        j = order[pos]
        v, par, h = items[j]
        if par < 0 or taken[par]:
            rows_, attn, head, fold, fc, jobs, drafts, made = s
            taken[j] = True
            visit(pos + 1, (rows_ + d_rows, attn + d_attn, head + h, fold + d_fold, d_fc if d_fc > fc else fc, jobs,
                            drafts + d_drafts, made), V + v, m + 1)
            taken[j] = False
    visit(0, S0, V0, 0)
    return best[1]


def _keep(items: list[tuple], floor: float, c_head: float, bar: float) -> list[bool]:
    """Per item: whether its subtree (itself and its descendants) holds an item worth at least `bar`
    tokens per second at its least marginal cost (`floor` + its head rows), its parent kept too. In
    a best set S*, the subtree U of any of its items (S* without U is closed) adds tokens and
    seconds at a ratio of at least the best ratio, else S* without U would be better, and the best
    ratio is at least `bar`; that ratio is at most the densest of U's items at their least costs. So
    an item dropped here is in no best set."""
    dense = [v >= bar * (floor + c_head * h) for v, _, h in items]
    for j in range(len(items) - 1, -1, -1):  # children come after parents: bottom-up
        par = items[j][1]
        if par >= 0 and dense[j]:
            dense[par] = True
    keep = []
    for j, (_, par, _) in enumerate(items):
        keep.append(dense[j] and (par < 0 or keep[par]))
    return keep


def _closed_sets(items: list[tuple], keep: list[bool]) -> int:
    """How many sets of the kept items are closed under parents (the empty one included): per item,
    1 (not taken) + the product over its kept children, multiplied over the kept roots."""
    prod = [1] * len(items)
    total = 1
    for j in range(len(items) - 1, -1, -1):
        if keep[j]:
            par, n = items[j][1], 1 + prod[j]
            if par >= 0:
                prod[par] *= n
            else:
                total *= n
    return total


def _groups(items: list[tuple], cost: list[float]) -> list[tuple[float, float, list[int]]]:
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


def _dinkelbach(c, S0, V0, per_req, dd, iterations, F, best, chosen):
    c_head = c.c_head
    for _ in range(iterations):
        pick = []
        rows, fc = F[0], F[4]
        f_here = c.f_of(rows)
        f_next: dict[float, float] = {}  # f(rows + a draft's rows), per distinct draft rows
        for k, items in enumerate(per_req):
            if not items:
                continue
            d_rows, d_attn, d_fold, d_fc, d_drafts = dd[k]
            fn = f_next.get(d_rows)
            if fn is None:
                fn = f_next[d_rows] = c.f_of(rows + d_rows)
            fold0 = c.fold0 if d_fc and not fc else 0.0
            marginal = (fn - f_here + c.c_attn * d_attn + c.fold_row * d_fold
                        + c.host_draft * d_drafts + fold0 / max(1, len(items)))
            worth = [v - best * (marginal + c_head * h) for v, _, h in items]
            for j in range(len(items) - 1, -1, -1):  # children come after parents: bottom-up
                par = items[j][1]
                if par >= 0 and worth[j] > 0:
                    worth[par] += worth[j]
            taken: set[int] = set()
            for j, (_, par, _) in enumerate(items):
                if worth[j] > 0 and (par < 0 or par in taken):
                    taken.add(j)
                    pick.append((k, j))
        G, V = _shape(S0, V0, pick, per_req, dd)
        r = V / _t(c, G)
        if r <= best * (1 + 1e-12):
            break
        best, chosen, F = r, pick, G
    return best, chosen


def _shape(S0: tuple, V0: float, pick, per_req, dd) -> tuple[tuple, float]:
    """The step's shape and value with every item of `pick` added."""
    out = (S0, V0)
    for out in _prefixes(S0, V0, pick, per_req, dd):
        pass
    return out


def _prefixes(S0: tuple, V0: float, pick, per_req, dd):
    """(shape, value) after each item of `pick` in turn, from the base shape S0 and value V0."""
    rows, attn, head, fold, fc, jobs, drafts, made = S0
    V = V0
    for k, j in pick:
        d_rows, d_attn, d_fold, d_fc, d_drafts = dd[k]
        v, _, h = per_req[k][j]
        rows += d_rows
        attn += d_attn
        head += h
        fold += d_fold
        if d_fc > fc:
            fc = d_fc
        drafts += d_drafts
        V += v
        yield (rows, attn, head, fold, fc, jobs, drafts, made), V

