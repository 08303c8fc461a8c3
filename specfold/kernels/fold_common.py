"""What both fold backends share (SPEC.md §6): the per-layer weights, the per-layer fold counts, and
the small numerics (RMSNorm, RoPE, the parent check). `fold_torch` (the PyTorch twins), `fold_triton`
(the Triton kernels) and `fold_pack` (the composition) import these; nothing here imports them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

# Guards only the 0/0 of an all-zero parent row: rho = ||diff|| / max(||parent||, GATE_EPS).
# It never changes rho for a row whose norm exceeds 1e-30, and with delta = 0 a zero parent folds
# exactly when the child is zero too (0 / eps = 0 <= 0), which is still exact.
GATE_EPS = 1e-30


@dataclass(slots=True)
class LayerWeights:
    """Tensors of one decoder layer (nn.Linear layout: weight [out, in]).

    Shapes: wq [Hq*D, d], wk/wv [Hkv*D, d], wo [d, Hq*D], w_gate/w_up [F, d], w_down [d, F],
    input_norm_w/post_norm_w [d], q_norm_w/k_norm_w [D] (per-head RMSNorm, Qwen3) or None.
    ``eps`` is used for every RMSNorm of the layer. A mixture-of-experts layer (LLaDA2) has no
    w_gate/w_up/w_down: ``moe`` is its position-wise FFN module (routed + shared experts) applied to
    the post-attention-normed rows, ``moe(rms_norm(x, post_norm_w, eps)) -> [R, d]``.
    ``reduce``: under tensor parallelism (models/parallel.py) the weights are one rank's shard, and
    the o_proj and FFN outputs are partial sums that ``reduce`` adds up over the ranks; None: one rank.
    """

    input_norm_w: Tensor
    eps: float
    wq: Tensor
    bq: Tensor | None
    wk: Tensor
    bk: Tensor | None
    wv: Tensor
    bv: Tensor | None
    q_norm_w: Tensor | None
    k_norm_w: Tensor | None
    wo: Tensor
    post_norm_w: Tensor
    w_gate: Tensor | None
    w_up: Tensor | None
    w_down: Tensor | None
    head_dim: int
    moe: Any = None
    reduce: Any = None
    _fused: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        d = self.input_norm_w.shape[0]
        D = self.head_dim
        for name in ("wq", "wk", "wv"):
            w = getattr(self, name)
            if w.shape[1] != d or w.shape[0] % D:
                raise ValueError(f"{name} has shape {tuple(w.shape)}; expected [heads*{D}, {d}]")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.wv.shape != self.wk.shape:
            raise ValueError("wk and wv must have the same shape")
        if tuple(self.wo.shape) != (d, self.wq.shape[0]):
            raise ValueError(f"wo has shape {tuple(self.wo.shape)}; expected [{d}, {self.wq.shape[0]}]")

    def fused_qkv(self) -> tuple[Tensor, Tensor | None]:
        """[wq; wk; wv] ([(Hq+2Hkv)*D, d]) and the matching bias (or None), built once and cached
        (rebuilt if a weight tensor is replaced). Costs one extra copy of the q/k/v weights."""
        src = (self.wq, self.wk, self.wv, self.bq, self.bk, self.bv)
        hit = self._fused.get("qkv")
        if hit is None or any(a is not b for a, b in zip(hit[0], src)):
            with torch.no_grad():
                hit = (src, torch.cat((self.wq, self.wk, self.wv)).detach(), self._qkv_bias())
            self._fused["qkv"] = hit
        return hit[1], hit[2]

    def _qkv_bias(self) -> Tensor | None:
        """[bq; bk; bv] (zeros for a missing one), or None when the layer has no q/k/v bias."""
        pairs = ((self.wq, self.bq), (self.wk, self.bk), (self.wv, self.bv))
        if all(b is None for _, b in pairs):
            return None
        with torch.no_grad():
            return torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for w, b in pairs]).detach()

    def share_fused(self, wqkv: Tensor, gate_up: Tensor | None) -> None:
        """Adopt weights fused elsewhere: ``wqkv`` = [wq; wk; wv] and ``gate_up`` = [w_gate; w_up]
        (None on a MoE layer), of which this layer's tensors are row views (load-time fusion: no
        second copy)."""
        if not (wqkv.shape[0] == sum(t.shape[0] for t in (self.wq, self.wk, self.wv))
                and (gate_up is None) == (self.w_gate is None)
                and (gate_up is None or gate_up.shape[0] == self.w_gate.shape[0] + self.w_up.shape[0])):
            raise ValueError("share_fused: fused shapes do not match the layer's weights")
        self._fused["qkv"] = ((self.wq, self.wk, self.wv, self.bq, self.bk, self.bv), wqkv, self._qkv_bias())
        if gate_up is not None:
            self._fused["gate_up"] = ((self.w_gate, self.w_up), gate_up)

    def fused_gate_up(self) -> Tensor:
        """[w_gate; w_up] ([2F, d]), built once and cached like ``fused_qkv``."""
        src = (self.w_gate, self.w_up)
        hit = self._fused.get("gate_up")
        if hit is None or any(a is not b for a, b in zip(hit[0], src)):
            with torch.no_grad():
                hit = (src, torch.cat(src).detach())
            self._fused["gate_up"] = hit
        return hit[1]

    @property
    def num_heads(self) -> int:
        return self.wq.shape[0] // self.head_dim

    @property
    def num_kv_heads(self) -> int:
        return self.wk.shape[0] // self.head_dim

    @classmethod
    def from_layer(cls, layer: Any, head_dim: int) -> "LayerWeights":
        """Build from a decoder layer with DESIGN.md names (input_norm, q_proj, ..., down_proj)."""

        def bias(lin: Any) -> Tensor | None:
            return getattr(lin, "bias", None)

        def norm_w(norm: Any) -> Tensor | None:
            return None if norm is None else norm.weight

        moe = getattr(layer, "moe", None)
        ffn = (None, None, None) if moe is not None else (layer.gate_proj.weight, layer.up_proj.weight,
                                                           layer.down_proj.weight)
        return cls(
            input_norm_w=layer.input_norm.weight, eps=float(layer.input_norm.eps),
            wq=layer.q_proj.weight, bq=bias(layer.q_proj),
            wk=layer.k_proj.weight, bk=bias(layer.k_proj),
            wv=layer.v_proj.weight, bv=bias(layer.v_proj),
            q_norm_w=norm_w(getattr(layer, "q_norm", None)), k_norm_w=norm_w(getattr(layer, "k_norm", None)),
            wo=layer.o_proj.weight, post_norm_w=layer.post_norm.weight,
            w_gate=ffn[0], w_up=ffn[1], w_down=ffn[2], head_dim=head_dim, moe=moe,
            reduce=getattr(layer, "tp_reduce", None),
        )

    def summed(self, y: Tensor) -> Tensor:
        """A partial o_proj or FFN output summed over the ranks (as it is on one rank)."""
        return y if self.reduce is None else self.reduce(y)


@dataclass(slots=True)
class LayerFoldStats:
    """Per-layer fold statistics (python ints; reading them syncs once per layer)."""

    folded: int            # folded draft positions
    draft_positions: int   # B * N
    recomputed_rows: int   # packed rows that ran QKV (includes the N rows of branch 0)
    ffn_folded: int        # draft positions that inherited their FFN output (post-attention gate)

    @property
    def fold_ratio(self) -> float | None:
        """Folded / draft positions at the QKV gate (the SPEC's per-layer fold ratio); None when the
        batch had no draft position (undefined, not 0)."""
        return self.folded / self.draft_positions if self.draft_positions else None

    @property
    def ffn_fold_ratio(self) -> float | None:
        return self.ffn_folded / self.draft_positions if self.draft_positions else None


# ----------------------------------------------------------------------------------------------
# small helpers shared by the twins and the dense reference


def moe_ffn(X: Tensor, rows: Tensor | None, w: LayerWeights) -> Tensor:
    """A MoE layer's FFN output of X's `rows` (all rows when None) -> [R, d]: RMSNorm, then the
    layer's own routed + shared experts on those rows packed (both backends: the routing and the
    grouped expert GEMMs are the model's). Position-wise, so a row's output is its own."""
    x = X if rows is None else X.index_select(0, rows)
    return w.moe(rms_norm(x, w.post_norm_w, w.eps))


def rms_norm(x: Tensor, w: Tensor, eps: float) -> Tensor:
    """x [..., k] -> x * rsqrt(mean(x^2) + eps) * w, computed in x's dtype (float32 at least)."""
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * w.to(y.dtype)).to(x.dtype)


def rotate_half(x: Tensor) -> Tensor:
    """HF rotate-half: [x1, x2] -> [-x2, x1] over the last dim."""
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [R, heads, D], cos/sin [R, D] (already gathered per row) -> x*cos + rotate_half(x)*sin."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def check_par(par: Tensor, num_branches: int) -> None:
    """par [B1] long: par[0] == -1 and 0 <= par[i] < i for i >= 1."""
    if par.shape != (num_branches,):
        raise ValueError(f"par has shape {tuple(par.shape)}; expected ({num_branches},)")
    check_parents(par.tolist(), num_branches)


def check_parents(p: list[int], num_branches: int) -> None:
    """The same check on a host list (no tensor read)."""
    if len(p) != num_branches or p[0] != -1 or any(not 0 <= p[i] < i for i in range(1, num_branches)):
        raise ValueError(f"par must have par[0] == -1 and 0 <= par[i] < i, got {p}")


def _safe_max(m: Tensor) -> Tensor:
    # reference point for exp(): -inf (no visible key) becomes 0 so exp(-inf - 0) = 0, never nan
    return torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)


# ----------------------------------------------------------------------------------------------
# the six pieces (PyTorch twins)
