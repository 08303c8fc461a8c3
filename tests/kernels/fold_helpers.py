"""Random problem builders shared by the fold-kernel tests (tiny shapes, seeded generators)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from specfold.kernels.fold_torch import LayerWeights


def make_weights(
    g: torch.Generator, d: int, Hq: int, Hkv: int, D: int, F: int, *, bias: bool, qk_norm: bool,
    dtype: torch.dtype = torch.float64,
) -> LayerWeights:
    def r(*shape: int, s: float = 1.0) -> Tensor:
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * s).to(dtype)

    return LayerWeights(
        input_norm_w=1 + r(d, s=0.1), eps=1e-6,
        wq=r(Hq * D, d, s=d ** -0.5), bq=r(Hq * D, s=0.1) if bias else None,
        wk=r(Hkv * D, d, s=d ** -0.5), bk=r(Hkv * D, s=0.1) if bias else None,
        wv=r(Hkv * D, d, s=d ** -0.5), bv=r(Hkv * D, s=0.1) if bias else None,
        q_norm_w=1 + r(D, s=0.1) if qk_norm else None, k_norm_w=1 + r(D, s=0.1) if qk_norm else None,
        wo=r(d, Hq * D, s=(Hq * D) ** -0.5), post_norm_w=1 + r(d, s=0.1),
        w_gate=r(F, d, s=d ** -0.5), w_up=r(F, d, s=d ** -0.5), w_down=r(d, F, s=F ** -0.5),
        head_dim=D,
    )


def rope_cos_sin(N: int, D: int, offset: int, dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    """HF-style cos/sin [N, D] for absolute positions offset..offset+N-1."""
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = torch.arange(offset, offset + N, dtype=torch.float64)[:, None] * inv[None, :]
    emb = torch.cat((ang, ang), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def window_mask(kind: str, N: int, g: torch.Generator, sub: int = 4) -> Tensor:
    """[N, N] bool: 'full' (bidirectional), 'block' (block-causal with blocks of `sub`), 'random'
    (random with the diagonal always visible)."""
    if kind == "full":
        return torch.ones(N, N, dtype=torch.bool)
    if kind == "block":
        idx = torch.arange(N)
        return (idx[:, None] // sub) >= (idx[None, :] // sub)
    m = torch.rand(N, N, generator=g) < 0.6
    return m | torch.eye(N, dtype=torch.bool)


def tree_hidden(
    g: torch.Generator, par: list[int], N: int, d: int, fold_prob: float, *, tiny: float = 0.0,
    dtype: torch.dtype = torch.float64,
) -> Tensor:
    """H [B1, N, d]: branch 0 random; draft i copies its parent's row at a position with probability
    fold_prob (plus `tiny` relative noise, 0 = bit-identical), else gets an unrelated random row."""
    B1 = len(par)
    H = torch.empty(B1, N, d, dtype=torch.float64)
    H[0] = torch.randn(N, d, generator=g, dtype=torch.float64)
    for i in range(1, B1):
        same = torch.rand(N, generator=g) < fold_prob
        fresh = torch.randn(N, d, generator=g, dtype=torch.float64)
        noise = torch.randn(N, d, generator=g, dtype=torch.float64) * tiny
        near = H[par[i]] + noise * H[par[i]].norm(dim=-1, keepdim=True) / math.sqrt(d)
        H[i] = torch.where(same[:, None], near, fresh)
    return H.to(dtype)


@dataclass
class Problem:
    """Everything fold_layer / dense_layer need."""

    H: Tensor
    par: Tensor
    w: LayerWeights
    cos: Tensor
    sin: Tensor
    prefix_k: Tensor
    prefix_v: Tensor
    mask: Tensor
    scale: float


def make_problem(
    seed: int, par: list[int], N: int = 5, d: int = 24, Hq: int = 4, Hkv: int = 2, D: int = 8,
    F: int = 40, P: int = 7, fold_prob: float = 0.6, tiny: float = 0.0, mask_kind: str = "full",
    bias: bool = True, qk_norm: bool = False, dtype: torch.dtype = torch.float64,
) -> Problem:
    g = torch.Generator().manual_seed(seed)
    w = make_weights(g, d, Hq, Hkv, D, F, bias=bias, qk_norm=qk_norm, dtype=dtype)
    cos, sin = rope_cos_sin(N, D, offset=P, dtype=dtype)
    pk = torch.randn(Hkv, P, D, generator=g, dtype=torch.float64).to(dtype)
    pv = torch.randn(Hkv, P, D, generator=g, dtype=torch.float64).to(dtype)
    H = tree_hidden(g, par, N, d, fold_prob, tiny=tiny, dtype=dtype)
    return Problem(H, torch.tensor(par), w, cos, sin, pk, pv, window_mask(mask_kind, N, g), 1 / math.sqrt(D))
