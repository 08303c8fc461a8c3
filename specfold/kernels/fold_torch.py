"""Folded multi-branch verification (SpecFold, SPEC.md §6): PyTorch twins and layer composition.

Setting. Verification forwards ``B1 = B + 1`` branches (branch 0 = root/main, 1..B = drafts) of one
window of ``N`` positions against one shared prefix KV cache (``K_p, V_p: [Hkv, P, D]``, shared by all
branches, never copied). ``par: [B1]`` long, ``par[0] == -1``, ``0 <= par[i] < i`` for drafts.

Pieces (each has a Triton kernel with the same signature in ``fold_triton.py``):

- ``gate_compact``       relative-residual gate  rho = ||H_i[n]-H_par(i)[n]|| / max(||H_par(i)[n]||, eps);
                         rho <= delta folds, branch 0 always recomputes.
- ``compact_rows``       packed ids of recomputed rows / folded rows, and the row id of every (i, n).
- ``resolve_sources``    src[i, n] = i if (i, n) recomputes else src[par(i), n].
- ``packed_norm_qkv_rope`` RMSNorm + q/k/v projection (+ optional per-head q/k RMSNorm) + RoPE on
                         the packed recomputed rows only.
- ``streaming_attention`` per recomputed row: unnormalised output O, running max m and denominator Z
                         over the prefix (all visible) and the row's own branch's window keys under M.
- ``folded_correction``  folded row (i, n) starts from its source row's (q, m, Z, O) and swaps the
                         source branch's contributions at the keys where branch i's K/V differ.
- ``packed_ffn``         RMSNorm + SwiGLU on the packed recomputed rows.

Invariants.
- Row ids: a flat row index is ``i * N + n``. ``rows`` lists recomputed rows in increasing flat order,
  ``row_of[i, n]`` is the packed id of a recomputed (i, n) and -1 for a folded one.
- ``kv_row[i, j] = row_of[src[i, j], j]``: the packed row whose q/k/v/FFN output branch i uses at
  position j. K/V of a branch are never materialised: attention gathers them through ``kv_row``.
- Branch 0 is always recomputed, so ``src`` and ``kv_row`` are always defined (no -1 in ``kv_row``).
- The attention state is (O unnormalised, m, Z) with ``softmax output = O / Z``; a row that sees no
  key at all has m = -inf, Z = 0, O = 0 (window masks always let n see n, so this does not happen
  in practice).
- Residual streams are never copied between branches: every row adds its own (possibly corrected)
  attention output and its FFN source row's FFN output to its own hidden state.
- The FFN is inherited only by rows that pass the gate on the post-attention residual
  (``ffn_gate``, see ``fold_layer``): a folded row's attention output differs from its source's
  whenever the branch's window K/V differ, so inheriting the FFN with the QKV decision is not exact.
- delta = 0 folds only rows that are bit-identical to their parent's; their q/k/v and FFN output are
  then identical to what recomputation would give, so fold_layer(delta=0) == dense_layer up to float
  rounding (with the default ffn_gate=True) (the correction subtracts and re-adds terms, which is exact in exact arithmetic).

``o_proj`` and the residual adds are plain torch ops in both backends (dense GEMM on all rows).
The layer composition over one or many forwards lives in ``fold_pack`` (``fold_layer`` here is its
one-forward entry point); ``dense_attention`` / ``dense_layer`` are the plain dense computation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import ModuleType
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
    ``eps`` is used for every RMSNorm of the layer.
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
    w_gate: Tensor
    w_up: Tensor
    w_down: Tensor
    head_dim: int
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

    def share_fused(self, wqkv: Tensor, gate_up: Tensor) -> None:
        """Adopt weights fused elsewhere: ``wqkv`` = [wq; wk; wv] and ``gate_up`` = [w_gate; w_up],
        of which this layer's tensors are row views (load-time fusion: no second copy)."""
        if not (wqkv.shape[0] == sum(t.shape[0] for t in (self.wq, self.wk, self.wv))
                and gate_up.shape[0] == self.w_gate.shape[0] + self.w_up.shape[0]):
            raise ValueError("share_fused: fused shapes do not match the layer's weights")
        self._fused["qkv"] = ((self.wq, self.wk, self.wv, self.bq, self.bk, self.bv), wqkv, self._qkv_bias())
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

        return cls(
            input_norm_w=layer.input_norm.weight, eps=float(layer.input_norm.eps),
            wq=layer.q_proj.weight, bq=bias(layer.q_proj),
            wk=layer.k_proj.weight, bk=bias(layer.k_proj),
            wv=layer.v_proj.weight, bv=bias(layer.v_proj),
            q_norm_w=norm_w(getattr(layer, "q_norm", None)), k_norm_w=norm_w(getattr(layer, "k_norm", None)),
            wo=layer.o_proj.weight, post_norm_w=layer.post_norm.weight,
            w_gate=layer.gate_proj.weight, w_up=layer.up_proj.weight, w_down=layer.down_proj.weight,
            head_dim=head_dim,
        )


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


