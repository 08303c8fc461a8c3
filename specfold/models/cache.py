"""Prefix KV cache: the K/V of the prompt and committed blocks, per layer, written once per block.

Invariants: `k[l, :, :length]` holds positions `[0, length)` of the sequence in order; views handed
to the forward pass (`view(l)`) are zero-copy slices shared by every branch of a verification batch;
only `write` (one window of one branch, per layer) then `commit_write` add positions, and `truncate`
drops them from the end (LinearSpec's rejected drafts).
"""
from __future__ import annotations

import torch


class PrefixCache:
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu", capacity: int = 256):
        self.k = torch.empty(num_layers, num_kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self.v = torch.empty_like(self.k)
        self.length = 0
        self._pending = 0  # length of the window being appended layer by layer

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def view(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of `layer` for the cached prefix: each [Hkv, P, D], zero-copy."""
        return self.k[layer, :, : self.length], self.v[layer, :, : self.length]

    def _reserve(self, n: int) -> None:
        need = self.length + n
        if need <= self.capacity:
            return
        cap = max(need, 2 * self.capacity)
        k = torch.empty(*self.k.shape[:2], cap, self.k.shape[3], dtype=self.k.dtype, device=self.k.device)
        v = torch.empty_like(k)
        k[:, :, : self.length] = self.k[:, :, : self.length]
        v[:, :, : self.length] = self.v[:, :, : self.length]
        self.k, self.v = k, v

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Stage window K/V ([Hkv, T, D]) of one layer; `commit_write` makes them part of the prefix."""
        t = k.shape[1]
        self._reserve(t)
        self.k[layer, :, self.length: self.length + t] = k
        self.v[layer, :, self.length: self.length + t] = v
        self._pending = t

    def commit_write(self) -> None:
        self.length += self._pending
        self._pending = 0

    def truncate(self, length: int) -> None:
        if length > self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {length}")
        self.length = length
