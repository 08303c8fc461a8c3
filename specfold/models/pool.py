"""The paged KV pool: the K/V of every request of an engine, in fixed-size blocks of one tensor.

    pool = BlockPool.for_model(model, num_blocks, block_size)  # k, v: [L, Hkv, num_blocks * bs, D]
    cache = pool.new_cache()          # a request's PrefixCache (models/cache.py): a block table
    pool.take(n) / pool.drop(blocks)  # the allocator (caches call them)

A block is `block_size` consecutive slots of every layer, so the K/V of positions `[0, P)` of a
request are one `index_select` over its slots, and a write one `index_copy_`. Block tables are
host lists; each cache keeps its slots on the device too, so a gather needs no host copy.

Prefix caching: a full block whose K/V are final can be registered under a key (a hash of every
token its K/V depend on, salted with what else changes them: engine/prefix.py makes the keys).
Another request whose prefix has the same keys takes those blocks read-only (`share`), each with a
reference count. A cached block nobody references stays cached and counts as free: `take` hands out
never-cached blocks first, then evicts cached ones least recently used.

Invariants:
- block 0 is scratch: zeroed, never handed out; padding reads and writes it (static shapes);
- every slot a forward reads holds finite K/V (written ones, or the scratch block), so masked keys
  contribute exactly 0; storage is otherwise left uninitialised;
- a referenced block is never evicted, and a shared block is never written (its cache's `shared`
  leading blocks are read-only).
"""
from __future__ import annotations

from collections import OrderedDict, deque

import torch

from specfold.models.cache import PrefixCache


class BlockPool:
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str, num_blocks: int, block_size: int, growable: bool = False):
        if num_blocks < 2:
            raise ValueError(f"a KV pool needs at least 2 blocks (one is scratch), got {num_blocks}")
        shape = (num_layers, num_kv_heads, num_blocks * block_size, head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty_like(self.k)
        self.k[:, :, :block_size].zero_()
        self.v[:, :, :block_size].zero_()
        self.device = self.k.device
        self.num_blocks, self.block_size = num_blocks, block_size
        self.block_bytes = 2 * num_layers * num_kv_heads * head_dim * block_size * self.k.element_size()
        self.offsets = torch.arange(block_size, device=self.device)
        self.refs = [0] * num_blocks
        self._free = deque(range(1, num_blocks))  # never cached (or evicted) and unreferenced
        self._cached: dict[bytes, int] = {}  # key -> block
        self._key: dict[int, bytes] = {}  # block -> key
        self._idle: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced: oldest first
        self.peak = 0  # most blocks referenced at once
        self.growable = growable  # a private pool (Transformer.new_cache) grows instead of running short

    @classmethod
    def for_model(cls, model, num_blocks: int, block_size: int, growable: bool = False) -> "BlockPool":
        s = model.spec
        return cls(s.num_layers, s.num_kv_heads, s.head_dim, model.dtype, model.device, num_blocks, block_size,
                   growable)

    def new_cache(self, capacity: int | None = None) -> PrefixCache:
        """An empty cache (`capacity` is a hint the paged pool does not need)."""
        return PrefixCache(self)

    @property
    def usable(self) -> int:
        return self.num_blocks - 1

    @property
    def free_blocks(self) -> int:
        """Blocks a request could take now (never-cached ones and cached ones nobody references)."""
        return len(self._free) + len(self._idle)

    @property
    def used_blocks(self) -> int:
        return self.usable - self.free_blocks

    def take(self, n: int) -> list[int] | None:
        """`n` blocks, each with one reference (None, nothing taken, when fewer are free)."""
        if n > self.free_blocks and self.growable:
            self._grow(max(n - self.free_blocks, self.num_blocks))
        if n > self.free_blocks:
            return None
        out = []
        for _ in range(n):
            if self._free:
                b = self._free.popleft()
            else:
                b, _ = self._idle.popitem(last=False)  # least recently used cached block
                del self._cached[self._key.pop(b)]
            self.refs[b] = 1
            out.append(b)
        self.peak = max(self.peak, self.used_blocks)
        return out

    def _grow(self, n: int) -> None:
        """`n` more blocks (flat slots of the old blocks keep their meaning: blocks are appended)."""
        L, hkv, S, D = self.k.shape
        for name in ("k", "v"):
            new = torch.empty(L, hkv, S + n * self.block_size, D, dtype=self.k.dtype, device=self.device)
            new[:, :, :S] = getattr(self, name)
            setattr(self, name, new)
        self._free.extend(range(self.num_blocks, self.num_blocks + n))
        self.refs += [0] * n
        self.num_blocks += n

    def drop(self, blocks: list[int]) -> None:
        """One reference less on each block; an unreferenced block is free (cached ones stay cached)."""
        for b in blocks:
            if self.refs[b] <= 0:
                raise RuntimeError(f"internal error: KV block {b} released more often than taken")
            self.refs[b] -= 1
            if self.refs[b] == 0:
                if b in self._key:
                    self._idle[b] = None
                else:
                    self._free.append(b)

    # ------------------------------------------------------------------ prefix caching
    def register(self, block: int, key: bytes) -> None:
        """`block` (full, final, referenced) holds the K/V `key` names; a key already cached keeps
        its first block."""
        if key not in self._cached and block not in self._key:
            self._cached[key], self._key[block] = block, key

    def lookup(self, key: bytes) -> int | None:
        return self._cached.get(key)

    def share(self, block: int) -> None:
        """One more reference on a cached block (a prefix-cache hit)."""
        if self.refs[block] == 0:
            self._idle.pop(block)
        self.refs[block] += 1
        self.peak = max(self.peak, self.used_blocks)

    @property
    def cached_blocks(self) -> int:
        return len(self._cached)
