"""The Ray flags of `specfold serve` (Serve replicas) and `specfold eval/bench` (`--ray`: Ray Data).

Invariants:
- Registering the flags imports nothing of Ray; a command that takes the Ray path checks the `ray`
  extra first (one line, exit 2, when it is missing), then validates every setting and the
  checkpoint on the driver before a cluster is started or joined.
- `specfold serve` without any of --replicas, --min-replicas, --max-replicas, --ray-address is the
  single-process server; --replica-cpus/--replica-gpus without them are an error, not ignored.
- A replica (Serve) or actor (Ray Data) is one engine on one rank: `-tp N` > 1 and
  `--enable-expert-parallel` are refused on those paths (one line), never ignored.
- The command owns what it creates: on exit (Ctrl-C, SIGTERM: cli.py's handlers unwind it) it
  deletes its Serve application, and shuts Serve and Ray down only if it started the cluster itself.
- `extend(command, parser)` is the one hook: cli.py calls it after `serve`, `eval` and `bench`
  registered their parsers; those rooms never import this one.
"""
from __future__ import annotations

import argparse
import sys
import time

from specfold.errors import ParamsError, SpecfoldError
from specfold.extras import require

APP_NAME = "specfold"


def _number(text: str, positive: bool) -> float:
    what = "a number > 0" if positive else "a number >= 0"
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not 0 <= v < float("inf") or (positive and v == 0):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return v


def _nonnegative_float(text: str) -> float:
    return _number(text, positive=False)


def _positive_float(text: str) -> float:
    return _number(text, positive=True)


def _resource_args(g) -> None:
    g.add_argument("--replica-cpus", type=_positive_float, default=None,
                   help="CPUs Ray reserves per replica; also its torch threads (default 1)")
    g.add_argument("--replica-gpus", type=_nonnegative_float, default=None,
                   help="GPUs per replica (e.g. 1 with --device cuda: one replica per GPU)")
    g.add_argument("--ray-address", default=None,
                   help="join this Ray cluster ('auto', 'HOST:6379', 'ray://HOST:10001'); default: start a local one")


def add_serve_args(p: argparse.ArgumentParser) -> None:
    from specfold.args import nonnegative_int, positive_int
    g = p.add_argument_group("ray serve (needs the 'ray' extra)")
    g.add_argument("--replicas", type=positive_int, default=None,
                   help="engine replicas as a Ray Serve deployment (default: one engine in this process, no Ray)")
    g.add_argument("--min-replicas", type=nonnegative_int, default=None, help="autoscaling lower bound")
    g.add_argument("--max-replicas", type=positive_int, default=None, help="autoscaling upper bound")
    _resource_args(g)


def add_batch_args(p: argparse.ArgumentParser) -> None:
    from specfold.args import positive_int
    g = p.add_argument_group("ray data (needs the 'ray' extra)")
    g.add_argument("--ray", action="store_true", help="decode on Ray Data actors, one engine per actor")
    g.add_argument("--replicas", type=positive_int, default=None, help="with --ray: engine actors (default 1)")
    g.add_argument("--ray-batch-size", type=positive_int, default=None,
                   help="with --ray: prompts per actor call (default: spread over the actors)")
    _resource_args(g)


def extend(command: str, p: argparse.ArgumentParser) -> None:
    """Add the Ray flags to `specfold serve|eval|bench` and route its Ray runs here."""
    if command == "serve":
        add_serve_args(p)
        local = p.get_default("func")
        p.set_defaults(func=lambda a: cmd_serve(a) if wants_serve(a) else local(a))
        return
    add_batch_args(p)
    local = p.get_default("engines")  # run_bench's (llm, generate) in this process
    p.set_defaults(engines=lambda a: batch_backend(a, f"specfold {command}") if wants_batch(a) else local(a))


def wants_serve(a: argparse.Namespace) -> bool:
    """Whether `specfold serve` runs on Ray; refuses Ray-only flags given without a Ray path."""
    ray_mode = any(getattr(a, k) is not None for k in ("replicas", "min_replicas", "max_replicas", "ray_address"))
    if not ray_mode:
        _no_resources(a, "--replicas N (or --min-replicas/--max-replicas, --ray-address)")
    else:
        _one_rank(a, "Ray Serve replicas", "replica", "--replicas, --min-replicas, --max-replicas and --ray-address")
    return ray_mode


def wants_batch(a: argparse.Namespace) -> bool:
    """Whether `specfold eval/bench` runs on Ray Data; refuses Ray-only flags without --ray."""
    if not a.ray:
        extra = [f for f, v in (("--replicas", a.replicas), ("--ray-address", a.ray_address),
                                ("--ray-batch-size", a.ray_batch_size)) if v is not None]
        if extra:
            raise ParamsError(f"{extra[0]} applies to Ray actors: add --ray")
        _no_resources(a, "--ray")
    else:
        _one_rank(a, "Ray Data actors", "actor", "--ray")
    return a.ray


