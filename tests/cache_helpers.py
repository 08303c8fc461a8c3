"""Test helpers around the paged KV cache."""
from __future__ import annotations

import contextlib

from specfold.models.cache import PrefixCache


@contextlib.contextmanager
def released_caches():
    """Record (length, K, V) of every request cache when the engine releases it (a finished request's
    blocks go back to the pool, so its K/V are read just before)."""
    seen: list[tuple] = []
    release = PrefixCache.release

    def spy(self):
        if self.length:
            seen.append((self.length, self.k.clone(), self.v.clone()))
        release(self)

    PrefixCache.release = spy
    try:
        yield seen
    finally:
        PrefixCache.release = release
