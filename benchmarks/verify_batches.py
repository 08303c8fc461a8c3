"""Verification batches exactly as the decode loop produces them (root + drafts), recorded for replay.

`record(llm, prompts, params, limit)` runs the loop with a recording wrapper around its verifier and
returns a list of `Batch`es: the branch tokens, parents, window positions, mask, the logits indices,
and a private copy of the prefix cache as it was at that call (the loop's cache grows afterwards).
Benchmarks replay them through DenseVerifier and FoldVerifier side by side.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specfold.models.cache import PrefixCache


@dataclass
class Batch:
    tokens: torch.Tensor
    parents: list[int]
    positions: torch.Tensor
    cache: PrefixCache | None
    mask: torch.Tensor | None
    out_idx: torch.Tensor

    def args(self) -> tuple:
        return self.tokens, self.parents, self.positions, self.cache, self.mask, self.out_idx


def _copy_cache(c: PrefixCache | None) -> PrefixCache | None:
    if c is None:
        return None
    from specfold.models.pool import BlockPool
    k, v = c.k, c.v  # [L, Hkv, length, D], gathered
    L, hkv, n, D = k.shape
    new = BlockPool(L, hkv, D, k.dtype, k.device, -(-max(n, 1) // 16) + 1, 16, growable=True).new_cache()
    for li in range(L):
        new.write(li, k[li], v[li])
    new.commit_write()
    return new


class _Recorder:
    def __init__(self, inner, out: list[Batch], limit: int):
        self.inner, self.out, self.limit = inner, out, limit

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _keep(self, tokens, parents, positions, cache, mask, out_idx) -> None:
        if len(self.out) < self.limit:
            self.out.append(Batch(tokens.clone(), list(parents), positions.clone(), _copy_cache(cache),
                                  None if mask is None else mask.clone(), out_idx.clone()))

    def __call__(self, tokens, parents, positions, cache, mask, out_idx, **kw):
        self._keep(tokens, parents, positions, cache, mask, out_idx)
        return self.inner(tokens, parents, positions, cache, mask, out_idx, **kw)

    def verify_many(self, forwards):
        """The engine's entry point (one step's verification forwards): each kept as a batch."""
        for f in forwards:
            at = f.logits_at if f.logits_at is not None else torch.arange(f.tokens.shape[1])
            self._keep(f.tokens, f.parents or [-1], f.positions, f.cache, f.mask, at)
        return self.inner.verify_many(forwards)


def record(llm, prompts: list, params, limit: int = 10_000) -> list[Batch]:
    """Verification batches of `llm.generate(prompts, params)` (at most `limit`), in call order."""
    dec = llm.decoder(params)
    out: list[Batch] = []
    dec.verifier = _Recorder(dec.verifier, out, limit)
    for pr in prompts:
        dec.run(llm.encode(pr, params))
        if len(out) >= limit:
            break
    return out
