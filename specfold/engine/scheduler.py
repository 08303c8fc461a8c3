"""Scheduling: admission under `max_num_seqs`, the per-step row budget, and the adaptive draft budget.

Rules (EngineConfig documents the knobs):
- admission: waiting requests join in arrival order while fewer than `max_num_seqs` run; the engine
  refuses a request (`EngineFull`) when `max_num_seqs + max_waiting` are already held;
- a step runs the pending forwards of running requests in arrival order while their token rows
  (branches × window) fit `max_num_batched_tokens`; the first always runs, so a step never stalls;
  a request whose jobs do not fit is planned again next step (the same jobs: planning is pure);
- adaptive drafts: with n running requests and block windows of N positions, each verification
  gets at most max(0, (draft_rows - n·N) // (n·N)) draft branches: the roots always fit, drafts
  only use the rows left. With `adaptive_drafts=False` there is no cap (the method's own B).
Scheduling changes which forwards share a call and how many drafts a request verifies, never the
tokens: rows of different forwards never interact, and drafts are lossless.
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

    def admit(self, waiting: deque, running: list[Request]) -> list[Request]:
        joined = []
        while waiting and len(running) < self.config.max_num_seqs:
            req = waiting.popleft()
            running.append(req)
            joined.append(req)
        return joined

    def draft_budget(self, n_running: int, window: int) -> int | None:
        c = self.config
        if not c.adaptive_drafts:
            return None
        rows = max(1, n_running) * max(1, window)
        return max(0, (c.draft_rows - rows) // rows)

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
