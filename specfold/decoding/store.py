"""The logits store: exact block state -> the logits a verification computed for it (SPEC §5).

A key is (block start, every token from the stored batch's window start `origin` through the block):
the exact state the logits belong to. Only the newest verification batch is kept (`clear` before
filling), so memory is bounded by one batch. Keys are tuples of ints (host), never device buffers.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

Key = tuple[int, tuple[int, ...]]


@dataclass(slots=True)
class StoredLogits:
    positions: torch.Tensor  # [C] candidate window indices of the block
    logits: torch.Tensor  # [C, V] at those positions
    node: int  # draft node that produced the state (-1 = the root)
    ahead_positions: torch.Tensor | None = None  # eager: later blocks' candidates (block-relative)
    ahead_logits: torch.Tensor | None = None


class LogitsStore:
    def __init__(self, origin: int = 0):
        self.origin = origin  # window start of the stored batch
        self._d: dict[Key, StoredLogits] = {}

    def __len__(self) -> int:
        return len(self._d)

    def clear(self, origin: int) -> None:
        self._d.clear()
        self.origin = origin

    def key(self, start: int, state: torch.Tensor, seq: torch.Tensor | None = None) -> Key:
        """Key of a block state at `start`; `seq` holds the committed tokens by absolute position
        (needed once blocks were committed since the stored batch's window start)."""
        if start == self.origin or seq is None:
            return start, tuple(state.tolist())
        return start, tuple(seq[self.origin: start].tolist()) + tuple(state.tolist())

    def get(self, key: Key) -> StoredLogits | None:
        return self._d.get(key)

    def put(self, key: Key, entry: StoredLogits) -> None:
        """First writer wins (a duplicate branch state carries the same logits)."""
        self._d.setdefault(key, entry)
