"""The Ray entry points without Ray, and their flag checks: one line on stderr, exit 2, nothing started.

`sys.modules['ray'] = None` makes `ray` look uninstalled to this process (find_spec answers None,
`import ray` fails), which is what a plain install without the `ray` extra sees.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parent.parent


def cli(args: list[str], hide_ray: bool = False) -> subprocess.CompletedProcess:
    code = ("import sys\n" + ("sys.modules['ray'] = None\n" if hide_ray else "")
            + "from specfold.cli import main\nsys.exit(main(sys.argv[1:]))")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def one_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stdout == "", (r.returncode, r.stderr[-2000:])
    return r.stderr


@pytest.mark.parametrize("args", [
    ["serve", "--model", "tiny", "--replicas", "2"],
    ["serve", "--model", "tiny", "--min-replicas", "1", "--max-replicas", "3"],
    ["eval", "--model", "tiny", "--ray", "--limit", "2"],
    ["bench", "--model", "tiny", "--methods", "vanilla", "--ray", "--replicas", "2", "--limit", "2"],
])
def test_missing_ray_extra_is_one_line(args, tmp_path):
    pytest.importorskip("fastapi")
    pytest.importorskip("sympy")
    if args[0] == "bench":
        args = args + ["--out", str(tmp_path / "b.jsonl")]
    err = one_line(cli(args, hide_ray=True))
    assert "needs the 'ray' extra" in err and "pip install 'specfold[ray]'" in err


@pytest.mark.parametrize("args, flag, where", [
    (["serve", "--model", "tiny", "--replicas", "2", "-tp", "2"], "--tensor-parallel-size 2", "Ray Serve replicas"),
    (["serve", "--model", "tiny", "--ray-address", "auto", "--enable-expert-parallel"], "--enable-expert-parallel",
     "Ray Serve replicas"),
    (["eval", "--model", "tiny", "--ray", "--tensor-parallel-size", "2", "--limit", "2"], "--tensor-parallel-size 2",
     "Ray Data actors"),
    (["bench", "--model", "tiny", "--methods", "vanilla", "--ray", "-tp", "2", "--limit", "2"],
     "--tensor-parallel-size 2", "Ray Data actors"),
])
def test_tensor_parallelism_on_ray_replicas_is_refused_in_one_line(args, flag, where):
    """A replica or actor loads the whole model as one rank: -tp there is refused, not ignored, and
    before the ray extra is even looked for (here it looks uninstalled)."""
    pytest.importorskip("fastapi")
    pytest.importorskip("sympy")
    err = one_line(cli(args, hide_ray=True))
    assert err.startswith(f"error: {flag} is not supported on {where}: each ") and "loads the whole model as one rank" in err


def test_python_api_without_ray_says_which_extra():
    code = ("import sys; sys.modules['ray'] = None\n"
            "from specfold.ray import SpecfoldLLMConfig, SpecfoldProcessorConfig, build_openai_app, build_processor\n"
            "for f, c in ((build_openai_app, SpecfoldLLMConfig()), (build_processor, SpecfoldProcessorConfig())):\n"
            "    try:\n        f(c)\n    except Exception as e:\n        print(type(e).__name__, e)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and len(lines) == 2, r.stderr[-2000:]
    assert all(line.startswith("MissingExtraError ") and "pip install 'specfold[ray]'" in line for line in lines)


@pytest.mark.parametrize("args, says", [
    (["serve", "--model", "tiny", "--replica-cpus", "1"], "--replica-cpus applies to Ray replicas"),
    (["serve", "--model", "tiny", "--replicas", "0"], "expected a positive integer"),
    (["serve", "--model", "tiny", "--replicas", "2", "--replica-cpus", "-1"], "expected a number > 0"),
    (["serve", "--model", "tiny", "--min-replicas", "3", "--max-replicas", "2"], "min_replicas=3 exceeds max_replicas=2"),
    (["serve", "--model", "tiny", "--replicas", "4", "--min-replicas", "1", "--max-replicas", "2"],
     "must lie in [min_replicas, max_replicas] = [1, 2]"),
    (["serve", "--model", "tiny", "--replicas", "2", "--replica-gpus", "1"], "set device 'cuda'"),
    (["serve", "--model", "/nonexistent/ckpt", "--replicas", "2"], "does not exist"),
    (["eval", "--model", "tiny", "--replicas", "2"], "--replicas applies to Ray actors: add --ray"),
])
def test_bad_ray_flags_are_one_line(args, says):
    pytest.importorskip("fastapi")
    pytest.importorskip("sympy")
    pytest.importorskip("ray")
    err = one_line(cli(args))
    assert says in err


def test_replicas_that_do_not_fit_the_local_cluster_are_one_line():
    """The command starts its own local cluster (no --ray-address), finds it too small, says so in one
    line of its own (Ray's start-up messages above it) and shuts the cluster down again."""
    pytest.importorskip("fastapi")
    pytest.importorskip("ray")
    r = cli(["serve", "--model", "tiny", "--replicas", "2", "--replica-cpus", "512", "--port", "8999"])
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stdout == "", r.stderr[-3000:]
    assert lines[-1].startswith("error: 2 replica(s) of 512 CPU and 0 GPU need 1024 CPUs (the cluster has "), lines
    assert not [x for x in lines if "Serve" in x], lines  # Serve was never started, nor stopped


def test_autoscaling_bounds_map_onto_serves_config():
    pytest.importorskip("ray")
    from ray.serve.config import AutoscalingConfig

    from specfold.ray import SpecfoldLLMConfig
    from specfold.ray.replica import EngineReplica
    config = SpecfoldLLMConfig(num_replicas=2, min_replicas=1, max_replicas=4, num_cpus=2, num_gpus=0,
                               engine_kwargs={"max_num_seqs": 8, "max_waiting": 4})
    opts = config.deployment_options()
    auto = AutoscalingConfig(**opts["autoscaling_config"])  # Serve's own validation of the mapping
    assert (auto.min_replicas, auto.max_replicas, auto.initial_replicas) == (1, 4, 2)
    assert "num_replicas" not in opts and opts["ray_actor_options"] == {"num_cpus": 2, "num_gpus": 0}
    d = EngineReplica.options(**opts)  # Serve accepts every option
    assert d.ray_actor_options["num_cpus"] == 2 and d.max_ongoing_requests > 8 + 4
    fixed = SpecfoldLLMConfig(num_replicas=3).deployment_options()
    assert fixed["num_replicas"] == 3 and "autoscaling_config" not in fixed
