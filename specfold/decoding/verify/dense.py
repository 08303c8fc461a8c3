"""Dense verification: one batched forward of all branches against the shared prefix cache."""
from __future__ import annotations

import torch

from specfold.models.cache import PrefixCache
from specfold.models.transformer import Transformer


class DenseVerifier:
    name = "dense"

    def __init__(self, model: Transformer):
        self.model = model
        self.stats: dict = {}

    def __call__(self, tokens: torch.Tensor, parents: list[int], positions: torch.Tensor,
                 cache: PrefixCache | None, mask: torch.Tensor | None, out_idx: torch.Tensor) -> torch.Tensor:
        """tokens [B, W] (branch 0 = root), parents[b] = parent branch (-1 for the root) ->
        logits [B, len(out_idx), V] at window indices `out_idx`."""
        return self.model(tokens, positions, cache=cache, mask=mask, logits_at=out_idx)
