"""Connecting to a Ray cluster, or starting a local one, and checking that replicas fit in it.

Invariants:
- `connect` never starts a second cluster in a process: an already connected process keeps its
  connection (tests and notebooks call the CLI functions in-process). Without an address (nor
  `RAY_ADDRESS`, which is joined like `--ray-address`) it starts a new cluster, never joins one it
  finds on the machine (it would then shut down a cluster it did not start).
- A local cluster gets no dashboard, Ray's usage statistics are off, and Serve runs in Ray's
  throughput-optimised mode (`RAY_SERVE_THROUGHPUT_OPTIMIZED=1`: user code on the replica's event
  loop, gRPC between deployments; about a third less CPU per request on the way through Serve),
  and Serve's background loops run less often: the controller's loop every 0.5 s instead of 0.1 s,
  the replicas' and routers' metrics exported every 1 s instead of 0.1 s (an idle 2-replica cluster
  on two cores: ~1.3 instead of ~2-3 CPU s per 15 s), unless the environment sets them. `connect`
  says whether this process started the cluster (so that it alone shuts it down). A cluster that is
  joined keeps its own settings.
- Direct ingress: given `ingress_port` (`specfold serve` on a cluster it starts), the ingress
  replica itself listens on that port (Serve's direct ingress: the port range is that one port),
  so a request skips the HTTP proxy's hop (on two cores, half the CPU a request spends outside
  the engine). Its drain before shutdown is 0 s instead of Serve's 30 s (no load balancer has to
  deregister it) and a released port is not quarantined (a restarted ingress takes the same
  port). The proxy still runs (Serve serves HTTP only where a proxy is placed) on another port.
  `RAY_SERVE_ENABLE_DIRECT_INGRESS=0` in the environment keeps the proxy on the port instead;
  without `ingress_port` direct ingress is off.
- Replicas that a cluster cannot place are an error before anything is deployed on a local cluster
  (a deployment would wait forever), and a warning on a remote one (its autoscaler may add nodes).
"""
from __future__ import annotations

import os
import sys

from specfold.errors import SpecfoldError
from specfold.executor.ray_ranks import connect_ray

SERVE_ENV = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0",
             "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5", "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000"}


def direct_ingress_env(port: int) -> dict[str, str]:
    """Serve's settings for an ingress replica that listens on `port` itself (module doc)."""
    return {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1", "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(port),
            "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(port + 1),  # Serve's range excludes the maximum
            "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0", "RAY_SERVE_PORT_QUARANTINE_S": "0"}


def direct_ingress() -> bool:
    """Whether the cluster this process started serves HTTP from the ingress replica itself."""
    return os.environ.get("RAY_SERVE_ENABLE_DIRECT_INGRESS") == "1"


def connect(address: str | None = None, num_cpus: int | None = None,
            object_store_memory: int | None = None, ingress_port: int | None = None) -> bool:
    """Connect to the cluster at `address` ("auto", "ray://host:10001", "host:6379"), or start a
    local one (with `ingress_port`: direct ingress on it); True when this call started a local
    cluster. The joining and starting are executor/ray_ranks.py's `connect_ray` (one copy, shared
    with the tensor-parallel `ray` backend); this adds Serve's settings of a cluster it starts."""

    def serve_env() -> None:  # inherited by every process of the cluster
        if ingress_port is not None and os.environ.get("RAY_SERVE_ENABLE_DIRECT_INGRESS") != "0":
            os.environ.update(direct_ingress_env(ingress_port))
        for k, v in SERVE_ENV.items():
            os.environ.setdefault(k, v)
    return connect_ray(address, num_cpus, object_store_memory, before_start=serve_env)


def check_fits(replicas: int, num_cpus: float, num_gpus: float, strict: bool) -> None:
    """Error (strict) or warn unless the cluster has the CPUs and GPUs of `replicas` replicas."""
    import ray
    have = ray.cluster_resources()
    need = {"CPU": replicas * num_cpus, "GPU": replicas * num_gpus}
    short = [f"{need[k]:g} {k}s (the cluster has {have.get(k, 0):g})" for k in need
             if need[k] > 0 and need[k] > have.get(k, 0) + 1e-9]
    if not short:
        return
    msg = (f"{replicas} replica(s) of {num_cpus:g} CPU and {num_gpus:g} GPU need {' and '.join(short)}: "
           f"give fewer replicas, a smaller --replica-cpus, or --ray-address of a larger cluster")
    if strict:
        raise SpecfoldError(msg)
    print(f"warning: {msg}; waiting for the cluster to grow", file=sys.stderr)
