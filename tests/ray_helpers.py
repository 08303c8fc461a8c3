"""One local Ray cluster (and one Serve instance) per test process, shared by the Ray test modules.

Started on first use with a small object store, no dashboard, Serve's throughput mode (as
specfold/ray/cluster.py starts a local cluster) and 4 logical CPUs (two replicas and two Ray Data
actors of one CPU each fit at once; the machine may have fewer cores). Other processes (the CLI
under test) join it by its address. conftest.py shuts it down after the last test of a module that
uses it when the next test's module does not (an idle cluster with Serve costs ~8 % of a core for
the rest of the suite), and when the process exits; a later use starts it again.
"""
from __future__ import annotations

import atexit
import importlib.util
import os
import socket

import pytest

_state: dict = {}

# the Ray modules' skip without the ray extra: ray is looked up at collection, not imported (the import
# costs most of a second of CPU to every run that collects these modules and leaves them out by their
# mark, `make test-fast`); it is imported when a test first starts the cluster
needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="ray is not installed (pip install 'specfold[ray]')")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_cluster() -> str:
    """The GCS address of this process's local cluster (started on first call)."""
    if "address" not in _state:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        from specfold.ray.cluster import SERVE_ENV
        for k, v in SERVE_ENV.items():  # Serve's mode of a local cluster that specfold starts
            os.environ.setdefault(k, v)
        import ray
        ctx = ray.init(num_cpus=4, object_store_memory=96 * 2**20, include_dashboard=False, log_to_driver=False)
        _state["address"] = ctx.address_info["gcs_address"]
        atexit.register(shutdown)
    return _state["address"]


def shutdown() -> None:
    """Stop Serve and the cluster of `ray_cluster` (if started)."""
    if "address" not in _state:
        return
    import ray
    from ray import serve
    if "url" in _state:
        serve.shutdown()
    ray.shutdown()
    _state.clear()


def serve_url() -> str:
    """http://127.0.0.1:PORT of the cluster's Serve HTTP proxy (Serve started on first call)."""
    if "url" not in _state:
        ray_cluster()
        from ray import serve
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        _state["url"] = f"http://127.0.0.1:{port}"
    return _state["url"]
