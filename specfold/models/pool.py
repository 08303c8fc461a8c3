"""A pooled KV cache: one preallocated K/V tensor for every request of an engine (static shapes).

    pool = KVPool(model, slots=max_num_seqs, capacity=C)   # k, v: [L, slots + 1, Hkv, C, D]
    cache = pool.new_cache(need)          # a PrefixCache whose k/v are views of one free slot
    cache.release()                       # the slot is free again (Request.free does it)

Why: a captured CUDA graph replays fixed buffer addresses, so the K/V every forward of a step reads
and writes must live at addresses that do not depend on which requests run. A `SlotCache` is a
`PrefixCache` whose `k`/`v` are `pool.k[:, slot]` (strided views), so every existing reader and
writer (views, `write`, `truncate`, `write_kv`, the fold verifier) works unchanged, and the static
forward (models/static.py) gathers and scatters by slot id instead.

Invariants:
- the last slot (`pool.scratch`) belongs to no request: forwards that write nothing, and padding,
  write their K/V there;
- the pool starts zeroed and only finite K/V are ever written, so positions past a cache's length
  (masked in attention) are finite and contribute exactly 0 (a NaN there would leak through 0 * NaN);
- a slot cache never grows: asking for more than `capacity` positions raises (the engine refuses
  such a request when it is added, from the request's limit, never while it runs).
"""
from __future__ import annotations

import torch

from specfold.models.cache import PrefixCache


class SlotCache(PrefixCache):
    """The prefix cache of one pool slot (no allocation of its own)."""

    def __init__(self, pool: "KVPool", slot: int):
        self.pool, self.slot = pool, slot
        self.k, self.v = pool.k[:, slot], pool.v[:, slot]  # [L, Hkv, C, D] views
        self.length = 0
        self._pending = 0

    def _reserve(self, n: int) -> None:
        if self.length + n > self.capacity:
            raise RuntimeError(f"internal error: a pooled KV cache of {self.capacity} positions cannot hold "
                               f"{self.length + n} (the engine checks each request's need when it is added)")

    def grew(self, n: int) -> None:
        """The static forward wrote this cache's next `n` positions (the host advances its length)."""
        self._reserve(n)
        self.length += n

    def release(self) -> None:
        """Give the slot back to the pool (once; later calls do nothing)."""
        if self.pool is not None:
            self.pool.release(self.slot)
            self.pool = None


class KVPool:
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str, slots: int, capacity: int):
        shape = (num_layers, slots + 1, num_kv_heads, capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.capacity = capacity
        self.scratch = slots  # the slot of padding and of forwards that write nothing
        self._free = list(range(slots - 1, -1, -1))  # pop() hands out slot 0 first

    @classmethod
    def for_model(cls, model, slots: int, capacity: int) -> "KVPool":
        s = model.spec
        return cls(s.num_layers, s.num_kv_heads, s.head_dim, model.dtype, model.device, slots, capacity)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def new_cache(self, capacity: int) -> SlotCache:
        """A free slot as a prefix cache for a request that needs `capacity` positions."""
        if capacity > self.capacity:
            raise RuntimeError(f"internal error: a request needs {capacity} KV positions, the pool holds "
                               f"{self.capacity} per slot (the engine checks this when a request is added)")
        if not self._free:
            raise RuntimeError("internal error: no free KV slot (the scheduler admits at most max_num_seqs)")
        return SlotCache(self, self._free.pop())

    def release(self, slot: int) -> None:
        if slot in self._free or not 0 <= slot < self.scratch:
            raise RuntimeError(f"internal error: KV slot {slot} released twice or never handed out")
        self._free.append(slot)
