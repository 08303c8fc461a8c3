"""Draft budgets: how many drafts each verification verifies in this step (`EngineConfig.draft_budget`).

- An integer N: every verification verifies the first N drafts of its policy's list (a prefix is
  closed under parents); 0 = none (the policy is not even asked).
- "auto": a measured bandit over the fixed budgets ARMS. Each step plays one arm for every request
  that verifies. Per batch size (running requests, a power-of-two bucket) and arm it keeps the
  positions the rule filled and the seconds the steps took, both decayed, and plays the arm with
  the most positions per second; now and then a run tries a neighbour of the best instead. It needs
  no calibration, no cache file and no cost model: it learns from the steps themselves, on the
  clock of the machine it runs on. It starts at 0 and climbs: the arms next to the best, and 0, are
  played TRIES times before they are judged, so a budget far from the best is never tried. Each
  batch size measures its own rates, from 0: they differ by batch size, and a bucket never judges
  with another's.

Arms are played in runs of RUN steps (a change of batch size ends a run), and a step is scored
only when the steps before and after it play the same arm: a step pays for work its predecessor
caused (the commit of a block that drafts completed, the material drafts are made from:
look-aheads and top-k ids, read one step before), and scoring across a change of arm would credit
one arm with the other's work (drafts complete blocks sooner, and the step after pays their
commits). The next step's arm is known one step
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
from dataclasses import dataclass

import torch

from specfold.decoding.proposal import Pick, Proposal

ARMS = (0, 1, 2, 4)
TRIES = 3  # scored plays of a neighbour of the best before it is judged
RUN = 6  # an arm is played for RUN steps in a row
EXPLORE = 0.01  # share of runs that play a neighbour of the best arm
EXPLORE_UNSURE = 0.05  # ... one whose rate is within two standard errors of the best's
DECAY = 0.995  # weight of an arm's past, per play: about its last 200 plays count
WARMUP = 32  # an engine's first steps are not scored: they pay one-time costs (allocations, first
# touches of the weights), and the arm they played (0) would keep that price while the others climb


def clock_for(device):
    """The clock steps are measured on: thread CPU time on a CPU with one torch thread (steady on a
    shared machine), else the wall clock (the step's one read synchronises the device)."""
    if getattr(device, "type", str(device)) == "cpu" and torch.get_num_threads() == 1:
        return time.thread_time
    return time.perf_counter


@dataclass(slots=True)
class Arm:
    """Decayed sums over the steps an arm was scored: positions filled f, seconds s, and the second
    moments that give the standard error of the rate f / s."""
    f: float = 0.0
    s: float = 0.0
    ff: float = 0.0
    fs: float = 0.0
    ss: float = 0.0
    plays: int = 0

    def add(self, f: int, s: float) -> None:
        d = DECAY
        self.f, self.s = d * self.f + f, d * self.s + s
        self.ff, self.fs, self.ss = d * self.ff + f * f, d * self.fs + f * s, d * self.ss + s * s
        self.plays += 1

    @property
    def rate(self) -> float:
        return self.f / self.s if self.s > 0 else 0.0

    def error(self) -> float:
        """The rate's standard error (delta method for a ratio of sums: the residuals f - rate * s)."""
        if self.plays < 2:
            return float("inf")
        r = self.rate
        return math.sqrt(max(self.ff - 2 * r * self.fs + r * r * self.ss, 0.0)) / self.s


class BudgetChooser:
    def __init__(self, config, program, device):
        self.budget = config.draft_budget
        self.auto = self.budget == "auto"
        self.drafts = getattr(program, "drafts", False)  # the program proposes drafts
        self.clock = clock_for(device)
        self.arms: dict[int, list[Arm]] = {}
        self.rng = random.Random(0)
        self._arm = self._next = 0  # indices into ARMS: this step's arm, the next step's (auto)
        self._left = 0  # steps left in the current run of `_next`
        self._bucket = -1  # the batch size of the current run
        self._played: tuple[int, int] | None = None  # this step's (bucket, arm index), observed at its end
        self._t0 = 0.0
        self._steps = 0

    def start_step(self) -> None:
        self._t0 = self.clock()
        self._played = None

    def choose(self, props: list[Proposal | None]) -> list[Pick | None]:
        """Each request's `Pick` (None where it has no proposal)."""
        if not self.auto:
            n, drafting = int(self.budget), False
        else:
            bucket = max(len(props) - 1, 0).bit_length()  # running requests: 1, 2, 3-4, 5-8, 9-16, ...
            prev = self._arm
            if bucket != self._bucket:  # the batch changed: a run of its own arm, from this step
                self._bucket, self._next, self._left = bucket, self._arm_for(bucket), RUN
            arm = self._arm = self._next
            self._left -= 1
            if self._left <= 0:  # the run ends: the next one's arm
                self._next, self._left = self._arm_for(bucket), RUN
            drafts = any(p is not None and p.nodes for p in props)
            # scored only where no other arm's work spills in, and where some request could draft
            self._steps += 1
            self._played = (bucket, arm) if prev == arm == self._next and drafts and self._steps > WARMUP else None
            n, drafting = ARMS[arm], ARMS[self._next] > 0
        return [None if p is None else _prefix(p, n, drafting) for p in props]

    def _arm_for(self, bucket: int) -> int:
        """The best arm played so far, unless a neighbour of it has fewer than TRIES plays (then the
        neighbour: arms are climbed, never tried far from the best), or the run
        explores (a neighbour, at random: 1 % of runs each, 5 % for one with few plays or that the
        standard errors do not tell from the best, so that a close call is settled by more plays, at
        little cost)."""
        arms = self._arms(bucket)
        played = [i for i, a in enumerate(arms) if a.plays]
        if not played:  # a batch size not seen before starts at 0
            return 0
        best = self._best(bucket)
        # the neighbours of the best, and 0 (the rates need not fall on both sides of the best)
        near = list(dict.fromkeys(i for i in (best + 1, best - 1, 0) if 0 <= i < len(arms) and i != best))
        for i in near:
            if arms[i].plays < TRIES:
                return i
        low = arms[best].rate - 2 * arms[best].error()
        for i in self.rng.sample(near, len(near)):  # one that may yet be the best is played more
            unsure = arms[i].plays < 4 * TRIES or arms[i].rate + 2 * arms[i].error() >= low
            if self.rng.random() < (EXPLORE_UNSURE if unsure else EXPLORE):
                return i
        return best

    def _arms(self, bucket: int) -> list[Arm]:
        return self.arms.setdefault(bucket, [Arm() for _ in ARMS])

    def _best(self, bucket: int) -> int:
        """The arm with the highest rate in `bucket` (0 where nothing was played)."""
        arms = self.arms[bucket]
        return max((i for i, a in enumerate(arms) if a.plays), key=lambda i: arms[i].rate, default=0)

    def end_step(self, filled: int) -> None:
        """The step is done; `filled`: the positions the rule filled in it."""
        seconds = self.clock() - self._t0
        if self._played is not None:
            bucket, arm = self._played
            self._arms(bucket)[arm].add(filled, seconds)

    def report(self) -> dict:
        """Per bucket each arm's plays and positions per second (the budgets verified are in each
        request's stats: `draft_budgets`)."""
        return {"draft_budget": self.budget,
                "arms": {f"batch<={2 ** b}": {ARMS[i]: (a.plays, round(a.rate, 2)) for i, a in enumerate(arms)}
                         for b, arms in sorted(self.arms.items())}}


def _prefix(p: Proposal, n: int, drafting: bool) -> Pick:
    """The first n drafts of `p` (made only when n > 0); `drafting`: the next step may draft."""
    if n == 0 or not p.nodes:
        return Pick(p, [], drafting)
    return Pick(p, None if n >= p.nodes else list(range(min(n, len(p.drafts)))), drafting)
