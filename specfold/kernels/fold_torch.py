"""Folded multi-branch verification (SpecFold, SPEC.md §6): the PyTorch twins of the kernels.

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
- ``packed_ffn``         RMSNorm + SwiGLU on the packed recomputed rows (a MoE layer: its routed and
                         shared experts on those rows, `fold_common.moe_ffn`).

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
The data types and numerics both backends share are in ``fold_common``; the layer composition over
one or many forwards (and its one-forward entry point ``fold_layer``, and the dense reference
``dense_layer``) lives in ``fold_pack``; ``dense_attention`` here is the plain dense attention.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from specfold.kernels.fold_common import (  # noqa: F401 (the shared types and numerics, re-exported)
    GATE_EPS, LayerFoldStats, LayerWeights, _safe_max, apply_rope, check_par, check_parents, moe_ffn, rms_norm,
    rotate_half,
)


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
    down(silu(gate(x)) * up(x)), x = RMSNorm(H[rows]) * post_norm_w (one GEMM for gate and up); a MoE
    layer runs its routed + shared experts on the packed rows (`moe_ffn`)."""
    if w.moe is not None:
        return moe_ffn(H.reshape(-1, H.shape[-1]), rows, w)
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
