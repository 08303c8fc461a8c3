"""Draft budgets: how many drafts each verification verifies in this step (`EngineConfig.draft_budget`).

- An integer N: every verification verifies the first N drafts of its policy's list (a prefix is
  closed under parents); 0 = none (the policy is not even asked).
- "auto": a measured bandit over the fixed budgets ARMS. Each step plays one arm for every request
  that verifies. Per running-batch size (a power-of-two bucket) and arm it keeps the positions the
  rule filled and the seconds the steps took, both decayed, and plays the arm with the most
  positions per second; a few steps in every hundred try a neighbour of the best instead. It needs
  no calibration, no cache file and no cost model: it learns from the steps themselves, on the
  clock of the machine it runs on. It starts at 0 and climbs: a neighbour of the best is played
  TRIES times before it is judged, so a budget far from the best is never tried; a batch size not
  seen before starts from the nearest one seen.

Arms are played in runs of RUN steps, and a step is scored only when the steps before and after it
play the same arm: a step pays for work its predecessor caused (the commit of a block that drafts
completed, the material drafts are made from: look-aheads and top-k ids, read one step before),
and scoring across a change of arm would credit one arm with the other's work (drafts complete
blocks sooner, and the step after pays their commits). The next step's arm is known one step
ahead, so a request reads material exactly when the next step may draft.

The picks are what `choose` returns (one `Pick` per request that verifies, for the engine to pass
to `plan(req, pick)`); nothing is kept of a request. The row budget (`max_num_batched_tokens`) is the
scheduler's. Causal programs have no proposals: a fixed N caps their alternative drafts (their
config's `draft_budget`), and under "auto" they verify their configured branches.

Invariants: a pick is a prefix of the policy's list, so closed under parents; budgets change which
states are verified, never the rule's decisions, so tokens are those of vanilla for every lossless
method (under SpecFold at delta > 0 the drafts decide which rows fold: approximate).
"""
from __future__ import annotations

import math
import random
import time
from collections import Counter
from dataclasses import dataclass

import torch

from specfold.decoding.proposal import Pick, Proposal

ARMS = (0, 1, 2, 4)
TRIES = 6  # scored plays of a neighbour of the best before it is judged
RUN = 6  # an arm is played for RUN steps in a row
EXPLORE = 0.02  # share of runs that play a neighbour of the best arm
EXPLORE_UNSURE = 0.1  # ... one whose rate is within two standard errors of the best's
DECAY = 0.99  # weight of an arm's past, per play: about its last 100 plays count


def clock_for(device):
    """The clock steps are measured on: thread CPU time on a CPU with one torch thread (steady on a
    shared machine), else the wall clock (the step's one read synchronises the device)."""
    if getattr(device, "type", str(device)) == "cpu" and torch.get_num_threads() == 1:
        return time.thread_time
    return time.perf_counter


@dataclass(slots=True)
class Arm:
    filled: float = 0.0  # positions the rule filled in the steps this arm was scored (decayed)
    seconds: float = 0.0  # those steps' seconds (decayed)
    plays: int = 0
    weight: float = 0.0  # the decayed count of those steps, and the sums of their own rates and squares:
    sum_r: float = 0.0  # how far the rate may be off (`spread`)
    sum_r2: float = 0.0

    def add(self, filled: int, seconds: float) -> None:
        r = filled / seconds if seconds > 0 else 0.0
        self.filled = DECAY * self.filled + filled
        self.seconds = DECAY * self.seconds + seconds
        self.weight = DECAY * self.weight + 1
        self.sum_r = DECAY * self.sum_r + r
        self.sum_r2 = DECAY * self.sum_r2 + r * r
        self.plays += 1

    @property
    def rate(self) -> float:
        return self.filled / self.seconds if self.seconds > 0 else 0.0

    def spread(self) -> float:
        """The standard error of the rate, from the spread of the steps' own rates."""
        if self.weight <= 1:
            return float("inf")
        mean = self.sum_r / self.weight
        return math.sqrt(max(self.sum_r2 / self.weight - mean * mean, 0.0) / self.weight)


