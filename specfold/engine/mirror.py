"""Tensor parallelism keeps the engine one program: rank 0 runs the scheduler, the programs, the budget
chooser and the reads; every other rank replays rank 0's device work on its shard of the model.

    leader = Leader(par.control)                         # rank 0, one per loaded model
    runner = MirroredRunner(leader, key, runner, config) # an engine's runner: ships, then runs
    Follower(model, spec).serve(channel)                 # ranks 1..N-1 (executor/follower.py)

What crosses (one message per step, broadcast from rank 0 over the control channel, in place of
the runner's one host-to-device copy): the step's `Job`s, which are host data already, with each
device object replaced by a reference every rank resolves to its own copy:
- a prefix cache -> `CacheRef` (an id, its capacity, current length and block table: every rank's
  pool has the same blocks, and rank 0 takes a write's blocks before the step, so the others only
  copy the table; a LinearSpec `truncate` on rank 0 reaches them as the length and table);
- a reuse job's hidden states -> `HiddenRef` (which earlier result, which rows).
Every rank then runs the same `ModelRunner.run` over the same jobs: the same packed call, the same
fold decisions (the hidden states are equal on every rank after each all-reduce), and only rank 0
reads. Objects rank 0 drops (a finished request's cache, a consumed result's hidden states, an
engine) are dropped on the other ranks with the next message.

With `SPECFOLD_TP_CHECK=1` every rank also sends a digest of each step's fold statistics and
rank 0 raises if any differs (the tests' proof that every rank folds the same rows).

Invariants: the followers hold no decode state (no request, no program, no scheduler); a message
is a pure function of rank 0's host data.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import weakref
from dataclasses import dataclass


from specfold.decoding.jobs import HiddenRows, Job, JobResult
from specfold.errors import DistributedError


@dataclass(frozen=True, slots=True)
class CacheRef:
    id: int
    capacity: int
    length: int
    blocks: tuple[int, ...] = ()
    pool: int | None = None  # the engine whose pool holds it (None: a private pool of `capacity`)


@dataclass(frozen=True, slots=True)
class HiddenRef:
    ref: tuple[int, int]  # (message, job index) of the verification that returned the states
    branch: int
    start: int
    stop: int


class _Held(list):
    """A result's hidden states on rank 0, tagged with the reference the other ranks file them under."""
    __slots__ = ("ref", "__weakref__")


class Leader:
    """Rank 0's side: the channel, the ids of the device objects the others mirror, and what to drop."""

    def __init__(self, control):
        self.control = control
        self.seq = itertools.count()
        self.engines = itertools.count()
        self._caches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._ids = itertools.count()
        self._drops: list[tuple] = []
        self._pools: dict[int, object] = {}  # id(pool) -> engine key
        self.check = os.environ.get("SPECFOLD_TP_CHECK") == "1"
        self.checked = 0  # steps whose fold decisions every rank compared

    def send(self, kind: str, key: int, *payload) -> int:
        n = next(self.seq)
        drops, self._drops = self._drops, []
        self.control.send((kind, key, n, drops) + payload)
        return n

    @contextlib.contextmanager
    def step(self):
        """Around a message and the device work it starts on every rank. An exception (Ctrl-C) leaves
        `control.busy` set: the other ranks may wait in a collective and cannot hear a message
        (executor/ranks.py's close then ends them instead), and every later message is refused at once."""
        self._check_not_interrupted()
        self.control.busy = True
        yield
        self.control.busy = False

    def _check_not_interrupted(self) -> None:
        if self.control.down is not None:  # the group failed or was closed: that is the line
            raise DistributedError(self.control.down)
        if self.control.busy:
            raise DistributedError("an earlier step was interrupted midway, so the other tensor-parallel ranks "
                                   "are still inside it; close this LLM (llm.close()) and load a new one")

    def forget(self, what: tuple) -> None:
        self._drops.append(what)

    def add_engine(self, config, pool) -> int:
        self._check_not_interrupted()
        key = next(self.engines)
        if pool is not None:
            self._pools[id(pool)] = key
        self.send("engine", key, config, None if pool is None else pool.num_blocks)
        return key

    def cache(self, c) -> CacheRef | None:
        if c is None:
            return None
        n = self._caches.get(c)
        if n is None:
            n = self._caches[c] = next(self._ids)
            weakref.finalize(c, self.forget, ("cache", n))
        blocks = tuple(c.blocks)
        return CacheRef(n, c.pool.usable * c.pool.block_size, c.length, blocks, self._pools.get(id(c.pool)))

    def hidden(self, h: HiddenRows | None) -> HiddenRef | None:
        return None if h is None else HiddenRef(h.source.ref, h.branch, h.start, h.stop)

    def tag(self, n: int, results: list[JobResult]) -> None:
        for i, r in enumerate(results):
            if r.hidden is not None:
                held = _Held(r.hidden)
                held.ref = (n, i)
                weakref.finalize(held, self.forget, ("hidden", (n, i)))
                r.hidden = held


class MirroredRunner:
    """An engine's `ModelRunner` on rank 0 under tensor parallelism: every `run` first ships its jobs."""

    def __init__(self, leader: Leader, runner, config, pool):
        self.leader, self.runner = leader, runner
        self.key = leader.add_engine(config, pool)
        weakref.finalize(self, leader.forget, ("engine", self.key))

    @property
    def static(self):
        return self.runner.static

    def run(self, jobs: list[Job]) -> list[JobResult]:
        if not jobs:
            return []
        ld = self.leader
        wire = [dataclasses.replace(j, cache=ld.cache(j.cache), hidden=ld.hidden(j.hidden)) for j in jobs]
        with ld.step():
            n = ld.send("run", self.key, wire)
            results = self.runner.run(jobs)
            if ld.check:
                got = ld.control.digests([r.stats for r in results])
                if len(set(got)) != 1:
                    raise DistributedError(f"the tensor-parallel ranks reached different fold decisions at step {n}")
                ld.checked += 1
        ld.tag(n, results)
        return results
