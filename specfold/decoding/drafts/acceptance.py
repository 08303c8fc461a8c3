"""Acceptance estimates of draft nodes: how likely a verified draft's state is reached by the rule.

A draft node i (a Spiffy graph node; FreeDave's chain node = its depth) is *hit* in a verification
when the main trajectory, advancing through stored states without a forward, reaches node i's state:
that rule step then costs no forward. `p(i)` estimates P(hit | verified) per node, as a Beta
posterior refined online with the hits and verifications the block program counts (`drafted`,
`hit`). Its prior is hierarchical, so a node that was never verified still learns from its
ancestors: a root child's prior is the calibration's `hit_rate_estimate` (graph meta: the fraction of
calibration roots whose trajectory followed the node's path), `PRIOR_WEIGHT` pseudo-observations; a
deeper node's prior is its parent's current estimate times the calibration's ratio of the two
(node / parent). A FreeDave chain has no calibration: depth 1 starts at `CHAIN_PRIOR`, and depth d
at p(d-1) times the conditional rate last seen one level up, p(d-1) / p(d-2) (each further token
accepted as often as the previous one), `CHAIN_WEIGHT` pseudo-counts. So once depth 1 is known
(on a confident model, under the one-token static rule, it is reached most of the time), depth 2 is
expected at about its square without ever having been tried, and is tried where that pays.
The chooser uses the posterior mean; `optimistic(i)` (one posterior deviation above) is kept for
reports.

Acceptance also varies with the step: a draft whose filled positions the parent step scored with
high confidence is reached more often. So each draft also carries a confidence bucket (`bucket`: the
lowest confidence, in the parent step's scores, of the positions it fills beyond the root), and
`p(node, bucket)` is a second Beta posterior per (node, bucket) whose prior is the node's own
estimate with `BUCKET_WEIGHT` pseudo-counts: where a bucket has no data it falls back on the node.

`tau` is the running mean of tokens one rule step unmasks (the value of a step); for the static rule
it is k from the start.

One `Acceptance` per (model fingerprint, rule settings, policy, graph) in the process (`acceptance_for`):
every engine built on the same model and rule shares and refines it (a `generate` call with
DecodeParams builds a new engine). Host only: plain floats, updated with counts the program already
keeps; estimates change which drafts are verified, never tokens.
"""
from __future__ import annotations

import math
import threading

PRIOR_WEIGHT = 8.0  # pseudo-verifications behind a calibrated node's prior
CHAIN_PRIOR, CHAIN_WEIGHT = 0.5, 2.0  # an uncalibrated chain node at depth d: 0.5**d, 2 pseudo-counts
DEFAULT_PRIOR = 0.2  # an uncalibrated graph node
TAU_WEIGHT = 32.0  # rule steps behind the initial tokens-per-step guess
BUCKET_WEIGHT = 4.0  # pseudo-counts of a (node, confidence bucket) estimate, centred on the node's
EDGES = {"max_prob": (0.5, 0.8, 0.95, 0.99), "margin": (0.3, 0.6, 0.9, 0.98),
         "neg_entropy": (-2.0, -0.7, -0.2, -0.05)}  # confidence bucket edges per confidence kind


def bucket(conf: float, kind: str = "max_prob") -> int:
    """The confidence bucket of a draft (0 = least confident)."""
    return sum(conf >= e for e in EDGES.get(kind, EDGES["max_prob"]))


