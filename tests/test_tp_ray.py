"""The `ray` tensor-parallel backend (executor/ray_ranks.py) on the local test cluster of
tests/ray_helpers.py: rank 1 is a Ray actor in the group's placement group and decodes the tokens of
the `mp` backend and of one rank (float64, vanilla, Spiffy and SpecFold at delta 0); `close()`
removes the group and ends the actor; a killed actor ends the request set with one line; a group
the cluster has no room for is one line (at once on a cluster this process started, after
SPECFOLD_RAY_PLACEMENT_TIMEOUT on a joined one); without Ray the backend names the extra.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from specfold import LLM, DecodeParams
from specfold.errors import DistributedError
from tests.ray_helpers import needs_ray, ray_cluster

pytestmark = [pytest.mark.ray, needs_ray]

QUESTIONS = ["What is 3 + 4?", "Count from 5 to 9.", "Name a colour."]
METHODS = {
    "vanilla": dict(method="vanilla"),
    "spiffy": dict(method="spiffy", draft_budget=2),
    "specfold": dict(method="specfold", delta=0.0, draft_budget=2),
}


def _groups() -> dict[str, str]:
    from ray.util.placement_group import placement_group_table
    return {k: v["state"] for k, v in placement_group_table().items()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its raylet) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def llms():
    """One rank, `mp` and `ray` (the last one made again by `_ray` if a test closed it)."""
    ray_cluster()
    made = {"one": LLM("tiny", dtype="float64"),
            "mp": LLM("tiny", dtype="float64", tensor_parallel_size=2, distributed_executor_backend="mp")}
    yield made
    for k in ("mp", "ray"):
        if k in made:
            made[k].close()


def _ray(llms) -> LLM:
    if "ray" not in llms:
        llms["ray"] = LLM("tiny", dtype="float64", tensor_parallel_size=2, distributed_executor_backend="ray")
    return llms["ray"]


def _ids(llm, params):
    return [o.token_ids for o in llm.generate(QUESTIONS, params)]


@pytest.mark.parametrize("name", list(METHODS))
def test_ray_tokens_equal_mp_and_one_rank(llms, name):
    from specfold.executor.local import LocalRanks
    from specfold.executor.ray_ranks import RayRanks
    two = _ray(llms)
    assert isinstance(two.ranks.launcher, RayRanks) and isinstance(llms["mp"].ranks.launcher, LocalRanks)
    pid = two.ranks.launcher.pids()[1]
    assert pid != os.getpid() and _alive(pid)  # rank 1 runs in the actor's own process
    p = DecodeParams(chat_template=True, max_new_tokens=32, rule="static", **METHODS[name])
    one = _ids(llms["one"], p)
    assert sum(map(len, one)) > 40  # real answers, not an immediate stop
    assert _ids(llms["mp"], p) == one
    assert _ids(two, p) == one


def test_close_removes_the_placement_group_and_ends_the_actor(llms):
    two = _ray(llms)
    launcher = two.ranks.launcher
    pg, pid = launcher.pg.id.hex(), launcher.pids()[1]
    assert _groups()[pg] == "CREATED"
    two.close()
    del llms["ray"]
    assert _groups()[pg] == "REMOVED"
    assert launcher.dead() == {1: "ended (its Ray actor returned)"}  # on the stop message, not killed
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)


def test_a_killed_actor_ends_the_request_set_with_one_line(llms):
    two = _ray(llms)
    pg = two.ranks.launcher.pg.id.hex()
    os.kill(two.ranks.launcher.pids()[1], signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(DistributedError) as e:
        two.generate(QUESTIONS[:1], DecodeParams(chat_template=True, max_new_tokens=16))
    assert time.monotonic() - t0 < 60
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("tensor-parallel rank 1 died (its Ray actor: ") and "restart" in msg
    two.close()
    del llms["ray"]
    assert _groups()[pg] == "REMOVED"


@pytest.fixture
def four_threads_per_rank():
    """LLM gives each rank torch's threads / N: 8 threads -> bundles of 4 CPUs (the cluster has 4)."""
    old = torch.get_num_threads()
    torch.set_num_threads(8)
    yield
    torch.set_num_threads(old)


def test_a_group_a_joined_cluster_cannot_place_is_one_line_after_the_timeout(monkeypatch, four_threads_per_rank):
    ray_cluster()
    monkeypatch.setenv("SPECFOLD_RAY_PLACEMENT_TIMEOUT", "1")
    before = _groups()
    t0 = time.monotonic()
    with pytest.raises(DistributedError) as e:
        LLM("tiny", dtype="float64", tensor_parallel_size=2, distributed_executor_backend="ray")
    assert time.monotonic() - t0 < 30
    assert str(e.value) == ("distributed_executor_backend='ray' asks for 2 bundles of {4 CPU} (one per "
                            "tensor-parallel rank) and the cluster has 4 CPUs and 0 GPUs, and its placement group "
                            "was not placed within 1 s (SPECFOLD_RAY_PLACEMENT_TIMEOUT): see `ray status`")
    new = {k: v for k, v in _groups().items() if k not in before}
    assert len(new) == 1 and set(new.values()) == {"REMOVED"}  # the group was asked for, then removed


def test_a_group_too_large_for_a_cluster_started_here_is_one_line_at_once(monkeypatch, four_threads_per_rank):
    ray_cluster()
    from specfold.executor import ray_ranks
    monkeypatch.setattr(ray_ranks, "_started_here", [True])  # as if connect_ray had started this cluster
    monkeypatch.setenv("SPECFOLD_RAY_PLACEMENT_TIMEOUT", "60")
    before = _groups()
    t0 = time.monotonic()
    with pytest.raises(DistributedError) as e:
        LLM("tiny", dtype="float64", tensor_parallel_size=2, distributed_executor_backend="ray")
    assert time.monotonic() - t0 < 10
    assert str(e.value) == ("distributed_executor_backend='ray' asks for 2 bundles of {4 CPU} (one per "
                            "tensor-parallel rank) and the cluster has 4 CPUs and 0 GPUs: give a smaller "
                            "tensor_parallel_size, fewer threads, or RAY_ADDRESS of a larger cluster")
    assert _groups() == before  # nothing was asked of the cluster


def test_without_ray_the_backend_names_the_extra():
    code = ("import sys; sys.modules['ray'] = None\n"
            "from specfold import LLM\n"
            "try:\n"
            "    LLM('tiny', tensor_parallel_size=2, distributed_executor_backend='ray')\n"
            "except Exception as e:\n"
            "    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.stdout.strip() == ("MissingExtraError distributed_executor_backend='ray' needs the 'ray' extra "
                                  "(missing module 'ray'): pip install 'specfold[ray]'"), out.stderr
