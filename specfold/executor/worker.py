"""A rank other than 0: connect, load this rank's shard, replay rank 0's device work until told to stop.

The same function runs in a spawned process (`mp`) and in a Ray actor (`ray`). It never prints:
what goes wrong is written to the rendezvous store (`ready/R` while loading, `error/R` after), where
rank 0 reads it into its one-line error. SIGINT is ignored: Ctrl-C reaches rank 0, which stops the
others (and a rank whose rank 0 is gone gets an error from its socket and ends).
"""
from __future__ import annotations

import json
import signal
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LoadArgs:
    path: str
    dtype: torch.dtype
    device: str  # "cpu", or "cuda" (rank r on GPU r)
    overrides: dict | None = None
    vocab: dict | None = None
    threads: int = 1  # torch threads per rank on the CPU


def device_of(args: LoadArgs, gpu: int) -> torch.device:
    """The rank's device: on CUDA, GPU `gpu` (rank r on GPU r under `mp`; under `ray` the GPU Ray gave it)."""
    return torch.device(f"cuda:{gpu}") if args.device == "cuda" else torch.device("cpu")


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def run_rank(rank: int, size: int, addr: str, port: int, gpu: int | None = None) -> None:
    """Rank `rank` of `size`: its load arguments come from the store rank 0 hosts at addr:port. On CUDA
    it runs on GPU `gpu` (default: GPU `rank`; a Ray actor sees only its own GPU, 0)."""
    import pickle
    from specfold.executor.follower import Follower
    from specfold.executor.groups import Channel, connect, store
    from specfold.models.loader import load_model
    from specfold.models.parallel import Parallel, parameter_bytes
    if signal.getsignal(signal.SIGINT) is not None:
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        except ValueError:  # not the main thread (a Ray actor may run it in another thread)
            pass
    st = store(addr, port, size, False)
    args, expert_parallel = pickle.loads(st.get("args"))
    torch.set_num_threads(max(1, args.threads))
    st.set(f"up/{rank}", "1")
    try:
        dev = device_of(args, rank if gpu is None else gpu)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        compute, control = connect(st, rank, size, dev)
        par = Parallel(rank, size, expert_parallel, compute)
        model, spec, _ = load_model(args.path, args.dtype, dev, args.overrides, args.vocab, par)
        st.set(f"ready/{rank}", json.dumps({"bytes": parameter_bytes(model)}))
    except BaseException as e:  # noqa: BLE001 (reported to rank 0, which raises it as one line)
        st.set(f"ready/{rank}", json.dumps({"error": one_line(e)}))
        return
    try:
        Follower(model, spec).serve(Channel(control))
    except BaseException as e:  # noqa: BLE001
        try:
            st.set(f"error/{rank}", one_line(e))
        except BaseException:  # noqa: BLE001 (rank 0 and its store are gone: nothing to tell)
            pass


if __name__ == "__main__":  # python -m specfold.executor.worker ADDR PORT RANK SIZE (executor/local.py)
    import sys
    a = sys.argv[1:]
    run_rank(int(a[2]), int(a[3]), a[0], int(a[1]))
