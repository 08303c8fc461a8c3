"""Rank 0's view of a tensor-parallel group: start the other ranks, connect, load, watch, stop.

Invariants:
- every sharded dimension is checked against N before any process starts or any weight is read;
- rank 0 waits for the others while they start and load without a timeout (a 100B shard takes
  minutes), but never for a rank that has died: its end is the error;
- a failed collective (a rank died, or the bounded timeout passed) ends the group: the error says
  which rank and how, the other ranks are stopped, and every later use raises the same line;
- `close()` (also at interpreter exit) tells the ranks to stop, then ends any that do not; ranks that
  rank 0 left inside a step (an exception mid-step: Ctrl-C) cannot listen, and are ended at once.
"""
from __future__ import annotations

import atexit
import json
import pickle
import time
import weakref

import torch

from specfold.errors import DistributedError, ParamsError
from specfold.executor.groups import Channel, collective_timeout, connect, store
from specfold.executor.worker import LoadArgs, device_of
from specfold.models.loader import load_model, read_spec
from specfold.models.parallel import Parallel, check_divisible, parameter_bytes

BACKENDS = ("mp", "ray")


class Ranks:
    def __init__(self, args: LoadArgs, size: int, expert_parallel: bool, backend: str):
        self.size, self.down = size, None
        addr = "127.0.0.1"
        if backend == "ray":
            from specfold.executor.ray_ranks import RayRanks, node_address
            addr = node_address()
        self.store = store(addr, 0, size, True)
        self.store.set("args", pickle.dumps((args, expert_parallel)))
        if backend == "ray":
            self.launcher = RayRanks(size, addr, self.store.port)
        else:
            from specfold.executor.local import LocalRanks
            self.launcher = LocalRanks(size, addr, self.store.port)
        atexit.register(_close, weakref.ref(self))
        try:
            self._wait("up")
            dev = device_of(args, getattr(self.launcher, "gpu0", 0))  # ray: the GPU of rank 0's bundle
            if dev.type == "cuda":
                torch.cuda.set_device(dev)  # NCCL binds each rank to its current device
            compute, control = connect(self.store, 0, size, dev)
            self.channel = Channel(control, self._failed)
            self.par = Parallel(0, size, expert_parallel, compute, self.channel, self.fault)
            self.model, self.spec, self.config = load_model(args.path, args.dtype, dev, args.overrides, args.vocab,
                                                            self.par)
            self.param_bytes = [parameter_bytes(self.model)] + self._wait("ready")
        except BaseException:
            self.close()
            raise

    def _wait(self, stage: str) -> list[int]:
        """Block until every other rank has reached `stage` ("up", "ready": its parameter bytes)."""
        got: dict[int, int] = {}
        while len(got) < self.size - 1:
            for r in range(1, self.size):
                if r not in got and self.store.check([f"{stage}/{r}"]):
                    info = json.loads(self.store.get(f"{stage}/{r}")) if stage == "ready" else {"bytes": 0}
                    if "error" in info:
                        raise DistributedError(f"tensor-parallel rank {r} could not load its shard: {info['error']}")
                    got[r] = info["bytes"]
            dead = {r: how for r, how in self.launcher.dead().items() if r not in got}
            if dead:
                r, how = next(iter(dead.items()))
                raise DistributedError(f"tensor-parallel rank {r} {how} while starting")
            time.sleep(0.05)
        return [got[r] for r in range(1, self.size)]

    # ------------------------------------------------------------------ faults
    def fault(self) -> str:
        """What failed (called when a collective raised); ends the group."""
        if self.down is None:
            self.down = self._diagnose()
            self.channel.down = self.down
            self.launcher.stop(0)
        return self.down

    def _failed(self, e: BaseException) -> DistributedError:
        return DistributedError(self.fault())

    def _diagnose(self) -> str:
        deadline = time.monotonic() + 2.0  # a killed rank's socket closes before its exit is reaped
        while time.monotonic() < deadline:
            dead = self.launcher.dead()
            if dead:
                r, how = sorted(dead.items())[0]
                return f"tensor-parallel rank {r} {how}; the request set is ended (restart to continue)"
            time.sleep(0.05)
        for r in range(1, self.size):
            try:
                if self.store.check([f"error/{r}"]):
                    return (f"tensor-parallel rank {r} failed: {self.store.get(f'error/{r}').decode()}; "
                            f"the request set is ended (restart to continue)")
            except RuntimeError:
                break
        s = collective_timeout().total_seconds()
        return (f"a tensor-parallel collective did not complete within {s:g} s (SPECFOLD_COLLECTIVE_TIMEOUT); "
                f"the request set is ended (restart to continue)")

    def close(self) -> None:
        """Stop the other ranks (once)."""
        launcher = getattr(self, "launcher", None)
        if launcher is None:
            return
        self.launcher = None
        channel = getattr(self, "channel", None)
        told = False
        # a step rank 0 left midway (Ctrl-C) holds the others in a collective: they cannot hear "stop"
        if self.down is None and channel is not None and not channel.busy:
            try:
                channel.send(("stop",))
                told = True
            except Exception:  # noqa: BLE001 (a rank is gone already: it is stopped below)
                pass
        launcher.stop(5 if told else 0)
        if channel is not None and self.down is None:
            channel.down = "the tensor-parallel group was closed"


def _close(ref) -> None:
    ranks = ref()
    if ranks is not None:
        ranks.close()


def start_ranks(args: LoadArgs, size: int, expert_parallel: bool = False, backend: str = "mp") -> Ranks:
    """The ranks of a model split `size` ways; rank 0 is this process. Checks every setting first."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ParamsError(f"tensor_parallel_size must be a positive integer, got {size!r}")
    if backend not in BACKENDS:
        raise ParamsError(f"distributed_executor_backend {backend!r} is not supported; accepted: {list(BACKENDS)}")
    spec, _ = read_spec(args.path, args.overrides, args.vocab)
    if expert_parallel and not spec.num_experts:
        raise ParamsError("enable_expert_parallel needs a mixture-of-experts checkpoint; this one has no experts")
    check_divisible(spec, size, expert_parallel)
    if backend == "mp" and args.device == "cuda" and torch.cuda.device_count() < size:  # ray: its placement group
        raise ParamsError(f"tensor_parallel_size={size} needs {size} GPUs; {torch.cuda.device_count()} are visible")
    torch.set_num_threads(max(1, args.threads))
    return Ranks(args, size, expert_parallel, backend)
