"""The engine thread: one background thread steps the Engine; HTTP handlers talk to it through queues.

Invariants:
- Only the engine thread touches the Engine (it is single-threaded): `add_request`, `abort` and `step`
  all run there, between steps. Handlers only put commands on a thread-safe queue.
- One HTTP request = one `Group` of engine requests (its `n` choices, times its prompts). A group is
  added atomically: if the engine refuses one member (EngineFull, a bad parameter), the members already
  added are aborted and the group gets that one exception.
- A group's events arrive on one asyncio.Queue on the server's event loop (fed with
  `call_soon_threadsafe`): first an acknowledgement (None) or the refusal, then `(index, RequestDelta)`
  items until every member has finished.
- `Group.close()` on an unfinished group (the client went away) aborts its unfinished members in the
  engine before the next step, which frees their slots and caches; their later deltas are dropped.
- With nothing unfinished in the engine the thread blocks on the command queue (no busy loop). An
  exception from `Engine.step` (or a live request the engine no longer holds) is an internal error:
  it is logged, every live group receives it, its members are aborted, and the thread keeps serving.
- A `DistributedError` from `Engine.step` (a tensor-parallel rank died, or a collective timed out)
  ends the engine for good: it is logged as its one line, every live group (running and waiting
  requests) receives it, and so does every group submitted later (`down`, which /health reports);
  the thread keeps answering until the server stops.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import uuid
from dataclasses import asdict, dataclass

from specfold.errors import DistributedError

log = logging.getLogger("specfold.serve")


@dataclass(slots=True)
class RunnerCounters:
    """What the engine thread did (read by /health and the tests)."""
    added: int = 0  # engine requests accepted
    refused: int = 0  # groups the engine refused (EngineFull, bad parameters)
    finished: int = 0  # engine requests that finished (stop or length)
    aborted: int = 0  # engine requests aborted because their client went away
    steps: int = 0  # Engine.step calls
    max_running: int = 0  # most requests in the engine at one step (> 1: clients were batched)
    step_errors: int = 0


class Group:
    """The engine requests of one HTTP request, seen from the event loop."""

    def __init__(self, runner: "EngineRunner", rids: list[str]):
        self.runner, self.rids = runner, rids
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.unfinished = set(range(len(rids)))
        self.closed = False

    def put(self, item) -> None:  # engine thread
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the event loop is gone (shutdown)
            pass

    async def started(self) -> None:
        """Wait until the engine accepted every member; re-raise its refusal otherwise."""
        item = await self.queue.get()
        if isinstance(item, BaseException):
            self.closed = True
            raise item

    async def events(self):
        """Yield `(index, RequestDelta)` until every member has finished."""
        while self.unfinished:
            item = await self.queue.get()
            if isinstance(item, BaseException):
                self.closed = True
                raise item
            index, delta = item
            if delta.finished:
                self.unfinished.discard(index)
            yield index, delta

    def close(self) -> None:
        """Abort the members that have not finished (idempotent)."""
        if not self.closed and self.unfinished:
            self.runner.abort([self.rids[i] for i in sorted(self.unfinished)])
        self.closed = True


class EngineRunner:
    """Owns the engine thread. `submit` and `abort` may be called from any thread."""

    def __init__(self, engine):
        self.engine = engine
        self.counters = RunnerCounters()
        self._cmds: queue.SimpleQueue = queue.SimpleQueue()
        self._live: dict[str, tuple[Group, int]] = {}  # engine thread only
        self.down: DistributedError | None = None  # the tensor-parallel group failed: every request gets it
        self._thread = threading.Thread(target=self._run, name="specfold-engine", daemon=True)

    # ------------------------------------------------------------------ any thread
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._cmds.put(None)
        self._thread.join(timeout)

    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, items: list[tuple[list[int], object]], stream: bool = True) -> Group:
        """Queue `(prompt_ids, SamplingParams)` items as one group (call from the event loop).
        `stream`: whether the client reads the deltas as they come (a remote runner may send a
        non-streamed group's deltas merged, one per request; here they cost nothing either way)."""
        group = Group(self, [f"req-{uuid.uuid4().hex[:16]}" for _ in items])
        self._cmds.put(("add", group, items))
        return group

    def abort(self, rids: list[str]) -> None:
        self._cmds.put(("abort", rids))

    def running(self) -> int:
        """Engine requests that are neither finished nor aborted (approximate off the engine thread)."""
        return len(self._live)

    def queue_state(self) -> tuple[int, int]:
        """(running, waiting) requests in the engine (approximate off the engine thread: /metrics)."""
        return self.engine.num_running(), len(self.engine.waiting)

    def kv_state(self) -> dict:
        """The KV pool's blocks and the engine's preemption and prefix-cache counts (approximate off
        the engine thread: /metrics, /health)."""
        kv = self.engine.kv
        return {**kv.health(), "num_preemptions": kv.preemptions, "prefix_cache_queries": kv.queries,
                "prefix_cache_hits": kv.hits}

    def health(self) -> dict:
        """What /health reports besides its status: live requests, the counters, the KV pool."""
        return {"running": self.running(), **asdict(self.counters), **self.kv_state()}

    # ------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        while True:
            if self._live and not self.engine.has_unfinished():  # an engine bug: never leave a client hanging
                self._fail_live(RuntimeError("the engine dropped requests without a final delta"))
            cmd = self._cmds.get() if not self.engine.has_unfinished() else self._get_nowait()
            while cmd is not False:
                if cmd is None:
                    return
                try:
                    self._apply(cmd)
                except Exception:  # a bug in add/abort must not kill the engine thread
                    log.exception("engine command %r failed", cmd[0])
                cmd = self._get_nowait()
            if self.engine.has_unfinished():
                self._step()

    def _get_nowait(self):
        try:
            return self._cmds.get_nowait()
        except queue.Empty:
            return False

    def _apply(self, cmd) -> None:
        if cmd[0] == "add":
            self._add(cmd[1], cmd[2])
        else:
            for rid in cmd[1]:
                if self._live.pop(rid, None) is not None:
                    self.engine.abort(rid)
                    self.counters.aborted += 1

    def _add(self, group: Group, items) -> None:
        if self.down is not None:  # the engine cannot run again: refused before the engine sees it
            self.counters.refused += 1
            group.put(self.down)
            return
        added = []
        try:
            for rid, (ids, params) in zip(group.rids, items):
                self.engine.add_request(ids, params, request_id=rid)
                added.append(rid)
        except Exception as e:  # EngineFull, ParamsError, ...: the group is refused as a whole
            for rid in added:
                self.engine.abort(rid)
            self.counters.refused += 1
            group.put(e)
            return
        for i, rid in enumerate(added):
            self._live[rid] = (group, i)
        self.counters.added += len(added)
        group.put(None)

    def _step(self) -> None:
        self.counters.max_running = max(self.counters.max_running, len(self._live))
        try:
            deltas = self.engine.step()
        except DistributedError as e:  # a rank or a collective failed: no later step can run
            log.error("the engine stopped: %s", e)
            self.down = e
            self.counters.step_errors += 1
            self._fail_live(e)
            return
        except Exception as e:  # an internal error: fail the live requests, keep serving
            log.exception("engine step failed")
            self.counters.step_errors += 1
            self._fail_live(e)
            return
        self.counters.steps += 1
        for d in deltas:
            entry = self._live.get(d.request_id)
            if entry is None:
                continue  # aborted after this step was planned
            group, index = entry
            group.put((index, d))
            if d.finished:
                del self._live[d.request_id]
                self.counters.finished += 1

    def _fail_live(self, e: Exception) -> None:
        """Hand `e` to every live group (an internal error) and abort their requests."""
        log.error("failing %d live requests: %s", len(self._live), e)
        live, self._live = self._live, {}
        for rid, (group, _) in live.items():
            group.put(e)
            try:
                self.engine.abort(rid)
            except Exception:
                log.exception("abort after an internal error failed")
