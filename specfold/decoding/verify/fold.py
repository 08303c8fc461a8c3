"""Folded verification (SpecFold, SPEC §6): the verifier that replaces the dense batched forward.

Same call signature as DenseVerifier. Per layer it runs `specfold.kernels.fold_layer` on the
branches' hidden states: draft rows whose residual barely differs from their parent's (ρ ≤ δ) skip
QKV and FFN work and get an exactly corrected attention. δ = 0 reproduces dense verification.

Invariants: the prefix cache is read through zero-copy views; the root branch always recomputes;
`parents[b]` is branch b's parent inside the batch (-1 for the root); fold statistics accumulate
per layer until `report()`.
"""
from __future__ import annotations

import torch

from specfold.kernels import LayerWeights, fold_layer
from specfold.models.cache import PrefixCache
from specfold.models.transformer import Transformer


class FoldVerifier:
    name = "fold"

    def __init__(self, model: Transformer, delta: float, backend: str = "torch"):
        if delta < 0:
            raise ValueError(f"delta must be >= 0, got {delta}")
        self.model, self.delta, self.backend = model, float(delta), backend
        self.weights = [LayerWeights.from_layer(layer, model.spec.head_dim) for layer in model.layers]
        self.reset()

    def reset(self) -> None:
        L = len(self.weights)
        self.folded = [0] * L
        self.positions = [0] * L
        self.ffn_folded = [0] * L

    def report(self) -> dict:
        tot = sum(self.positions)
        return {
            "fold_ratio": sum(self.folded) / tot if tot else 0.0,
            "fold_ratio_per_layer": [f / p if p else 0.0 for f, p in zip(self.folded, self.positions)],
            "ffn_fold_ratio": sum(self.ffn_folded) / tot if tot else 0.0,
            "delta": self.delta,
        }

    def __call__(self, tokens: torch.Tensor, parents: list[int], positions: torch.Tensor,
                 cache: PrefixCache | None, mask: torch.Tensor | None, out_idx: torch.Tensor) -> torch.Tensor:
        m = self.model
        B, W = tokens.shape
        x = m.embed(tokens)  # [B, W, d]
        cos, sin = m.rope.cos_sin(positions, x.dtype)
        qscale = m.rope.query_scale(positions, x.dtype)
        if qscale is not None and not bool((qscale == 1).all()):
            raise NotImplementedError("folded verification does not support Llama-4 query scaling past the "
                                      "original context; use method='spiffy' (dense) for such positions")
        par = torch.tensor(parents, dtype=torch.long, device=x.device)
        win = mask if mask is not None else torch.ones(W, W, dtype=torch.bool, device=x.device)
        s = m.spec
        empty = x.new_zeros(s.num_kv_heads, 0, s.head_dim)
        for li, w in enumerate(self.weights):
            pk, pv = cache.view(li) if cache is not None else (empty, empty)
            x, st = fold_layer(x, par, w, cos, sin, pk, pv, win, self.delta, m.attn_scale, backend=self.backend)
            self.folded[li] += st.folded
            self.positions[li] += st.draft_positions
            self.ffn_folded[li] += st.ffn_folded
        return m.head(x[:, out_idx])
