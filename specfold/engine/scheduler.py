"""Scheduling: admission under `max_num_seqs` and the per-step row budget (draft budgets: budget.py).

Rules (EngineConfig documents the knobs):
- admission: waiting requests join in order while fewer than `max_num_seqs` run and the KV pool
  has room for the next one (`fits`: its context's blocks and one more are free, engine/kv.py); a
  preempted request waits at the front; the engine refuses a request (`EngineFull`) when
  `max_num_seqs + max_waiting` are already held;
- a step runs the pending forwards of running requests in arrival order while their token rows
  (branches × window) fit `max_num_batched_tokens`; the first always runs, so a step never stalls;
  a request whose jobs do not fit is planned again next step (planning is pure). This is the one
  place the row budget is enforced: the draft budget chooser picks drafts without it, so under
  "auto" as under a fixed budget a pick that does not fit defers its request;
Scheduling changes which forwards share a call, never the tokens: rows of different forwards never
interact.
"""
from __future__ import annotations

from collections import deque

from specfold.engine.request import Request
from specfold.params import EngineConfig


class Scheduler:
    def __init__(self, config: EngineConfig):
        self.config = config

    def full(self, n_held: int) -> bool:
        c = self.config
        return n_held >= c.max_num_seqs + c.max_waiting

    def admit(self, waiting: deque, running: list[Request], fits=None, start=None) -> list[Request]:
        """Move waiting requests to `running` while they fit; `start(req)` runs as each joins (before
        the next is considered: its cache is part of what `fits` sees)."""
        joined = []
        while waiting and len(running) < self.config.max_num_seqs and (fits is None or fits(waiting[0])):
            req = waiting.popleft()
            running.append(req)
            joined.append(req)
            if start is not None:
                start(req)
        return joined

    def select(self, plans: list[tuple[Request, list]]) -> list[tuple[Request, list]]:
        """The planned requests whose jobs fit the step's row budget (the first always)."""
        budget = self.config.max_num_batched_tokens
        chosen, used = [], 0
        for req, jobs in plans:
            rows = sum(j.rows for j in jobs)
            if chosen and used + rows > budget:
                continue
            chosen.append((req, jobs))
            used += rows
        return chosen
