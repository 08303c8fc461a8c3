"""The score store: exact block state -> the scores a verification read for it (SPEC §5). Host only.

A key is (block start, every token from the stored batch's window start `origin` through the block):
the exact state the scores belong to. Only the newest verification batch is kept (`clear` before
filling), so memory is bounded by one batch. Keys are tuples of ints and entries plain host values:
nothing here holds a tensor.
"""
from __future__ import annotations

from dataclasses import dataclass

from specfold.decoding.rules import Scored

Key = tuple[int, tuple[int, ...]]


@dataclass(slots=True)
class Entry:
    scored: Scored  # the rule region's candidates (block-relative positions), at the request's temperature
    node: int  # draft node that produced the state (-1 = the root)
    ahead: Scored | None = None  # the region the rule reads next (T = 0): draft material


class ScoreStore:
    def __init__(self, origin: int = 0):
        self.origin = origin  # window start of the stored batch
        self._d: dict[Key, Entry] = {}

    def __len__(self) -> int:
        return len(self._d)

    def clear(self, origin: int) -> None:
        self._d.clear()
        self.origin = origin

    def key(self, start: int, state: list[int], seq: list[int] | None = None) -> Key:
        """Key of a block state at `start`; `seq` holds the committed tokens by absolute position
        (needed once blocks were committed since the stored batch's window start)."""
        if start == self.origin or seq is None:
            return start, tuple(state)
        return start, tuple(seq[self.origin: start]) + tuple(state)

    def get(self, key: Key) -> Entry | None:
        return self._d.get(key)

    def put(self, key: Key, entry: Entry) -> None:
        """First writer wins (a duplicate branch state carries the same scores)."""
        self._d.setdefault(key, entry)
