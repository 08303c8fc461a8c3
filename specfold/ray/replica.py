"""A Ray Serve replica holding one engine (the deployment `SpecfoldEngine`).

Invariants:
- One replica = one LLM and one Engine, stepped by the same EngineRunner thread as the single-process
  server (serve/runner.py); the replica adds nothing to decoding, so its tokens are the server's.
- `generate(items, merged)` streams one group of engine requests: first `("accepted", replica_id)`
  once every member is in the engine (else the engine's refusal is raised: EngineFull, ParamsError),
  then `(index, RequestDelta)` until every member has finished; `merged` (a client that does not
  stream) sends one delta per member when it finishes, its text and tokens those of all its deltas
  (fewer messages, the same response). A cancelled call (the client left, the ingress gave up)
  aborts the unfinished members in the engine before its next step.
- The replica reports its state and counters to the ingress deployment named `report_to` at start,
  every `health_check_period_s` and when it stops. Serve's health check fails once the engine thread
  is dead, so Serve replaces such a replica.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import asdict

import ray
import torch
from ray import serve

from specfold.engine.engine import RequestDelta
from specfold.ray.config import SpecfoldLLMConfig

log = logging.getLogger("specfold.ray")
ENGINE_DEPLOYMENT = "SpecfoldEngine"
SERVE_NAMESPACE = "serve"  # Ray Serve's actors (replicas included) live in this Ray namespace


@serve.deployment(name=ENGINE_DEPLOYMENT)
class EngineReplica:
    async def __init__(self, config: SpecfoldLLMConfig, report_to: str | None = None):
        from specfold.engine.engine import Engine
        from specfold.serve.runner import EngineRunner
        llm = config.load()
        self.runner = EngineRunner(Engine(llm, llm.engine_config))
        self.runner.start()
        ctx, rt = serve.get_replica_context(), ray.get_runtime_context()
        self.identity = {"replica_id": ctx.replica_tag, "actor_name": rt.get_actor_name(),
                         "namespace": SERVE_NAMESPACE, "node_id": rt.get_node_id(), "pid": os.getpid(),
                         "num_cpus": config.num_cpus, "num_gpus": config.num_gpus,
                         "torch_threads": torch.get_num_threads()}  # what torch runs with, as set by load()
        self.requests_served = 0
        self.started = time.time()
        self.period = config.health_check_period_s
        self.ingress = serve.get_deployment_handle(report_to, app_name=ctx.app_name) if report_to else None
        self.reporter = asyncio.get_running_loop().create_task(self._report_forever()) if report_to else None

    # ------------------------------------------------------------------ requests
    async def generate(self, items: list, merged: bool = False):
        """Stream one group (see the module docstring)."""
        group = self.runner.submit(items)
        try:
            await group.started()
            yield ("accepted", self.identity["replica_id"])
            texts, ids, lps = [""] * len(items), [[] for _ in items], [[] for _ in items]
            async for index, d in group.events():
                if not merged:
                    yield index, d
                    continue
                texts[index] += d.text_delta
                ids[index] += d.new_token_ids
                lps[index] += d.new_logprobs or []
                if d.finished:
                    yield index, RequestDelta(d.request_id, ids[index], texts[index], True, d.finish_reason, d.output,
                                              lps[index] if d.new_logprobs is not None else None)
            self.requests_served += 1
        finally:
            group.close()

    def check_health(self) -> None:
        """Serve's health check: a replica whose engine thread died is replaced."""
        if not self.runner.alive():
            raise RuntimeError("the engine thread of this replica is not running")

    # ------------------------------------------------------------------ reports
    def snapshot(self, state: str | None = None) -> dict:
        waiting = self.runner.queue_state()[1]
        return {**self.identity, "state": state or ("RUNNING" if self.runner.alive() else "UNHEALTHY"),
                "requests_served": self.requests_served, "running": self.runner.running(), "waiting": waiting,
                "started": self.started, **asdict(self.runner.counters)}

    async def _report_forever(self) -> None:
        while True:
            try:
                await self.ingress.report.remote(self.snapshot())
            except Exception as e:  # the ingress is (re)starting: the next report will do
                log.debug("report to the ingress failed: %r", e)
            await asyncio.sleep(self.period)

    def __del__(self):  # Serve stops the replica (scale down, redeploy, shutdown)
        if getattr(self, "reporter", None) is not None:
            self.reporter.cancel()
            try:
                self.ingress.report.remote(self.snapshot("STOPPED"))
            except Exception:  # noqa: BLE001 (best effort: the ingress may be gone too)
                pass
        if getattr(self, "runner", None) is not None:
            self.runner.stop(timeout=2.0)