def _one_rank(a: argparse.Namespace, where: str, each: str, flags: str) -> None:
    """Refuse tensor parallelism on a Ray path: each replica or actor loads the whole model as one rank."""
    size = getattr(a, "tensor_parallel_size", 1)
    if size > 1 or getattr(a, "enable_expert_parallel", False):
        flag = f"--tensor-parallel-size {size}" if size > 1 else "--enable-expert-parallel"
        raise ParamsError(f"{flag} is not supported on {where}: each {each} loads the whole model as one rank; "
                          f"drop {flags} to split one engine over ranks (--distributed-executor-backend ray "
                          f"places them on a Ray cluster)")


def _no_resources(a: argparse.Namespace, what: str) -> None:
    for flag, v in (("--replica-cpus", a.replica_cpus), ("--replica-gpus", a.replica_gpus)):
        if v is not None:
            raise ParamsError(f"{flag} applies to Ray replicas: give {what}")


def _engine_spec_kwargs(a: argparse.Namespace) -> dict:
    from specfold.args import overrides_from_args
    overrides = overrides_from_args(a) or None
    return {"model_source": str(a.model), "torch_threads": a.threads,
            "llm_kwargs": {"dtype": a.dtype, "device": a.device, "overrides": overrides},
            "num_cpus": a.replica_cpus or 1.0, "num_gpus": a.replica_gpus or 0.0}


# ---------------------------------------------------------------------------------- serve
def serve_config(a: argparse.Namespace):
    """The SpecfoldLLMConfig of `specfold serve`'s flags."""
    from specfold.args import engine_config_from_args
    from specfold.ray.config import SpecfoldLLMConfig
    from specfold.serve import api_key
    engine = engine_config_from_args(a)
    return SpecfoldLLMConfig(**_engine_spec_kwargs(a), engine_config=engine,
                             model_id=a.served_model_name or str(a.model), num_replicas=a.replicas,
                             min_replicas=a.min_replicas, max_replicas=a.max_replicas,
                             max_tokens=a.max_new_tokens, temperature=a.temperature,
                             server_kwargs={"api_key": api_key(a), "max_body_bytes": a.max_body_bytes})


def cmd_serve(a: argparse.Namespace) -> int:
    """`specfold serve --replicas N ...`: the OpenAI app over N engine replicas on Ray Serve."""
    require("serve", "specfold serve")
    require("ray", "specfold serve --replicas")
    if not 1 <= a.port <= 65535:
        raise SpecfoldError(f"--port {a.port} is not a TCP port Ray Serve can listen on; accepted: 1-65535")
    from specfold.ray.cluster import check_fits, connect, direct_ingress
    from specfold.ray.config import model_info
    config = serve_config(a)
    model_info(config.model_source, config.llm_kwargs["overrides"])  # a bad checkpoint: one line, now
    started = connect(a.ray_address, ingress_port=a.port)
    try:
        check_fits(config.bounds[0] or 1, config.num_cpus, config.num_gpus, strict=started)
        _deploy(config, a, direct=started and direct_ingress())
        print(f"specfold: serving {config.name!r} on http://{a.host}:{a.port}/v1 with {config.initial_replicas} "
              f"replica(s) on Ray Serve (Ctrl-C stops)", file=sys.stderr, flush=True)
        while True:
            time.sleep(3600)
    finally:
        _teardown(started)


def _deploy(config, a: argparse.Namespace, direct: bool = False) -> None:
    """Start Serve and run the app; `direct`: the ingress replica listens on --port itself
    (cluster.py: direct ingress), and Serve's proxy, which must exist, on a free port."""
    import logging
    import socket

    from ray import serve

    from specfold.ray.ingress import build_openai_app
    level = a.log_level.upper()
    logging.getLogger("ray.serve").setLevel(level)  # this process's Serve client messages
    port = a.port
    if direct:
        with socket.socket() as s:
            s.bind((a.host, 0))
            port = s.getsockname()[1]
    serve.start(http_options={"host": a.host, "port": port}, logging_config={"log_level": level})
    try:
        serve.run(build_openai_app(config), name=APP_NAME, route_prefix="/", logging_config={"log_level": level})
    except RuntimeError as e:  # a replica failed to start (its error is in the replica's log)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SpecfoldError(f"the Ray Serve application did not start: {first}") from None


def _teardown(started: bool) -> None:
    import ray
    from ray import serve
    from ray.serve.exceptions import RayServeException
    try:
        try:
            serve.delete(APP_NAME)
        except RayServeException:  # no Serve on the cluster: refused before anything was deployed
            return
        if started:
            serve.shutdown()
    finally:
        if started:
            ray.shutdown()


# ---------------------------------------------------------------------------------- eval / bench
def batch_backend(a: argparse.Namespace, command: str):
    """(model info, generate) for run_bench: `generate(jobs, warmup)` yields outputs in job order."""
    require("ray", f"{command} --ray")
    from specfold.ray.cluster import check_fits, connect
    from specfold.ray.config import EngineSpec, model_info
    from specfold.ray.data import ordered_outputs
    spec = EngineSpec(**_engine_spec_kwargs(a))
    info = model_info(spec.model_source, spec.llm_kwargs["overrides"])
    replicas = a.replicas or 1
    started = connect(a.ray_address)
    check_fits(replicas, spec.num_cpus, spec.num_gpus, strict=started)

    def generate(jobs, warmup: int):
        return ordered_outputs(spec, jobs, replicas, warmup, a.ray_batch_size)
    return info, generate