class BudgetChooser:
    def __init__(self, config, program, device):
        self.budget = config.draft_budget
        self.auto = self.budget == "auto"
        self.drafts = getattr(program, "acceptance", None) is not None  # the program proposes drafts
        self.clock = clock_for(device)
        self.chosen = Counter()  # drafts verified per verification -> count (this engine)
        self.arms: dict[int, list[Arm]] = {}
        self.rng = random.Random(0)
        self._arm = self._next = 0  # indices into ARMS: this step's arm, the next step's (auto)
        self._left = 0  # steps left in the current run of `_next`
        self._played: tuple[int, int] | None = None  # this step's (bucket, arm index), observed at its end
        self._t0 = 0.0

    def start_step(self) -> None:
        self._t0 = self.clock()
        self._played = None

    def choose(self, ids: list[str], props: list[Proposal | None], base) -> tuple[list[Pick | None], None]:
        """Each request's `Pick` (None where it has no proposal); `ids`, `base` (the step's other jobs)
        are the engine's interface and unused here."""
        if not self.auto:
            n, drafting = int(self.budget), False
        else:
            bucket = max(sum(p is not None for p in props), 1).bit_length()
            prev, arm = self._arm, self._next
            if self._left <= 0:  # the run ends: the next one's arm
                self._next, self._left = self._arm_for(bucket), RUN
            self._left -= 1
            if prev == arm == self._next and any(p is not None and p.nodes for p in props):
                self._played = (bucket, arm)  # scored: no other arm's work spills into it
            self._arm = arm
            n, drafting = ARMS[arm], ARMS[self._next] > 0
        return [None if p is None else _prefix(p, n, drafting) for p in props], None

    def _arm_for(self, bucket: int) -> int:
        """The best arm played so far, unless a neighbour of it has fewer than TRIES plays (then the
        neighbour: arms are climbed one at a time, never tried far from the best), or the step
        explores (a neighbour, at random: 2 % of runs each, 10 % while their rates' standard errors
        do not tell them apart, so that a close call is settled by more plays, at little cost)."""
        arms = self._arms(bucket)
        played = [i for i, a in enumerate(arms) if a.plays]
        best = max(played, key=lambda i: arms[i].rate, default=0)
        near = [i for i in (best + 1, best - 1) if 0 <= i < len(arms)]
        for i in near:
            if played and arms[i].plays < TRIES:
                return i
        top = arms[best].rate - 2 * arms[best].spread()
        for i in self.rng.sample(near, len(near)):  # a neighbour that may yet be the best is tried more
            unsure = arms[i].rate + 2 * arms[i].spread() >= top
            if self.rng.random() < (EXPLORE_UNSURE if unsure else EXPLORE):
                return i
        return best

    def _arms(self, bucket: int) -> list[Arm]:
        arms = self.arms.get(bucket)
        if arms is None:  # a new batch size starts from the nearest one seen
            near = min(self.arms, key=lambda b: abs(b - bucket), default=None)
            arms = self.arms[bucket] = [Arm(a.filled, a.seconds, a.plays) for a in self.arms[near]] \
                if near is not None else [Arm() for _ in ARMS]
        return arms

    def end_step(self, filled: int) -> float:
        """The step is done; `filled`: the positions the rule filled in it. Returns its seconds."""
        seconds = self.clock() - self._t0
        if self._played is not None:
            bucket, arm = self._played
            self._arms(bucket)[arm].add(filled, seconds)
        return seconds

    def observe(self, jobs, seconds: float, results) -> None:
        """The runner call's time (unused: the whole step is measured)."""

    def record(self, n_drafts: int) -> None:
        self.chosen[n_drafts] += 1

    def forget(self, rid: str) -> None:
        """The request ended (nothing is kept per request)."""

    def report(self) -> dict:
        """Engine-wide: the budgets verified, and per bucket each arm's plays and positions per second."""
        return {"draft_budget": self.budget, "budgets": dict(sorted(self.chosen.items())),
                "arms": {f"batch<{2 ** b}": {ARMS[i]: (a.plays, round(a.rate, 2)) for i, a in enumerate(arms)}
                         for b, arms in sorted(self.arms.items())}}


def _prefix(p: Proposal, n: int, drafting: bool) -> Pick:
    """The first n drafts of `p` (made only when n > 0); `drafting`: the next step may draft."""
    if n == 0 or not p.nodes:
        return Pick(p, [], drafting)
    return Pick(p) if n >= p.nodes else Pick(p, list(range(min(n, len(p.drafts)))), drafting)
