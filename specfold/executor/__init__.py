"""Tensor/expert-parallel ranks: start them, connect them, load each one's shard, stop them.

    ranks = start_ranks(LoadArgs(...), size=2, expert_parallel=False, backend="mp")
    ranks.model, ranks.par, ranks.param_bytes      # rank 0's shard; every rank's parameter bytes
    ranks.close()

`mp` spawns ranks 1..N-1 as local processes (executor/local.py); `ray` places them as Ray actors in
one placement group (executor/ray_ranks.py). Rank 0 is always the calling process: the engine runs
there (engine/mirror.py), the other ranks replay its device work (executor/worker.py).
"""
from specfold.executor.ranks import LoadArgs, Ranks, start_ranks

__all__ = ["LoadArgs", "Ranks", "start_ranks"]
