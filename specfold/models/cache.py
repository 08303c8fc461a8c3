"""A request's prefix KV cache: positions `[0, length)` of its K/V, in blocks of one shared pool.

    cache = pool.new_cache()          # models/pool.py; Transformer.new_cache(n) makes a private pool
    cache.reserve(t)                  # take the blocks `t` more positions need (False: the pool is short)
    cache.write(layer, k, v)          # [Hkv, t, D] per layer, then commit_write(): length += t
    pk, pv = cache.view(layer)        # [Hkv, length, D]: gathered from the blocks (a copy)
    cache.truncate(n)                 # drop positions from the end (LinearSpec), freeing whole blocks
    cache.release()                   # every block back to the pool (finish, abort, preemption)

Invariants:
- `blocks[i]` holds positions `[i*bs, (i+1)*bs)` (bs = the pool's block size); a cache holds exactly
  the blocks its `length` (plus a reserved window being written) needs, never more;
- `slots[p]` (device) is position p's flat slot in the pool's `[L, Hkv, S, D]` tensors
  (`blocks[p // bs] * bs + p % bs`), written once per new block on the device (no host copy);
- `tokens[p]` (host) is the token whose K/V sit at position p (prefix-cache keys, models/pool.py);
- the first `shared` blocks came from the pool's prefix cache: read-only, never written or truncated.
"""
from __future__ import annotations

import torch


class PrefixCache:
    def __init__(self, pool):
        self.pool = pool
        self.blocks: list[int] = []
        self.length = 0
        self._pending = 0  # length of the window being appended layer by layer
        self.slots = torch.empty(0, dtype=torch.long, device=pool.device)
        self.tokens: list[int] = []
        self.shared = 0  # leading blocks taken from the prefix cache
        self.keyed = 0  # leading blocks registered in the pool's prefix cache (engine/kv.py)
        self.chain: list[bytes] = []  # prefix-cache chain hashes of the leading full blocks (engine/prefix.py)
        self.expected: set = set()  # prefix-cache keys of its context its prefill will register (engine/kv.py)

    @property
    def capacity(self) -> int:
        return len(self.blocks) * self.pool.block_size

    @property
    def nbytes(self) -> int:
        return len(self.blocks) * self.pool.block_bytes

    @property
    def k(self) -> torch.Tensor:
        """Every layer's K of the cached prefix, [L, Hkv, length, D] (a gathered copy: tests, tools)."""
        return self.pool.k.index_select(2, self.slots[: self.length])

    @property
    def v(self) -> torch.Tensor:
        return self.pool.v.index_select(2, self.slots[: self.length])

    def view(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of `layer` for the cached prefix: each [Hkv, P, D] (gathered from the blocks)."""
        idx = self.slots[: self.length]
        return self.pool.k[layer].index_select(1, idx), self.pool.v[layer].index_select(1, idx)

    def blocks_for(self, n: int) -> int:
        """Blocks the pool must hand out before `n` more positions fit."""
        bs = self.pool.block_size
        return max(0, -(-(self.length + n) // bs) - len(self.blocks))

    def reserve(self, n: int) -> bool:
        """Take the blocks `n` more positions need; False (nothing taken) when the pool is short."""
        k = self.blocks_for(n)
        if not k:
            return True
        new = self.pool.take(k)
        if new is None:
            return False
        self._append(new)
        return True

    def _append(self, new: list[int]) -> None:
        bs, i0 = self.pool.block_size, len(self.blocks)
        need = (i0 + len(new)) * bs
        if need > self.slots.numel():
            slots = torch.empty(max(need, 2 * self.slots.numel()), dtype=torch.long, device=self.slots.device)
            slots[: i0 * bs] = self.slots[: i0 * bs]
            self.slots = slots
        for i, b in enumerate(new):
            torch.add(self.pool.offsets, b * bs, out=self.slots[(i0 + i) * bs: (i0 + i + 1) * bs])
        self.blocks += new

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Stage window K/V ([Hkv, T, D]) of one layer; `commit_write` makes them part of the prefix."""
        t = k.shape[1]
        if not self.reserve(t):
            raise RuntimeError(f"internal error: the KV pool has no free block for a write of {t} positions "
                               f"(the engine reserves every write's blocks before the step runs)")
        idx = self.slots[self.length: self.length + t]
        self.pool.k[layer].index_copy_(1, idx, k)
        self.pool.v[layer].index_copy_(1, idx, v)
        self._pending = t

    def commit_write(self) -> None:
        self.length += self._pending
        self._pending = 0

    def grew(self, n: int) -> None:
        """The static forward wrote this cache's next `n` positions (the host advances its length)."""
        if self.length + n > self.capacity:
            raise RuntimeError("internal error: a static write past the cache's reserved blocks")
        self.length += n

    def truncate(self, length: int) -> None:
        if length > self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {length}")
        keep = -(-length // self.pool.block_size)
        if keep < self.shared:
            raise RuntimeError("internal error: truncating into blocks shared through the prefix cache")
        self.length = length
        del self.tokens[length:]
        self.keyed = min(self.keyed, length // self.pool.block_size)
        del self.chain[length // self.pool.block_size:]
        self.pool.drop(self.blocks[keep:])
        del self.blocks[keep:]

    def release(self) -> None:
        """Every block back to the pool (once; later calls do nothing)."""
        self.pool.drop(self.blocks)
        self.blocks, self.length, self.tokens, self.shared, self.keyed, self.chain = [], 0, [], 0, 0, []
        self.expected = set()