def gate_compact(H: Tensor, par: Tensor, delta: float) -> tuple[Tensor, Tensor]:
    """Relative-residual gate.

    H [B1, N, d], par [B1] -> recompute_mask [B1, N] bool, rho [B1, N] (float32 at least; +inf for branch 0).
    Row (i, n), i >= 1, folds iff rho <= delta.
    """
    B1 = H.shape[0]
    check_par(par, B1)
    acc = torch.promote_types(H.dtype, torch.float32)            # float32 at least
    parent = H[par[1:]].to(acc)                                  # [B, N, d]
    num = (H[1:].to(acc) - parent).norm(dim=-1)                  # [B, N]
    den = parent.norm(dim=-1).clamp_min(GATE_EPS)
    rho = torch.cat((num.new_full((1, H.shape[1]), math.inf), num / den), dim=0)   # [B1, N]
    return rho > delta, rho


def compact_rows(recompute_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """recompute_mask [B1, N] bool -> rows [R] long, folded_rows [F] long (flat ids i*N+n, increasing),
    row_of [B1, N] long (packed id of a recomputed row, -1 for a folded one)."""
    flat = recompute_mask.reshape(-1)
    rows = flat.nonzero().squeeze(1)
    folded_rows = (~flat).nonzero().squeeze(1)
    row_of = torch.where(flat, flat.long().cumsum(0) - 1, torch.full_like(flat, -1, dtype=torch.long))
    return rows, folded_rows, row_of.view(recompute_mask.shape)


def ancestors(par: Tensor) -> Tensor:
    """par [B1] -> anc [B1, depth] long: branch i's chain i, par(i), ..., 0, padded with 0 (the root)."""
    p = par.tolist()
    chains = []
    for i in range(len(p)):
        c = [i]
        while c[-1] > 0:
            c.append(p[c[-1]])
        chains.append(c)
    depth = max(len(c) for c in chains)
    return torch.tensor([c + [0] * (depth - len(c)) for c in chains], dtype=torch.long, device=par.device)


def resolve_sources(recompute_mask: Tensor, par: Tensor, anc: Tensor | None = None) -> Tensor:
    """recompute_mask [B1, N], par [B1] -> src [B1, N] long: nearest recomputed ancestor (or self).

    ``anc`` = ``ancestors(par)`` when the caller already has it (built once per verification); the
    root ends every chain and counts as recomputed, so src[0] = 0 and every chain resolves.
    """
    if anc is None:
        anc = ancestors(par)
    rec = recompute_mask[anc] | (anc == 0)[:, :, None]                         # [B1, depth, N]
    return anc.gather(1, rec.to(torch.uint8).argmax(1))                       # first True on the chain


def fused_qkv_rope(x: Tensor, w: LayerWeights, c: Tensor, s: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """x [R, d] (already RMS-normed rows), c/s [R, D] -> q [R, Hq, D], k, v [R, Hkv, D]: one GEMM with
    the fused [wq; wk; wv], optional per-head q/k norm, RoPE on q and k."""
    D = w.head_dim
    wqkv, bqkv = w.fused_qkv()
    y = x @ wqkv.t()
    if bqkv is not None:
        y = y + bqkv
    nq, nk = w.num_heads * D, w.num_kv_heads * D
    q = y[:, :nq].view(-1, w.num_heads, D)
    k = y[:, nq: nq + nk].view(-1, w.num_kv_heads, D)
    v = y[:, nq + nk:].reshape(-1, w.num_kv_heads, D)
    if w.q_norm_w is not None:
        q = rms_norm(q, w.q_norm_w, w.eps)
    if w.k_norm_w is not None:
        k = rms_norm(k, w.k_norm_w, w.eps)
    return apply_rope(q, c, s), apply_rope(k, c, s), v


def packed_norm_qkv_rope(
    H: Tensor, rows: Tensor, w: LayerWeights, cos: Tensor, sin: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """H [B1, N, d], rows [R], cos/sin [N, D] -> q [R, Hq, D], k [R, Hkv, D], v [R, Hkv, D].

    q = RoPE(q_norm?(x Wq^T + bq)), k likewise, v = x Wv^T + bv, x = RMSNorm(H[rows]) * input_norm_w.
    One GEMM with the fused [wq; wk; wv] (``LayerWeights.fused_qkv``).
    """
    N = H.shape[1]
    x = rms_norm(H.reshape(-1, H.shape[-1]).index_select(0, rows), w.input_norm_w, w.eps)  # [R, d]
    pos = rows % N
    c, s = cos[pos], sin[pos]                                                  # [R, D]
    return fused_qkv_rope(x, w, c, s)


def _by_kv_head(x: Tensor) -> Tensor:
    """[R, Hkv, G, X] -> [Hkv, R*G, X] (one GEMM per KV head for every row and grouped query head)."""
    R, Hkv, G, X = x.shape
    return x.permute(1, 0, 2, 3).reshape(Hkv, R * G, X)


def _from_kv_head(x: Tensor, R: int, G: int) -> Tensor:
    """[Hkv, R*G, X] -> [R, Hkv, G, X]."""
    return x.view(x.shape[0], R, G, x.shape[-1]).permute(1, 0, 2, 3)


def streaming_attention(
    q: Tensor, k: Tensor, v: Tensor, rows: Tensor, kv_row: Tensor,
    prefix_k: Tensor, prefix_v: Tensor, window_mask: Tensor, scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """Attention state of every recomputed row.

    q [R, Hq, D], k/v [R, Hkv, D] (packed), rows [R], kv_row [B1, N], prefix_k/v [Hkv, P, D],
    window_mask [N, N] bool -> O [R, Hq, D] (unnormalised), m [R, Hq], Z [R, Hq].
    Row r = (i, n) sees every prefix key and window key j of branch i iff window_mask[n, j].
    (The twin computes the same (O, m, Z) in one shot: prefix scores of the R rows in one GEMM per KV
    head, window scores and outputs in the dense [B1, N] layout of every branch's own K/V, one
    batched GEMM; the Triton kernel streams over key tiles.)
    """
    R, Hq, D = q.shape
    Hkv = k.shape[1]
    B1, N = kv_row.shape
    G, P, T = Hq // Hkv, prefix_k.shape[1], B1 * N
    flat = kv_row.reshape(-1)
    qe = q[flat].view(B1, N, Hkv, G, D).permute(0, 2, 3, 1, 4).reshape(B1, Hkv, G * N, D)
    kb = k[flat].view(B1, N, Hkv, D).permute(0, 2, 3, 1)                        # [B1, Hkv, D, N]
    sw = (torch.matmul(qe, kb) * scale).view(B1, Hkv, G, N, N)                 # every (i, n) vs branch i
    sw = sw.permute(0, 3, 1, 2, 4).reshape(T, Hkv, G, N)[rows]                 # [R, Hkv, G, N]
    sw = sw.masked_fill(~window_mask[rows % N][:, None, None, :], -math.inf)
    q4 = q.view(R, Hkv, G, D)
    m = sw.amax(-1)
    if P:
        sp = _from_kv_head(torch.matmul(_by_kv_head(q4), prefix_k.transpose(1, 2)) * scale, R, G)  # [R,Hkv,G,P]
        m = torch.maximum(m, sp.amax(-1))
    ms = _safe_max(m)[..., None]
    pw = torch.exp(sw - ms)
    Z = pw.sum(-1)
    E = pw.new_zeros(T, Hkv, G, N)
    E[rows] = pw
    vb = v[flat].view(B1, N, Hkv, D).permute(0, 2, 1, 3)                        # [B1, Hkv, N, D]
    Ow = torch.matmul(E.view(B1, N, Hkv, G, N).permute(0, 2, 3, 1, 4).reshape(B1, Hkv, G * N, N), vb)
    O = Ow.view(B1, Hkv, G, N, D).permute(0, 3, 1, 2, 4).reshape(T, Hkv, G, D)[rows]
    if P:
        pp = torch.exp(sp - ms)
        Z = Z + pp.sum(-1)
        O = O + _from_kv_head(torch.matmul(_by_kv_head(pp), prefix_v), R, G)
    return O.reshape(R, Hq, D), m.reshape(R, Hq), Z.reshape(R, Hq)


def folded_correction(
    q: Tensor, k: Tensor, v: Tensor, O: Tensor, m: Tensor, Z: Tensor,
    folded_rows: Tensor, src: Tensor, kv_row: Tensor, window_mask: Tensor, scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """Exact attention state of folded rows, from their source rows' state.

    q [R, Hq, D], k/v [R, Hkv, D], O [R, Hq, D], m/Z [R, Hq] (state of the recomputed rows),
    folded_rows [F] (flat ids), src/kv_row [B1, N], window_mask [N, N]
    -> O_f [F, Hq, D], m_f [F, Hq], Z_f [F, Hq].

    Folded row (i, n) with source s = src[i, n] (packed row rs = kv_row[i, n]) takes q, m, Z, O of rs.
    At the keys j with kv_row[i, j] != kv_row[s, j] and window_mask[n, j] it removes
    exp(q.k_s[j]*scale - m) (v_s[j]) from Z (O), then adds exp(q.k_i[j]*scale - m') (v_i[j]) with
    m' = max(m, new scores), rescaling the remainder by exp(m - m').
    All folded rows at once: their queries' scores against every packed key in one GEMM per KV head,
    read at the two key sets, and the removed/added weights scattered onto the packed rows for one
    GEMM with v (no per-row gathers of K/V).
    Note: removal is a subtraction; if the removed keys carried almost all of the mass, the result
    keeps only the absolute accuracy of the source's Z (fine in float32/64 for attention outputs).
    """
    R, Hq, D = q.shape
    Hkv = k.shape[1]
    N = kv_row.shape[1]
    G, F = Hq // Hkv, folded_rows.shape[0]
    if F == 0:
        return O.new_zeros(0, Hq, D), m.new_zeros(0, Hq), Z.new_zeros(0, Hq)
    bi, n = folded_rows // N, folded_rows % N
    rs = kv_row[bi, n]                                                         # [F]
    idx_i, idx_s = kv_row[bi], kv_row[src[bi, n]]                              # [F, N]
    d4 = ((idx_i != idx_s) & window_mask[n])[:, None, None, :]                 # [F, 1, 1, N]
    S = _from_kv_head(torch.matmul(_by_kv_head(q[rs].view(F, Hkv, G, D)), k.permute(1, 2, 0)) * scale, F, G)
    ix = torch.cat((idx_s, idx_i), 1)[:, None, None, :].expand(F, Hkv, G, 2 * N)
    s_both = S.gather(-1, ix)                                                  # [F, Hkv, G, 2N]
    s_old, s_new = s_both[..., :N], s_both[..., N:].masked_fill(~d4, -math.inf)
    m0, Z0, O0 = m[rs].view(F, Hkv, G), Z[rs].view(F, Hkv, G), O[rs].view(F, Hkv, G, D)
    e_old = torch.where(d4, torch.exp(s_old - _safe_max(m0)[..., None]), torch.zeros_like(s_old))
    m1 = torch.maximum(m0, s_new.amax(-1))
    ms1 = _safe_max(m1)
    alpha = torch.exp(m0 - ms1)                                                # exp(m - m')
    e_new = torch.exp(s_new - ms1[..., None])
    Z2 = (Z0 - e_old.sum(-1)) * alpha + e_new.sum(-1)
    wts = torch.cat((-e_old * alpha[..., None], e_new), -1)
    A = wts.new_zeros(F, Hkv, G, R).scatter_add_(-1, ix, wts)                  # weights on packed rows
    O2 = O0 * alpha[..., None] + _from_kv_head(torch.matmul(_by_kv_head(A), v.transpose(0, 1)), F, G)
    return O2.reshape(F, Hq, D), m1.reshape(F, Hq), Z2.reshape(F, Hq)


def packed_ffn(H: Tensor, rows: Tensor, w: LayerWeights) -> Tensor:
    """H [B1, N, d] (after attention), rows [R] -> FFN output [R, d]:
    down(silu(gate(x)) * up(x)), x = RMSNorm(H[rows]) * post_norm_w (one GEMM for gate and up)."""
    x = rms_norm(H.reshape(-1, H.shape[-1]).index_select(0, rows), w.post_norm_w, w.eps)
    gu = x @ w.fused_gate_up().t()
    F = w.w_gate.shape[0]
    return torch.nn.functional.silu(gu[:, :F]).mul_(gu[:, F:]) @ w.w_down.t()


def dense_attention(
    q: Tensor, k: Tensor, v: Tensor, prefix_k: Tensor, prefix_v: Tensor, mask: Tensor | None, scale: float,
) -> Tensor:
    """Plain attention of every branch: q [B1, N, Hq, D], k/v [B1, N, Hkv, D] (each branch its own),
    prefix_k/v [Hkv, P, D] shared, mask [N, N] bool or None (full) -> [B1, N, Hq*D].
    Prefix scores of all branches come from one GEMM per KV head (the prefix is read, never copied)."""
    B1, N, Hq, D = q.shape
    Hkv = k.shape[2]
    G, P = Hq // Hkv, prefix_k.shape[1]
    qg = q.view(B1, N, Hkv, G, D).permute(0, 2, 3, 1, 4).reshape(B1, Hkv, G * N, D)
    sw = torch.matmul(qg, k.permute(0, 2, 3, 1)) * scale                       # [B1, Hkv, G*N, N]
    if mask is not None:
        sw = sw.view(B1, Hkv, G, N, N).masked_fill(~mask, -math.inf).view(B1, Hkv, G * N, N)
    sm = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    vt = v.permute(0, 2, 1, 3)                                                  # [B1, Hkv, N, D]
    if P == 0:
        out = torch.matmul(torch.softmax(sw, -1, dtype=sm).to(q.dtype), vt)
    else:
        qp = qg.permute(1, 0, 2, 3).reshape(Hkv, B1 * G * N, D)
        sp = (torch.matmul(qp, prefix_k.transpose(1, 2)) * scale).view(Hkv, B1, G * N, P).permute(1, 0, 2, 3)
        p = torch.softmax(torch.cat((sp, sw), -1), -1, dtype=sm).to(q.dtype)
        pp = p[..., :P].permute(1, 0, 2, 3).reshape(Hkv, B1 * G * N, P)
        out = torch.matmul(pp, prefix_v).view(Hkv, B1, G * N, D).permute(1, 0, 2, 3) + torch.matmul(p[..., P:], vt)
    return out.view(B1, Hkv, G, N, D).permute(0, 3, 1, 2, 4).reshape(B1, N, Hq * D)


def inherit_attention(
    q: Tensor, k: Tensor, v: Tensor, kv_row: Tensor, prefix_k: Tensor, prefix_v: Tensor,
    mask: Tensor | None, scale: float,
) -> Tensor:
    """Attention of every row of one forward, folded rows included (the torch backend's path).

    q [R, Hq, D], k/v [R, Hkv, D] (the forward's packed recomputed rows), kv_row [B1, N] (packed row
    each (i, n) takes q/k/v from: itself if recomputed, its source if folded), prefix_k/v [Hkv, P, D],
    mask [N, N] bool or None -> [B1 * N, Hq * D] (flat rows i * N + n).
    Row (i, n) attends with q of kv_row[i, n] to the prefix and to branch i's window keys
    kv_row[i, j] (mask[n, j]). The prefix part of a softmax depends only on q, so its state
    (m_p, Z_p, O_p) is computed once per recomputed row and read by every row using that q; the
    window part of every row is one batched GEMM over the branches; the two states merge exactly
    (the same result as streaming_attention + folded_correction, without the correction's GEMMs).
    """
    dt = q.dtype
    if dt in (torch.float16, torch.bfloat16):
        q, k, v, prefix_k, prefix_v = (x.float() for x in (q, k, v, prefix_k, prefix_v))
    R, Hq, D = q.shape
    Hkv = k.shape[1]
    G, (B1, N), P = Hq // Hkv, kv_row.shape, prefix_k.shape[1]
    flat = kv_row.reshape(-1)
    qg = q.index_select(0, flat).view(B1, N, Hkv, G, D).permute(0, 2, 3, 1, 4).reshape(B1, Hkv, G * N, D)
    kb = k.index_select(0, flat).view(B1, N, Hkv, D).permute(0, 2, 3, 1)               # [B1, Hkv, D, N]
    vb = v.index_select(0, flat).view(B1, N, Hkv, D).permute(0, 2, 1, 3)               # [B1, Hkv, N, D]
    sw = torch.matmul(qg, kb).mul_(scale)                                               # [B1, Hkv, G*N, N]
    if mask is not None:
        sw = sw.view(B1, Hkv, G, N, N).masked_fill_(~mask, -math.inf).view(B1, Hkv, G * N, N)
    m = sw.amax(-1)                                                                     # [B1, Hkv, G*N]
    if P:
        sp = torch.matmul(_by_kv_head(q.view(R, Hkv, G, D)), prefix_k.transpose(1, 2)).mul_(scale)
        mp = sp.amax(-1, keepdim=True)                                                  # [Hkv, R*G, 1]
        pp = sp.sub_(mp).exp_()
        Zp, Op = pp.sum(-1, keepdim=True), torch.matmul(pp, prefix_v)                   # per recomputed row

        def per_row(x: Tensor) -> Tensor:  # [Hkv, R*G, X] -> every (i, n) in the window layout
            X = x.shape[-1]
            x = x.reshape(Hkv, R, G * X).index_select(1, flat).view(Hkv, B1, N, G, X)
            return x.permute(1, 0, 3, 2, 4).reshape(B1, Hkv, G * N, X)

        mp_w, Zp_w, Op_w = per_row(mp)[..., 0], per_row(Zp)[..., 0], per_row(Op)
        m = torch.maximum(m, mp_w)
    ms = _safe_max(m)
    e = (sw - ms[..., None]).exp_()
    Z, O = e.sum(-1), torch.matmul(e, vb)                                               # [B1, Hkv, G*N(, D)]
    if P:
        a = (mp_w - ms).exp_()
        Z = Z.add_(Zp_w * a)
        O = O.add_(Op_w * a[..., None])
    out = O.div_(Z[..., None])
    return out.view(B1, Hkv, G, N, D).permute(0, 3, 1, 2, 4).reshape(B1 * N, Hq * D).to(dt)


# ----------------------------------------------------------------------------------------------
# composition


def _pieces(backend: str) -> ModuleType:
    if backend == "torch":
        import sys
        return sys.modules[__name__]
    from specfold.kernels import get_backend
    return get_backend(backend)


def fold_layer(
    H: Tensor, par: Tensor, w: LayerWeights, cos: Tensor, sin: Tensor,
    prefix_k: Tensor, prefix_v: Tensor, window_mask: Tensor, delta: float, scale: float,
    backend: str = "torch", ffn_gate: bool = True,
) -> tuple[Tensor, LayerFoldStats]:
    """One decoder layer with folded verification (one forward; ``fold_pack`` packs many).

    H [B1, N, d], par [B1], cos/sin [N, D], prefix_k/v [Hkv, P, D], window_mask [N, N] bool
    -> H_out [B1, N, d], LayerFoldStats.

    FFN inheritance. A row folded at the QKV gate has its own (corrected) attention output, so its
    FFN input H_mid differs from its source's whenever the branch's window K/V differ. With
    ``ffn_gate=True`` (default) the gate is applied again to H_mid: a row inherits its FFN source's
    output iff ||H_mid_i - H_mid_par|| <= delta ||H_mid_par|| (sources resolved again along the
    chain), whatever the QKV gate said. This keeps delta = 0 exact (SPEC §6), and in a stack of
    layers this decision is also the next layer's QKV gate (``fold_pack``: one sync per layer). With
    ``ffn_gate=False`` folded rows inherit the FFN output of their QKV-gate source unconditionally
    (the literal reading of SPEC §6; not exact at delta = 0).
    """
    from specfold.kernels.fold_pack import fold_layer_one
    return fold_layer_one(H, par, w, cos, sin, prefix_k, prefix_v, window_mask, delta, scale,
                          _pieces(backend), ffn_gate)


def dense_layer(
    H: Tensor, w: LayerWeights, cos: Tensor, sin: Tensor,
    prefix_k: Tensor, prefix_v: Tensor, window_mask: Tensor, scale: float,
) -> Tensor:
    """Reference: every position of every branch computed, each branch over its own window K/V, with
    the model's separate q/k/v and gate/up GEMMs (the cost of the dense verification forward).

    H [B1, N, d], cos/sin [N, D], prefix_k/v [Hkv, P, D], window_mask [N, N] -> H_out [B1, N, d].
    """
    B1, N, d = H.shape
    D = w.head_dim
    x = rms_norm(H, w.input_norm_w, w.eps)                                       # [B1, N, d]

    def proj(wt: Tensor, b: Tensor | None) -> Tensor:
        y = x @ wt.t()
        return (y if b is None else y + b).view(B1, N, -1, D)

    q, k, v = proj(w.wq, w.bq), proj(w.wk, w.bk), proj(w.wv, w.bv)              # [B1, N, h, D]
    if w.q_norm_w is not None:
        q = rms_norm(q, w.q_norm_w, w.eps)
    if w.k_norm_w is not None:
        k = rms_norm(k, w.k_norm_w, w.eps)
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    q = q * c + rotate_half(q) * s
    k = k * c + rotate_half(k) * s
    H_mid = H + dense_attention(q, k, v, prefix_k, prefix_v, window_mask, scale) @ w.wo.t()
    xf = rms_norm(H_mid, w.post_norm_w, w.eps)
    ffn = (torch.nn.functional.silu(xf @ w.w_gate.t()) * (xf @ w.w_up.t())) @ w.w_down.t()
    return H_mid + ffn