class Acceptance:
    def __init__(self, priors: dict[int, tuple[float, float]] | None = None, tau: float = 1.0,
                 tau_fixed: bool = False, default: tuple[float, float] = (DEFAULT_PRIOR, CHAIN_WEIGHT),
                 parents: dict[int, int] | None = None, chain: bool = False):
        """`priors`: node -> (prior hit rate, pseudo-count weight); `parents`: node -> its parent node
        (0 = the root; absent: the root), for the hierarchical prior; `chain`: FreeDave's chain
        (depth d's parent is d - 1; its prior extrapolates the conditional rate one level up)."""
        self.priors = dict(priors or {})
        self.default = default
        self.parents = dict(parents or {})
        self.chain = chain
        self._memo: dict = {}
        self.hits: dict = {}  # node -> hits, (node, bucket) -> hits
        self.tries: dict = {}
        self.tau_fixed = tau_fixed
        self._tau_tokens, self._tau_steps = tau * TAU_WEIGHT, TAU_WEIGHT
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ estimates
    def prior(self, node: int) -> float:
        """The hierarchical prior mean of `node` (its ancestors' current estimates, see above)."""
        p0, _ = self.priors.get(node, self.default)
        par = self.parents.get(node, 0)
        if par <= 0 or par == node:
            return p0
        pp = self.p(par)
        if self.chain:
            gp = self.parents.get(par, 0)
            up = self.p(gp) if gp > 0 and gp != par else 1.0
            return min(1.0, pp * (pp / up if up > 0 else 0.0))
        ref, _ = self.priors.get(par, self.default)
        return min(1.0, pp * (p0 / ref)) if ref > 0 else p0

    def _ab(self, node: int) -> tuple[float, float]:
        key = ("ab", node)
        got = self._memo.get(key)
        if got is not None:
            return got
        p, w = self.prior(node), self.priors.get(node, self.default)[1]
        h, n = self.hits.get(node, 0.0), self.tries.get(node, 0.0)
        got = self._memo[key] = (p * w + h, (1.0 - p) * w + (n - h))
        return got

    def _abb(self, node: int, b: int | None) -> tuple[float, float]:
        if b is None:
            return self._ab(node)
        p = self.p(node)
        h, n = self.hits.get((node, b), 0.0), self.tries.get((node, b), 0.0)
        return p * BUCKET_WEIGHT + h, (1.0 - p) * BUCKET_WEIGHT + (n - h)

    def p(self, node: int, b: int | None = None) -> float:
        a, c = self._abb(node, b)
        return a / (a + c) if a + c > 0 else 0.0

    def best(self, n: int) -> float:
        """The highest estimate among nodes 1..n (0 when n = 0)."""
        return self.cumulative(n)[0] if n > 0 else 0.0

    def cumulative(self, n: int) -> list[float]:
        """Sums of the j highest estimates among nodes 1..n, j = 1..n (memoised until the next count)."""
        key = ("cumulative", n)
        got = self._memo.get(key)
        if got is None:
            got, total = [], 0.0
            for r in sorted((self.p(i) for i in range(1, n + 1)), reverse=True):
                total += r
                got.append(total)
            self._memo[key] = got
        return got

    def optimistic(self, node: int, b: int | None = None) -> float:
        """The estimate plus one posterior standard deviation (of the node's, or the bucket's, count)."""
        a, c = self._abb(node, b)
        n = a + c
        if n <= 0:
            return 1.0
        m = a / n
        return min(1.0, m + math.sqrt(m * (1.0 - m) / (n + 1.0)))

    def observed(self, node: int) -> tuple[int, int]:
        """(hits, verifications) counted online for `node`."""
        return int(self.hits.get(node, 0)), int(self.tries.get(node, 0))

    @property
    def tau(self) -> float:
        """Mean tokens one rule step unmasks."""
        return self._tau_tokens / self._tau_steps

    # ------------------------------------------------------------------ online counts
    def drafted(self, node: int, b: int | None = None) -> None:
        with self._lock:
            self._memo = {}
            for k in (node, (node, b)) if b is not None else (node,):
                self.tries[k] = self.tries.get(k, 0.0) + 1.0

    def hit(self, node: int, b: int | None = None) -> None:
        with self._lock:
            self._memo = {}
            for k in (node, (node, b)) if b is not None else (node,):
                self.hits[k] = self.hits.get(k, 0.0) + 1.0

    def step(self, tokens: int) -> None:
        """One rule step of a main trajectory unmasked `tokens` positions."""
        if not self.tau_fixed:
            self._tau_tokens += tokens
            self._tau_steps += 1.0

    def report(self) -> dict:
        """Per node: prior, online hits / verifications and the current estimate."""
        nodes = sorted(set(self.priors) | {k for k in self.tries if isinstance(k, int)})
        return {"tau": self.tau,
                "nodes": {n: {"prior": self.prior(n), "hits": self.observed(n)[0],
                              "verified": self.observed(n)[1], "p": self.p(n)} for n in nodes}}


def graph_priors(graph) -> dict[int, tuple[float, float]]:
    """Node -> (prior, weight) from a draft graph: the calibration's hit rates where the meta has one
    per node, else 0.5**depth for a chain (FreeDave) and DEFAULT_PRIOR for other nodes."""
    if graph is None:
        return {}
    est = graph.meta.get("hit_rate_estimate")
    if isinstance(est, list) and len(est) >= len(graph):
        return {i: (min(1.0, max(0.0, float(p))), PRIOR_WEIGHT) for i, p in enumerate(est[: len(graph)], start=1)}
    if graph.meta.get("kind") == "chain":
        return {i: (CHAIN_PRIOR ** d, CHAIN_WEIGHT) for i, d in enumerate(graph.depths(), start=1)}
    return {}


_REGISTRY: dict[tuple, Acceptance] = {}
_REG_LOCK = threading.Lock()


def acceptance_for(key: tuple, graph, tau: float, tau_fixed: bool) -> Acceptance:
    """The process's one `Acceptance` for `key` (made from the graph's priors on first use)."""
    with _REG_LOCK:
        acc = _REGISTRY.get(key)
        if acc is None:
            parents = {i: n.parent for i, n in enumerate(graph.nodes, start=1)} if graph is not None else {}
            chain = graph is not None and graph.meta.get("kind") == "chain"
            acc = _REGISTRY[key] = Acceptance(graph_priors(graph), tau, tau_fixed, parents=parents, chain=chain)
        return acc


def reset_registry() -> None:
    """Forget every online estimate (tests and benchmarks that need a cold start)."""
    with _REG_LOCK:
        _REGISTRY.clear()
