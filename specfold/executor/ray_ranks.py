"""`ray`: ranks 1..N-1 as Ray actors in one placement group, so a tensor-parallel group can span the
nodes of a Ray cluster (vLLM's `distributed_executor_backend="ray"`).

Invariants:
- one placement group of N bundles, one per rank (`{"CPU": threads}` on the CPU, `{"GPU": 1}` on
  CUDA), strategy PACK (one node when it fits, several otherwise). Bundle 0 is rank 0's, this
  process's: it is pinned to this node (Ray's `node:<ip>` resource) and reserves rank 0's share;
  rank r > 0 is an actor in bundle r that calls `worker.run_rank` in one remote method.
- placing the group never hangs: on a cluster this process started, bundles that exceed its CPUs or
  GPUs are one line at once; on a joined cluster (its autoscaler may add nodes) a warning, and a
  group still unplaced after `SPECFOLD_RAY_PLACEMENT_TIMEOUT` seconds (default 300) is one line
  naming the bundles and what the cluster has. The group is removed on every error.
- an actor sees only its own GPU (Ray sets CUDA_VISIBLE_DEVICES): its rank runs on `cuda:0`; rank 0
  runs on the GPU Ray gave bundle 0 (asked of a probe task placed there).
- `SPECFOLD_*` variables of this process reach the actors (a cluster's workers do not inherit the
  driver's environment).
- `stop` waits for the run methods to return, then kills the actors and removes the group; it may be
  called again. The actors are owned by this process: Ray ends them if it dies.
- `connect_ray` is the one copy of "join RAY_ADDRESS or start a local cluster" (specfold/ray/cluster.py
  builds `serve --replicas` on it); nothing here imports ray before it is needed.
"""
from __future__ import annotations

import importlib.util
import os
import sys

from specfold.errors import DistributedError, SpecfoldError

_started_here = [False]  # whether this process started the cluster it is connected to


def _require_ray() -> None:
    if importlib.util.find_spec("ray") is None:
        from specfold.extras import MissingExtraError, hint
        raise MissingExtraError(hint("distributed_executor_backend='ray'", "ray", "ray"))


def connect_ray(address: str | None = None, num_cpus: int | None = None, object_store_memory: int | None = None,
                before_start=None) -> bool:
    """Connect to the cluster at `address` ("auto", "ray://host:10001", "host:6379"; default
    RAY_ADDRESS), or start a local one (`before_start()` runs first: environment for its processes).
    A process already connected keeps its connection. True when this call started a local cluster."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None  # Ray's own variable: join that cluster
    if address == "local":
        address = None
    if address:
        try:
            ray.init(address=address, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise SpecfoldError(f"cannot connect to the Ray cluster at {address!r}: {first}") from None
        return False
    if before_start is not None:
        before_start()
    ray.init(address="local", num_cpus=num_cpus, object_store_memory=object_store_memory,  # a new cluster,
             include_dashboard=False, log_to_driver=False)  # never one found on the machine
    _started_here[0] = True
    return True


def node_address() -> str:
    """This node's IP as the cluster sees it (where the other ranks reach rank 0's store); connects first."""
    _require_ray()
    connect_ray()
    import ray
    if ray.util.client.ray.is_connected():
        raise DistributedError("distributed_executor_backend='ray' runs rank 0 in this process, on a node of the "
                               "cluster: a ray:// client connection is not supported (run on a cluster node, "
                               "RAY_ADDRESS=auto)")
    return ray.util.get_node_ip_address()


def placement_timeout() -> float:
    return float(os.environ.get("SPECFOLD_RAY_PLACEMENT_TIMEOUT", "300"))


def _totals(bundles: list[dict]) -> dict[str, float]:
    out: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            if k in ("CPU", "GPU"):
                out[k] = out.get(k, 0) + v
    return out


def _describe(size: int, each: dict) -> str:
    what = ", ".join(f"{v:g} {k}" for k, v in each.items())
    return f"{size} bundles of {{{what}}} (one per tensor-parallel rank)"


def _has(have: dict) -> str:
    return f"the cluster has {have.get('CPU', 0):g} CPUs and {have.get('GPU', 0):g} GPUs"


class _Rank:
    """Rank r > 0 in its bundle (wrapped by `ray.remote` when used)."""

    def pid(self) -> int:
        return os.getpid()

    def run(self, rank: int, size: int, addr: str, port: int) -> None:
        import ray
        from specfold.executor.worker import run_rank
        run_rank(rank, size, addr, port, 0 if ray.get_gpu_ids() else None)  # Ray shows the actor its GPU only


def _gpu_ids() -> list:
    import ray
    return list(ray.get_gpu_ids())


def _ended(e: BaseException | None) -> str:
    """How a rank's run ended: `e` is what ray.get raised (None: it returned)."""
    if e is None:
        return "ended (its Ray actor returned)"
    import ray
    if isinstance(e, ray.exceptions.RayTaskError):
        from specfold.executor.worker import one_line
        return f"failed ({one_line(getattr(e, 'cause', None) or e)})"
    text = " ".join(str(e).split())
    for key in ("Worker exit detail: ", "The actor is dead because "):
        if key in text:
            text = text.split(key, 1)[1]
            break
    return f"died (its Ray actor: {text.split('. ')[0].rstrip('.')[:200]})"


