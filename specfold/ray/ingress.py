"""The OpenAI ingress of a Ray Serve application: the single-process server's FastAPI app
(serve/app.py: validation, tokenisation, `n`, stop strings, streaming, error bodies), with a runner
that routes each request's group to an engine replica (replica.py) through a DeploymentHandle.

Invariants:
- There is one OpenAI code path: `create_app` of serve/app.py, given `RemoteRunner` instead of the
  local engine thread. Nothing here parses or shapes OpenAI bodies.
- A group goes to one replica, chosen by Serve's router. A refusal before any token (the replica's
  engine is full, or the replica died before accepting) is retried on another replica, at most
  `attempts` times; when every try is refused the client gets 429 `engine_full` (every replica full)
  or 503 `replica_unavailable`. Nothing is retried once a replica has accepted a group.
- A replica that dies while it holds a group ends that group with 503 `replica_unavailable` (an
  OpenAI error body, or one `data: {"error": ...}` event in a stream): no request waits on a dead
  replica.
- Closing a group that has not finished cancels its call, which aborts its engine requests.
- `/health` lists every replica the ingress has heard from (`ReplicaRegistry`), one entry each,
  with its state (RUNNING, UNHEALTHY, UNRESPONSIVE, STOPPED, DEAD) and `requests_served`.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import fields

import ray
from ray import serve

from specfold.errors import EngineFull
from specfold.ray.config import SpecfoldLLMConfig, model_info
from specfold.serve.protocol import ApiError
from specfold.serve.runner import RunnerCounters

log = logging.getLogger("specfold.ray")
INGRESS_DEPLOYMENT = "SpecfoldIngress"
COUNTERS = [f.name for f in fields(RunnerCounters)]
LIVE = ("RUNNING", "UNHEALTHY")  # states a replica reports about itself


def _lost(e: BaseException) -> bool:
    """The replica (its actor, worker or node) went away."""
    from ray.exceptions import (LocalRayletDiedError, NodeDiedError, ObjectLostError, RayActorError,
                                WorkerCrashedError)
    from ray.serve.exceptions import ReplicaUnavailableError
    return isinstance(e, (RayActorError, ReplicaUnavailableError, WorkerCrashedError, NodeDiedError,
                          ObjectLostError, LocalRayletDiedError))


def _cause(e: BaseException) -> BaseException:
    """The replica's own exception inside Ray's wrapper (RayTaskError keeps it as `cause`)."""
    from ray.exceptions import RayTaskError
    while isinstance(e, RayTaskError) and e.cause is not None and e.cause is not e:
        e = e.cause
    return e


def lost_error(e: BaseException) -> ApiError:
    return ApiError(503, f"the engine replica serving this request stopped ({type(e).__name__}); retry",
                    code="replica_unavailable", type="server_error")


class ReplicaRegistry:
    """The ingress's view of the engine replicas: their latest reports, and who has gone silent."""

    def __init__(self, period_s: float, keep_dead: int = 16):
        self.period, self.keep_dead = period_s, keep_dead
        self.entries: dict[str, dict] = {}  # replica_id -> latest report (+ "seen", monotonic)

    def report(self, rep: dict) -> None:
        old = self.entries.get(rep["replica_id"])
        if old is not None and old["state"] == "DEAD":
            return  # a late report from a replica already found dead
        self.entries[rep["replica_id"]] = dict(rep, seen=time.monotonic())

    def silent(self) -> list[dict]:
        """Replicas that should be alive but have not reported for three periods."""
        limit = time.monotonic() - 3 * self.period
        return [e for e in self.entries.values() if e["state"] in LIVE + ("UNRESPONSIVE",) and e["seen"] < limit]

    def mark(self, replica_id: str, state: str) -> None:
        self.entries[replica_id]["state"] = state
        dead = sorted((e for e in self.entries.values() if e["state"] in ("DEAD", "STOPPED")),
                      key=lambda e: e["seen"])
        for e in dead[:-self.keep_dead]:
            del self.entries[e["replica_id"]]

    def replicas(self) -> list[dict]:
        now = time.monotonic()
        return [{k: v for k, v in dict(e, last_report_s=round(now - e["seen"], 3)).items() if k != "seen"}
                for e in sorted(self.entries.values(), key=lambda e: e["started"])]

    def running(self) -> list[dict]:
        return [e for e in self.entries.values() if e["state"] == "RUNNING"]


async def check(registry: ReplicaRegistry, entry: dict, alive_state: str | None) -> None:
    """Mark a replica DEAD when Ray no longer knows its actor, else `alive_state` (None: unchanged)."""
    try:
        await asyncio.to_thread(ray.get_actor, entry["actor_name"], namespace=entry["namespace"])
    except ValueError:  # no live actor of that name
        registry.mark(entry["replica_id"], "DEAD")
        return
    if alive_state is not None:
        registry.mark(entry["replica_id"], alive_state)


async def check_silent(registry: ReplicaRegistry) -> None:
    """Silent replicas are DEAD (their actor is gone) or UNRESPONSIVE."""
    for e in registry.silent():
        await check(registry, e, "UNRESPONSIVE")


