"""Ranks 1..N-1 of a tensor-parallel group: replay rank 0's device work on this rank's shard
(engine/mirror.py says what crosses and why). A `Follower` holds the model shard, one runner per
engine of rank 0, and the caches and hidden states rank 0's jobs refer to: no request, program or
scheduler.
"""
from __future__ import annotations

import dataclasses
import os

import torch

from specfold.decoding.jobs import HiddenRows
from specfold.engine.engine import build_program
from specfold.engine.graphs import static_runner
from specfold.engine.mirror import CacheRef, HiddenRef
from specfold.engine.runner import ModelRunner
from specfold.models.pool import BlockPool


class Follower:
    """A rank's replay loop: its shard of the model, one runner per engine of rank 0, the caches and
    hidden states rank 0's jobs refer to. No request, program or scheduler."""

    def __init__(self, model, spec):
        self.model, self.spec = model, spec
        self.check = os.environ.get("SPECFOLD_TP_CHECK") == "1"
        self.channel = None
        self.runners: dict[int, object] = {}
        self.pools: dict[int, object] = {}
        self.caches: dict[int, object] = {}
        self.hidden: dict[tuple[int, int], list] = {}

    def serve(self, channel) -> None:
        """Replay messages until rank 0 says stop (or the channel breaks: the caller's concern)."""
        self.channel = channel
        with torch.inference_mode():
            while True:
                msg = channel.recv()
                if msg[0] == "stop":
                    return
                self.handle(*msg)

    def handle(self, kind: str, key: int, n: int, drops: list, *payload) -> None:
        for what, ref in drops:
            {"cache": self.caches, "hidden": self.hidden, "engine": self.runners}[what].pop(ref, None)
            if what == "engine":
                self.pools.pop(ref, None)
        if kind == "engine":
            self._engine(key, *payload)
        elif kind == "run":
            wire, = payload
            runner = self.runners[key]
            jobs = [dataclasses.replace(j, cache=self._cache(j.cache), hidden=self._hidden(j.hidden)) for j in wire]
            results = runner.run(jobs)
            if self.check:
                self.channel.digests([r.stats for r in results])
            for i, r in enumerate(results):
                if r.hidden is not None:
                    self.hidden[(n, i)] = r.hidden
        else:
            raise RuntimeError(f"internal error: unknown tensor-parallel message {kind!r}")

    def _engine(self, key: int, config, num_blocks: int | None) -> None:
        program = build_program(self.model, self.spec, config)
        pool = None if num_blocks is None else BlockPool.for_model(self.model, num_blocks, config.kv_block_size)
        static = static_runner(self.model, config, pool)
        runner = ModelRunner(self.model, program.verifier, self.spec.mask_token_id, static)
        runner.reads = False  # rank 0 reads
        self.runners[key], self.pools[key] = runner, pool

    def _cache(self, ref: CacheRef | None):
        if ref is None:
            return None
        c = self.caches.get(ref.id)
        if c is None:
            pool = self.pools[ref.pool] if ref.pool is not None else None
            c = pool.new_cache() if pool is not None else self.model.new_cache(ref.capacity)
            self.caches[ref.id] = c
        if tuple(c.blocks) != ref.blocks:  # rank 0's table (its allocator took the blocks: copy, never take)
            keep = 0
            while keep < min(len(c.blocks), len(ref.blocks)) and c.blocks[keep] == ref.blocks[keep]:
                keep += 1
            del c.blocks[keep:]
            c._append(list(ref.blocks[keep:]))
        c.length = ref.length
        return c

    def _hidden(self, ref: HiddenRef | None) -> HiddenRows | None:
        return None if ref is None else HiddenRows(self.hidden[ref.ref], ref.branch, ref.start, ref.stop)