class RayRanks:
    def __init__(self, size: int, addr: str, port: int):
        import pickle

        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from specfold.executor.groups import store
        args, _ = pickle.loads(store(addr, port, size, False).get("args"))
        self.size, self.actors, self.runs, self.pid_refs = size, {}, {}, {}
        self._pids: dict[int, int] | None = None
        self._ended: dict[int, str] = {}
        self.stopped, self.gpu0 = False, 0
        gpu = args.device == "cuda"
        each = {"GPU": 1.0} if gpu else {"CPU": float(max(1, args.threads))}
        bundles = [dict(each) for _ in range(size)]
        bundles[0][f"node:{addr}"] = 0.001  # rank 0 is this process: its bundle is on this node
        self.pg = None
        need, have = _totals(bundles), ray.cluster_resources()
        short = any(v > have.get(k, 0) + 1e-9 for k, v in need.items())
        msg = f"distributed_executor_backend='ray' asks for {_describe(size, each)} and {_has(have)}"
        if short and _started_here[0]:
            raise DistributedError(f"{msg}: give a smaller tensor_parallel_size, fewer threads, or RAY_ADDRESS "
                                   f"of a larger cluster")
        if short:
            print(f"warning: {msg}; waiting {placement_timeout():g} s for the cluster to grow", file=sys.stderr)
        try:
            self.pg = placement_group(bundles, strategy="PACK")
            if not self.pg.wait(placement_timeout()):
                raise DistributedError(f"{msg}, and its placement group was not placed within "
                                       f"{placement_timeout():g} s (SPECFOLD_RAY_PLACEMENT_TIMEOUT): see `ray status`")
            if gpu:
                self.gpu0 = self._driver_gpu(ray.remote(_gpu_ids).options(
                    num_cpus=0, num_gpus=1, scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, 0)))
            env = {k: v for k, v in os.environ.items() if k.startswith("SPECFOLD_")}
            actor = ray.remote(_Rank)
            for r in range(1, size):
                self.actors[r] = actor.options(
                    num_cpus=0 if gpu else each["CPU"], num_gpus=1 if gpu else 0, max_restarts=0,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, r),
                    runtime_env={"env_vars": env} if env else None).remote()
                self.pid_refs[r] = self.actors[r].pid.remote()  # an actor runs its calls in order: before run
                self.runs[r] = self.actors[r].run.remote(r, size, addr, port)
        except BaseException as e:
            self.stop(0)
            if isinstance(e, SpecfoldError) or not isinstance(e, Exception):
                raise
            raise DistributedError(f"distributed_executor_backend='ray' could not place its ranks: "
                                   f"{' '.join(str(e).split())[:300]}") from None

    @staticmethod
    def _driver_gpu(probe) -> int:
        """This process's CUDA index of the GPU Ray gave bundle 0."""
        import ray
        ids = ray.get(probe.remote(), timeout=placement_timeout())
        gid = str(ids[0])
        visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        if not visible:
            return int(gid)
        if gid not in visible:
            raise DistributedError(f"Ray gave rank 0 GPU {gid}, which CUDA_VISIBLE_DEVICES={','.join(visible)} "
                                   f"hides from this process")
        return visible.index(gid)

    def dead(self) -> dict[int, str]:
        """Ranks whose run has ended (returned, raised, or its actor died) -> how."""
        if self.stopped:
            return dict(self._ended)
        import ray
        pending = {ref: r for r, ref in self.runs.items() if r not in self._ended}
        if pending:
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0, fetch_local=False)
            for ref in ready:
                try:
                    ray.get(ref, timeout=5)
                    err = None
                except BaseException as e:  # noqa: BLE001 (how the rank ended is the answer)
                    err = e
                self._ended[pending[ref]] = _ended(err)
        return dict(self._ended)

    def pids(self) -> dict[int, int]:
        """The actors' process ids (each asked of its actor)."""
        if self._pids is None:
            import ray
            ranks = sorted(self.pid_refs)
            self._pids = dict(zip(ranks, ray.get([self.pid_refs[r] for r in ranks], timeout=60)))
        return dict(self._pids)

    def stop(self, wait_s: float) -> None:
        """Wait up to `wait_s` s for the runs to return, then kill the actors and remove the group (once)."""
        if self.stopped:
            return
        import ray
        if not ray.is_initialized():  # Ray shut down first: the job's actors and group went with it
            self.stopped = True
            return
        from ray.util.placement_group import remove_placement_group
        runs = list(self.runs.values())
        if runs and wait_s > 0:
            ray.wait(runs, num_returns=len(runs), timeout=wait_s, fetch_local=False)
        self.dead()  # how each run ended, before the kill (`dead()` keeps answering it)
        self.stopped = True
        for a in self.actors.values():
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 (already gone)
                pass
        if self.pg is not None:
            try:
                remove_placement_group(self.pg)
            except Exception:  # noqa: BLE001 (already removed)
                pass