class RemoteGroup:
    """One request's engine requests on a replica, with the interface of serve/runner.py's Group."""

    def __init__(self, runner: "RemoteRunner", items: list, stream: bool):
        self.runner, self.items, self.stream = runner, items, stream
        self.unfinished = set(range(len(items)))
        self.gen = None
        self.closed = False
        self.replica: str | None = None

    async def started(self) -> None:
        """Wait until a replica accepted every member; raise its refusal otherwise (see module doc)."""
        from ray.serve.exceptions import BackPressureError
        last: BaseException | None = None
        for _ in range(self.runner.attempts()):
            self.gen = self.runner.handle.options(stream=True).generate.remote(self.items, merged=not self.stream)
            try:
                _, self.replica = await self.gen.__anext__()
                return
            except BackPressureError:
                raise ApiError(429, "every engine replica is full and Serve's queue too; retry later",
                               code="engine_full", type="server_error") from None
            except Exception as e:  # noqa: BLE001 (sorted below)
                cause = _cause(e)
                if not (isinstance(cause, EngineFull) or _lost(cause)):
                    self.closed = True
                    raise cause from None
                last = cause
        self.closed = True
        if isinstance(last, EngineFull):
            raise ApiError(429, f"every engine replica is full ({last}); retry later", code="engine_full",
                           type="server_error")
        raise lost_error(last)

    async def events(self):
        """Yield `(index, RequestDelta)` until every member has finished."""
        try:
            async for index, delta in self.gen:
                if delta.finished:
                    self.unfinished.discard(index)
                yield index, delta
        except Exception as e:  # noqa: BLE001 (sorted below)
            self.closed = True
            cause = _cause(e)
            if not _lost(cause):
                raise cause from None
            self.runner.suspect(self.replica)
            raise lost_error(cause) from None
        if self.unfinished:
            raise RuntimeError(f"the replica's stream ended with {len(self.unfinished)} unfinished requests")

    def close(self) -> None:
        """Cancel the call if a member has not finished (idempotent): the replica aborts them."""
        if not self.closed and self.unfinished and self.gen is not None:
            self.gen.cancel()
        self.closed = True


class RemoteRunner:
    """What serve/app.py's handlers need of a runner, over the engine replicas."""

    def __init__(self, handle, registry: ReplicaRegistry, max_replicas: int):
        self.handle, self.registry, self.max_replicas = handle, registry, max_replicas
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.registry.period)
            try:
                await check_silent(self.registry)
            except Exception:  # noqa: BLE001 (a GCS hiccup: look again next period)
                log.exception("checking silent replicas failed")

    def suspect(self, replica_id: str | None) -> None:
        """A call to this replica failed as if it were gone: look now, not after three silent periods."""
        entry = self.registry.entries.get(replica_id)
        if entry is not None and entry["state"] != "DEAD":
            asyncio.get_running_loop().create_task(check(self.registry, entry, None))

    def attempts(self) -> int:
        """Tries per group: enough for the router to reach every replica, plus one for a death."""
        return 2 * max(len(self.registry.running()), self.max_replicas) + 1

    def submit(self, items: list, stream: bool = True) -> RemoteGroup:
        return RemoteGroup(self, items, stream)

    def alive(self) -> bool:
        return bool(self.registry.running())

    def running(self) -> int:
        return sum(e["running"] for e in self.registry.running())

    def queue_state(self) -> tuple[int, int]:
        """(running, waiting) engine requests over the live replicas, as of their last reports."""
        live = self.registry.running()
        return sum(e["running"] for e in live), sum(e.get("waiting", 0) for e in live)

    @property
    def counters(self) -> RunnerCounters:
        """The replicas' counters summed (those of replicas the ingress has heard from)."""
        live = self.registry.entries.values()
        return RunnerCounters(**{k: sum(e.get(k, 0) for e in live) for k in COUNTERS})

    def health(self) -> dict:
        from dataclasses import asdict
        return {"running": self.running(), **asdict(self.counters), "replicas": self.registry.replicas()}


@serve.deployment(name=INGRESS_DEPLOYMENT, ray_actor_options={"num_cpus": 0})
@serve.ingress()
class OpenAIIngress:
    """The FastAPI app of serve/app.py over the replicas of `engine` (a DeploymentHandle)."""

    def __init__(self, engine, config: SpecfoldLLMConfig):
        from specfold.serve.app import ServeConfig
        self.info = model_info(config.model_source, config.llm_kwargs.get("overrides"))
        self.registry = ReplicaRegistry(config.health_check_period_s)
        self.runner = RemoteRunner(engine, self.registry, config.bounds[1])
        self.serve_config = ServeConfig(model_name=config.name, max_tokens=config.max_tokens,
                                        temperature=config.temperature, **config.server_kwargs)

    def __serve_build_asgi_app__(self):
        from specfold.serve.app import create_app
        return create_app(self.info, None, self.serve_config, runner=self.runner)

    def report(self, rep: dict) -> None:
        """A replica's state and counters (called by the replicas through a handle)."""
        self.registry.report(rep)


def build_llm_deployment(config: SpecfoldLLMConfig, report_to: str | None = INGRESS_DEPLOYMENT):
    """The engine replicas as a bound Serve deployment (a node for the user's own application)."""
    from specfold.ray.replica import EngineReplica
    return EngineReplica.options(**config.deployment_options()).bind(config, report_to)


def build_openai_app(config: SpecfoldLLMConfig):
    """An OpenAI-compatible Serve application: the ingress over `config`'s engine replicas.

        app = build_openai_app(SpecfoldLLMConfig(model_source="tiny", num_replicas=2))
        serve.run(app, name="specfold", route_prefix="/")
    """
    lo, hi = config.bounds
    capacity = max(hi, 1) * config.capacity()
    ingress = OpenAIIngress.options(max_ongoing_requests=2 * capacity + 16)
    return ingress.bind(build_llm_deployment(config), config)
