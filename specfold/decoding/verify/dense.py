"""Dense verification: one batched forward of all branches against the shared prefix cache.

`verify_many` runs the verify forwards of one engine step as one packed model call
(`Transformer.forward_many`); `packs_with_model` lets the engine put them into the same call as the
step's prefill and commit forwards. It can return the per-layer hidden states (eager commits)."""
from __future__ import annotations

import torch

from specfold.models.forward import Forward, ForwardResult
from specfold.models.cache import PrefixCache
from specfold.models.transformer import Transformer


class DenseVerifier:
    name = "dense"
    returns_hidden = True
    packs_with_model = True

    def __init__(self, model: Transformer):
        self.model = model

    def __call__(self, tokens: torch.Tensor, parents: list[int], positions: torch.Tensor,
                 cache: PrefixCache | None, mask: torch.Tensor | None, out_idx: torch.Tensor,
                 return_hidden: bool = False):
        """tokens [B, W] (branch 0 = root), parents[b] = parent branch (-1 for the root) ->
        logits [B, len(out_idx), V] at window indices `out_idx` (and the hidden states when asked)."""
        return self.model(tokens, positions, cache=cache, mask=mask, logits_at=out_idx, return_hidden=return_hidden)

    def verify_many(self, forwards: list[Forward]) -> list[ForwardResult]:
        return self.model.forward_many(forwards)
