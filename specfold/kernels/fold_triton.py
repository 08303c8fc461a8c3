"""Folded multi-branch verification (SPEC.md §6): Triton kernels, same signatures as ``fold_torch``.

Each public function here mirrors the PyTorch twin of the same name in ``fold_torch.py`` (shapes,
row-id conventions and invariants are documented there). Importing this module never needs triton;
calling a kernel without it raises a RuntimeError naming the missing package. On a machine without
a GPU set ``TRITON_INTERPRET=1`` *before* this module is imported to run the kernels on the CPU
(that is how the tests check every kernel against its twin).

Numerics: all kernels accumulate in float32 (gate norms, RMSNorm, tl.dot, softmax state); outputs
are written in the input dtype. tl.dot uses ``DOT_PRECISION`` ("ieee" by default so results match the
float32 twin; set "tf32" for speed on Ampere+). float64 inputs are computed in float32.

Kernels (one launch each unless noted):
- gate_compact: one program per (i, n) row, two norms streamed over d.
- compact_rows: one program, tl.cumsum over the flattened [B1*N] mask (host reads R once).
- resolve_sources: one program per block of positions, sequential over branches (par[i] < i).
- packed_norm_qkv_rope: RMSNorm gather kernel, then one projection kernel per q/k/v
  (tl.dot tiles, bias, per-head RMSNorm and rotate-half RoPE fused; the two half-heads are
  accumulated separately so RoPE needs no shuffle).
- streaming_attention: program per (block of packed rows, query head); prefix keys in tl.dot tiles
  shared by the row block, window keys gathered per row through kv_row (each row's own branch).
- folded_correction: program per (block of folded rows, query head); pass 1 removes the source
  branch's contributions and finds m', pass 2 adds the branch's own contributions.
- packed_ffn: RMSNorm gather, fused gate/up GEMM with SiLU*up, down GEMM.

Composition (``fold_pack``, both backends): gate, compaction and source resolution run as flat
torch index ops over the packed rows of all forwards; this backend's kernels do QKV, attention,
correction and FFN (folded rows are always corrected here, never recomputed directly). The
gate/compact/resolve kernels above are the per-forward pieces, kept beside their twins and tested.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from specfold.kernels.fold_common import GATE_EPS, LayerFoldStats, LayerWeights, check_par, moe_ffn

try:  # optional dependency: the module must import without triton
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised only where triton is absent
    triton = None
    tl = None
    HAS_TRITON = False

__all__ = [
    "HAS_TRITON", "DOT_PRECISION", "LayerWeights", "LayerFoldStats",
    "gate_compact", "compact_rows", "resolve_sources", "packed_norm_qkv_rope",
    "streaming_attention", "folded_correction", "packed_ffn",
]

DOT_PRECISION = "ieee"


def _require_triton() -> None:
    if not HAS_TRITON:
        raise RuntimeError(
            "the 'triton' fold backend needs the `triton` package (pip install triton); "
            "use backend='torch' on machines without it"
        )


def _p2(x: int, lo: int = 16) -> int:
    return max(lo, triton.next_power_of_2(int(x)))


if HAS_TRITON:

    @triton.jit
    def _gate_kernel(h_ptr, par_ptr, rec_ptr, rho_ptr, N, d, delta, eps, BLOCK_D: tl.constexpr):
        row = tl.program_id(0)                      # flat (i, n)
        i = row // N
        n = row % N
        p = tl.load(par_ptr + i)
        p = tl.maximum(p, 0)                        # branch 0: any valid row, result overridden
        prow = p * N + n
        num = tl.zeros([BLOCK_D], dtype=tl.float32)
        den = tl.zeros([BLOCK_D], dtype=tl.float32)
        for k0 in range(0, d, BLOCK_D):
            k = k0 + tl.arange(0, BLOCK_D)
            km = k < d
            x = tl.load(h_ptr + row.to(tl.int64) * d + k, mask=km, other=0.0).to(tl.float32)
            y = tl.load(h_ptr + prow.to(tl.int64) * d + k, mask=km, other=0.0).to(tl.float32)
            num += (x - y) * (x - y)
            den += y * y
        rho = tl.sqrt(tl.sum(num, 0)) / tl.maximum(tl.sqrt(tl.sum(den, 0)), eps)
        rho = tl.where(i == 0, float("inf"), rho)
        tl.store(rho_ptr + row, rho)
        tl.store(rec_ptr + row, (rho > delta).to(tl.int8))

    @triton.jit
    def _compact_kernel(rec_ptr, rows_ptr, folded_ptr, row_of_ptr, T, BLOCK: tl.constexpr):
        idx = tl.arange(0, BLOCK)
        valid = idx < T
        r = tl.load(rec_ptr + idx, mask=valid, other=0).to(tl.int32)
        f = tl.where(valid, 1 - r, 0)
        cr = tl.cumsum(r, 0)
        cf = tl.cumsum(f, 0)
        tl.store(row_of_ptr + idx, tl.where(r == 1, cr - 1, -1).to(tl.int64), mask=valid)
        tl.store(rows_ptr + cr - 1, idx.to(tl.int64), mask=valid & (r == 1))
        tl.store(folded_ptr + cf - 1, idx.to(tl.int64), mask=valid & (f == 1))

    @triton.jit
    def _resolve_kernel(rec_ptr, par_ptr, src_ptr, B1, N, BLOCK_N: tl.constexpr):
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        nm = n < N
        tl.store(src_ptr + n, tl.zeros([BLOCK_N], dtype=tl.int64), mask=nm)
        for i in range(1, B1):
            tl.debug_barrier()                      # src[par[i]] written by this program is visible
            p = tl.load(par_ptr + i)
            sp = tl.load(src_ptr + p * N + n, mask=nm, other=0)
            r = tl.load(rec_ptr + i * N + n, mask=nm, other=0)
            tl.store(src_ptr + i * N + n, tl.where(r != 0, i, sp).to(tl.int64), mask=nm)

    @triton.jit
    def _rmsnorm_gather_kernel(x_ptr, rows_ptr, w_ptr, out_ptr, d, eps, BLOCK_D: tl.constexpr):
        r = tl.program_id(0)
        row = tl.load(rows_ptr + r).to(tl.int64)
        acc = tl.zeros([BLOCK_D], dtype=tl.float32)
        for k0 in range(0, d, BLOCK_D):
            k = k0 + tl.arange(0, BLOCK_D)
            x = tl.load(x_ptr + row * d + k, mask=k < d, other=0.0).to(tl.float32)
            acc += x * x
        rstd = 1.0 / tl.sqrt(tl.sum(acc, 0) / d + eps)
        for k0 in range(0, d, BLOCK_D):
            k = k0 + tl.arange(0, BLOCK_D)
            km = k < d
            x = tl.load(x_ptr + row * d + k, mask=km, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + k, mask=km, other=0.0).to(tl.float32)
            tl.store(out_ptr + r.to(tl.int64) * d + k, x * rstd * w, mask=km)

    @triton.jit
    def _head_proj_kernel(
        x_ptr, w_ptr, b_ptr, nw_ptr, cos_ptr, sin_ptr, rows_ptr, out_ptr,
        R, d, N, NH, eps,
        D: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr, ROPE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, HALF: tl.constexpr, PREC: tl.constexpr,
    ):
        # out[r, h, :] for a block of packed rows and one head h; x [R, d] normalised input,
        # w [NH*D, d]; the two half-heads [0, D/2) and [D/2, D) are accumulated separately.
        pid_m = tl.program_id(0)
        h = tl.program_id(1)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        jm = tl.arange(0, HALF)
        rvalid = rm < R
        jvalid = jm < D // 2
        acc1 = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)
        w1_rows = (h * D + jm).to(tl.int64)
        w2_rows = (h * D + D // 2 + jm).to(tl.int64)
        for k0 in range(0, d, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            kv = k < d
            x = tl.load(x_ptr + rm[:, None].to(tl.int64) * d + k[None, :], mask=rvalid[:, None] & kv[None, :], other=0.0)
            wmask = kv[:, None] & jvalid[None, :]
            w1 = tl.load(w_ptr + w1_rows[None, :] * d + k[:, None], mask=wmask, other=0.0).to(tl.float32)
            w2 = tl.load(w_ptr + w2_rows[None, :] * d + k[:, None], mask=wmask, other=0.0).to(tl.float32)
            acc1 += tl.dot(x, w1, input_precision=PREC)
            acc2 += tl.dot(x, w2, input_precision=PREC)
        if HAS_BIAS:
            acc1 += tl.load(b_ptr + h * D + jm, mask=jvalid, other=0.0).to(tl.float32)[None, :]
            acc2 += tl.load(b_ptr + h * D + D // 2 + jm, mask=jvalid, other=0.0).to(tl.float32)[None, :]
        if HAS_NORM:
            ss = tl.sum(acc1 * acc1, 1) + tl.sum(acc2 * acc2, 1)
            rstd = 1.0 / tl.sqrt(ss / D + eps)
            acc1 = acc1 * rstd[:, None] * tl.load(nw_ptr + jm, mask=jvalid, other=0.0).to(tl.float32)[None, :]
            acc2 = acc2 * rstd[:, None] * tl.load(nw_ptr + D // 2 + jm, mask=jvalid, other=0.0).to(tl.float32)[None, :]
        if ROPE:
            pos = tl.load(rows_ptr + rm, mask=rvalid, other=0) % N
            cmask = rvalid[:, None] & jvalid[None, :]
            c_off = pos[:, None] * D + jm[None, :]
            c1 = tl.load(cos_ptr + c_off, mask=cmask, other=0.0).to(tl.float32)
            c2 = tl.load(cos_ptr + c_off + D // 2, mask=cmask, other=0.0).to(tl.float32)
            s1 = tl.load(sin_ptr + c_off, mask=cmask, other=0.0).to(tl.float32)
            s2 = tl.load(sin_ptr + c_off + D // 2, mask=cmask, other=0.0).to(tl.float32)
            o1 = acc1 * c1 - acc2 * s1              # rotate_half: [x1, x2] -> [-x2, x1]
            o2 = acc2 * c2 + acc1 * s2
        else:
            o1 = acc1
            o2 = acc2
        omask = rvalid[:, None] & jvalid[None, :]
        o_off = rm[:, None].to(tl.int64) * (NH * D) + h * D + jm[None, :]
        tl.store(out_ptr + o_off, o1, mask=omask)
        tl.store(out_ptr + o_off + D // 2, o2, mask=omask)

    @triton.jit
    def _attn_kernel(
        q_ptr, k_ptr, v_ptr, rows_ptr, kvrow_ptr, pk_ptr, pv_ptr, mask_ptr,
        o_ptr, m_ptr, z_ptr,
        R, N, P, HQ, HKV, D, scale,
        BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr, PREC: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        h = tl.program_id(1)
        g = h // (HQ // HKV)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        dd = tl.arange(0, BLOCK_D)
        rvalid = rm < R
        dvalid = dd < D
        row = tl.load(rows_ptr + rm, mask=rvalid, other=0)
        b = row // N
        n = row % N
        q = tl.load(q_ptr + rm[:, None].to(tl.int64) * (HQ * D) + h * D + dd[None, :],
                    mask=rvalid[:, None] & dvalid[None, :], other=0.0).to(tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        z_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        # shared prefix: every row sees every key; tiles shared by the whole row block
        for p0 in range(0, P, BLOCK_P):
            pp = p0 + tl.arange(0, BLOCK_P)
            pvalid = pp < P
            base = g.to(tl.int64) * P * D
            kt = tl.load(pk_ptr + base + pp[None, :] * D + dd[:, None], mask=dvalid[:, None] & pvalid[None, :], other=0.0).to(tl.float32)
            s = tl.dot(q, kt, input_precision=PREC) * scale                  # [BLOCK_M, BLOCK_P]
            s = tl.where(pvalid[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            ms = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - ms)
            p = tl.exp(s - ms[:, None])
            vt = tl.load(pv_ptr + base + pp[:, None] * D + dd[None, :], mask=pvalid[:, None] & dvalid[None, :], other=0.0).to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(p, vt, input_precision=PREC)
            z_i = z_i * alpha + tl.sum(p, 1)
            m_i = m_new
        # the row's own branch's window keys, gathered through kv_row, visible iff M[n, j]
        for j in range(0, N):
            vis = tl.load(mask_ptr + n * N + j, mask=rvalid, other=0) != 0
            kr = tl.load(kvrow_ptr + b * N + j, mask=rvalid, other=0).to(tl.int64)
            koff = kr[:, None] * (HKV * D) + g * D + dd[None, :]
            kvmask = rvalid[:, None] & dvalid[None, :]
            kj = tl.load(k_ptr + koff, mask=kvmask, other=0.0).to(tl.float32)
            s = tl.sum(q * kj, 1) * scale
            s = tl.where(vis & rvalid, s, float("-inf"))
            m_new = tl.maximum(m_i, s)
            ms = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - ms)
            p = tl.exp(s - ms)
            vj = tl.load(v_ptr + koff, mask=kvmask, other=0.0).to(tl.float32)
            acc = acc * alpha[:, None] + p[:, None] * vj
            z_i = z_i * alpha + p
            m_i = m_new
        tl.store(o_ptr + rm[:, None].to(tl.int64) * (HQ * D) + h * D + dd[None, :], acc, mask=rvalid[:, None] & dvalid[None, :])
        tl.store(m_ptr + rm * HQ + h, m_i, mask=rvalid)
        tl.store(z_ptr + rm * HQ + h, z_i, mask=rvalid)

    @triton.jit
    def _correct_kernel(
        q_ptr, k_ptr, v_ptr, o_ptr, m_ptr, z_ptr, frows_ptr, src_ptr, kvrow_ptr, mask_ptr,
        of_ptr, mf_ptr, zf_ptr,
        F, N, HQ, HKV, D, scale,
        BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        h = tl.program_id(1)
        g = h // (HQ // HKV)
        fm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        dd = tl.arange(0, BLOCK_D)
        fvalid = fm < F
        dvalid = dd < D
        tile = fvalid[:, None] & dvalid[None, :]
        row = tl.load(frows_ptr + fm, mask=fvalid, other=0)
        b = row // N
        n = row % N
        rs = tl.load(kvrow_ptr + b * N + n, mask=fvalid, other=0).to(tl.int64)   # source packed row
        s_br = tl.load(src_ptr + b * N + n, mask=fvalid, other=0)                # source branch
        qoff = rs[:, None] * (HQ * D) + h * D + dd[None, :]
        q = tl.load(q_ptr + qoff, mask=tile, other=0.0).to(tl.float32)
        acc = tl.load(o_ptr + qoff, mask=tile, other=0.0).to(tl.float32)
        m0 = tl.load(m_ptr + rs * HQ + h, mask=fvalid, other=0.0)
        z = tl.load(z_ptr + rs * HQ + h, mask=fvalid, other=0.0)
        m0s = tl.where(m0 == float("-inf"), 0.0, m0)
        m1 = m0
        # pass 1: remove the source branch's contributions (relative to m0), find m'
        for j in range(0, N):
            ki = tl.load(kvrow_ptr + b * N + j, mask=fvalid, other=0).to(tl.int64)
            ks = tl.load(kvrow_ptr + s_br * N + j, mask=fvalid, other=0).to(tl.int64)
            vis = tl.load(mask_ptr + n * N + j, mask=fvalid, other=0) != 0
            dif = (ki != ks) & vis & fvalid
            ks_off = ks[:, None] * (HKV * D) + g * D + dd[None, :]
            ki_off = ki[:, None] * (HKV * D) + g * D + dd[None, :]
            s_old = tl.sum(q * tl.load(k_ptr + ks_off, mask=tile, other=0.0).to(tl.float32), 1) * scale
            e_old = tl.where(dif, tl.exp(s_old - m0s), 0.0)
            z = z - e_old
            acc = acc - e_old[:, None] * tl.load(v_ptr + ks_off, mask=tile, other=0.0).to(tl.float32)
            s_new = tl.sum(q * tl.load(k_ptr + ki_off, mask=tile, other=0.0).to(tl.float32), 1) * scale
            m1 = tl.maximum(m1, tl.where(dif, s_new, float("-inf")))
        m1s = tl.where(m1 == float("-inf"), 0.0, m1)
        alpha = tl.exp(m0 - m1s)
        z = z * alpha
        acc = acc * alpha[:, None]
        # pass 2: add the branch's own contributions relative to m'
        for j in range(0, N):
            ki = tl.load(kvrow_ptr + b * N + j, mask=fvalid, other=0).to(tl.int64)
            ks = tl.load(kvrow_ptr + s_br * N + j, mask=fvalid, other=0).to(tl.int64)
            vis = tl.load(mask_ptr + n * N + j, mask=fvalid, other=0) != 0
            dif = (ki != ks) & vis & fvalid
            ki_off = ki[:, None] * (HKV * D) + g * D + dd[None, :]
            s_new = tl.sum(q * tl.load(k_ptr + ki_off, mask=tile, other=0.0).to(tl.float32), 1) * scale
            e_new = tl.where(dif, tl.exp(s_new - m1s), 0.0)
            z = z + e_new
            acc = acc + e_new[:, None] * tl.load(v_ptr + ki_off, mask=tile, other=0.0).to(tl.float32)
        tl.store(of_ptr + fm[:, None].to(tl.int64) * (HQ * D) + h * D + dd[None, :], acc, mask=tile)
        tl.store(mf_ptr + fm * HQ + h, m1, mask=fvalid)
        tl.store(zf_ptr + fm * HQ + h, z, mask=fvalid)

    @triton.jit
    def _gate_up_kernel(
        x_ptr, wg_ptr, wu_ptr, out_ptr, M, K, NOUT,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREC: tl.constexpr,
    ):
        # out[M, NOUT] = silu(x @ wg^T) * (x @ wu^T); x [M, K], wg/wu [NOUT, K]
        rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        ag = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        au = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + rm[:, None].to(tl.int64) * K + k[None, :], mask=(rm[:, None] < M) & (k[None, :] < K), other=0.0)
            wmask = (k[:, None] < K) & (cn[None, :] < NOUT)
            woff = cn[None, :].to(tl.int64) * K + k[:, None]
            ag += tl.dot(x, tl.load(wg_ptr + woff, mask=wmask, other=0.0).to(tl.float32), input_precision=PREC)
            au += tl.dot(x, tl.load(wu_ptr + woff, mask=wmask, other=0.0).to(tl.float32), input_precision=PREC)
        act = ag / (1.0 + tl.exp(-ag)) * au
        tl.store(out_ptr + rm[:, None].to(tl.int64) * NOUT + cn[None, :], act, mask=(rm[:, None] < M) & (cn[None, :] < NOUT))

    @triton.jit
    def _linear_kernel(
        x_ptr, w_ptr, out_ptr, M, K, NOUT,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREC: tl.constexpr,
    ):
        # out[M, NOUT] = x @ w^T; x [M, K] float32, w [NOUT, K]
        rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + rm[:, None].to(tl.int64) * K + k[None, :], mask=(rm[:, None] < M) & (k[None, :] < K), other=0.0)
            w = tl.load(w_ptr + cn[None, :].to(tl.int64) * K + k[:, None], mask=(k[:, None] < K) & (cn[None, :] < NOUT), other=0.0).to(tl.float32)
            acc += tl.dot(x, w, input_precision=PREC)
        tl.store(out_ptr + rm[:, None].to(tl.int64) * NOUT + cn[None, :], acc, mask=(rm[:, None] < M) & (cn[None, :] < NOUT))


# ----------------------------------------------------------------------------------------------
# wrappers: same signatures as fold_torch


def gate_compact(H: Tensor, par: Tensor, delta: float) -> tuple[Tensor, Tensor]:
    """H [B1, N, d], par [B1] -> recompute_mask [B1, N] bool, rho [B1, N] float32 (+inf for branch 0)."""
    _require_triton()
    B1, N, d = H.shape
    check_par(par, B1)
    Hc = H.contiguous()
    rec = torch.empty(B1, N, dtype=torch.int8, device=H.device)
    rho = torch.empty(B1, N, dtype=torch.float32, device=H.device)
    _gate_kernel[(B1 * N,)](Hc, par.to(H.device).contiguous(), rec, rho, N, d, float(delta), GATE_EPS,
                            BLOCK_D=min(_p2(d), 1024))
    return rec.bool(), rho


def compact_rows(recompute_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """recompute_mask [B1, N] -> rows [R], folded_rows [F], row_of [B1, N] (see fold_torch)."""
    _require_triton()
    T = recompute_mask.numel()
    rec = recompute_mask.reshape(-1).to(torch.int8).contiguous()
    dev = recompute_mask.device
    rows = torch.empty(T, dtype=torch.long, device=dev)
    folded = torch.empty(T, dtype=torch.long, device=dev)
    row_of = torch.empty(T, dtype=torch.long, device=dev)
    _compact_kernel[(1,)](rec, rows, folded, row_of, T, BLOCK=_p2(T))
    R = int(recompute_mask.sum())                  # one host sync: packed buffers need R
    return rows[:R], folded[: T - R], row_of.view(recompute_mask.shape)


def resolve_sources(recompute_mask: Tensor, par: Tensor, anc: Tensor | None = None) -> Tensor:
    """recompute_mask [B1, N], par [B1] -> src [B1, N] long. ``anc`` (the twin's prebuilt ancestor
    chains) is accepted for the shared signature and not needed: the kernel walks par on the device."""
    _require_triton()
    B1, N = recompute_mask.shape
    src = torch.empty(B1, N, dtype=torch.long, device=recompute_mask.device)
    BLOCK_N = min(_p2(N), 256)
    _resolve_kernel[(triton.cdiv(N, BLOCK_N),)](
        recompute_mask.to(torch.int8).contiguous(), par.to(recompute_mask.device).contiguous(), src, B1, N,
        BLOCK_N=BLOCK_N)
    return src


def _rmsnorm_gather(X: Tensor, rows: Tensor, w: Tensor, eps: float) -> Tensor:
    """X [T, d], rows [R] -> float32 [R, d] = RMSNorm(X[rows]) * w."""
    R, d = rows.shape[0], X.shape[1]
    out = torch.empty(R, d, dtype=torch.float32, device=X.device)
    if R:
        _rmsnorm_gather_kernel[(R,)](X.contiguous(), rows.contiguous(), w.contiguous(), out, d, float(eps),
                                     BLOCK_D=min(_p2(d), 1024))
    return out


def packed_norm_qkv_rope(
    H: Tensor, rows: Tensor, w: LayerWeights, cos: Tensor, sin: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """H [B1, N, d], rows [R], cos/sin [N, D] -> q [R, Hq, D], k [R, Hkv, D], v [R, Hkv, D]."""
    _require_triton()
    B1, N, d = H.shape
    D = w.head_dim
    if D % 2:
        raise ValueError(f"head_dim must be even for rotate-half RoPE, got {D}")
    x = _rmsnorm_gather(H.reshape(B1 * N, d), rows, w.input_norm_w, w.eps)   # [R, d] float32
    R = rows.shape[0]
    cos_c, sin_c = cos.contiguous(), sin.contiguous()
    BLOCK_M, BLOCK_K, HALF = 16, min(_p2(d), 64), _p2(D // 2)

    def proj(wt: Tensor, b: Tensor | None, nw: Tensor | None, rope: bool) -> Tensor:
        nh = wt.shape[0] // D
        out = torch.empty(R, nh, D, dtype=H.dtype, device=H.device)
        if R:
            _head_proj_kernel[(triton.cdiv(R, BLOCK_M), nh)](
                x, wt.contiguous(), b if b is not None else wt, nw if nw is not None else wt, cos_c, sin_c,
                rows.contiguous(), out, R, d, N, nh, float(w.eps),
                D=D, HAS_BIAS=b is not None, HAS_NORM=nw is not None, ROPE=rope,
                BLOCK_M=BLOCK_M, BLOCK_K=BLOCK_K, HALF=HALF, PREC=DOT_PRECISION)
        return out

    return proj(w.wq, w.bq, w.q_norm_w, True), proj(w.wk, w.bk, w.k_norm_w, True), proj(w.wv, w.bv, None, False)


def streaming_attention(
    q: Tensor, k: Tensor, v: Tensor, rows: Tensor, kv_row: Tensor,
    prefix_k: Tensor, prefix_v: Tensor, window_mask: Tensor, scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """q [R, Hq, D], k/v [R, Hkv, D], rows [R], kv_row [B1, N], prefix_k/v [Hkv, P, D],
    window_mask [N, N] -> O [R, Hq, D] (unnormalised), m [R, Hq], Z [R, Hq] (float32)."""
    _require_triton()
    R, Hq, D = q.shape
    Hkv, N, P = k.shape[1], kv_row.shape[1], prefix_k.shape[1]
    O = torch.empty(R, Hq, D, dtype=torch.float32, device=q.device)
    m = torch.empty(R, Hq, dtype=torch.float32, device=q.device)
    Z = torch.empty(R, Hq, dtype=torch.float32, device=q.device)
    if R:
        BLOCK_M = 16
        _attn_kernel[(triton.cdiv(R, BLOCK_M), Hq)](
            q.contiguous(), k.contiguous(), v.contiguous(), rows.contiguous(), kv_row.contiguous(),
            prefix_k.contiguous(), prefix_v.contiguous(), window_mask.to(torch.int8).contiguous(),
            O, m, Z, R, N, P, Hq, Hkv, D, float(scale),
            BLOCK_M=BLOCK_M, BLOCK_P=64 if P > 32 else 16, BLOCK_D=_p2(D), PREC=DOT_PRECISION)
    return O, m, Z


def folded_correction(
    q: Tensor, k: Tensor, v: Tensor, O: Tensor, m: Tensor, Z: Tensor,
    folded_rows: Tensor, src: Tensor, kv_row: Tensor, window_mask: Tensor, scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """Folded rows' exact attention state -> O_f [F, Hq, D], m_f [F, Hq], Z_f [F, Hq] (float32)."""
    _require_triton()
    R, Hq, D = q.shape
    Hkv, N = k.shape[1], kv_row.shape[1]
    F = folded_rows.shape[0]
    Of = torch.empty(F, Hq, D, dtype=torch.float32, device=q.device)
    mf = torch.empty(F, Hq, dtype=torch.float32, device=q.device)
    Zf = torch.empty(F, Hq, dtype=torch.float32, device=q.device)
    if F:
        BLOCK_M = 16
        _correct_kernel[(triton.cdiv(F, BLOCK_M), Hq)](
            q.contiguous(), k.contiguous(), v.contiguous(), O.float().contiguous(), m.float().contiguous(),
            Z.float().contiguous(), folded_rows.contiguous(), src.contiguous(), kv_row.contiguous(),
            window_mask.to(torch.int8).contiguous(), Of, mf, Zf, F, N, Hq, Hkv, D, float(scale),
            BLOCK_M=BLOCK_M, BLOCK_D=_p2(D))
    return Of, mf, Zf


def packed_ffn(H: Tensor, rows: Tensor, w: LayerWeights) -> Tensor:
    """H [B1, N, d], rows [R] -> down(silu(gate(x)) * up(x)) [R, d], x = RMSNorm(H[rows]) * post_norm_w.
    A MoE layer falls back to the model's routed + shared experts on the packed rows (`moe_ffn`)."""
    if w.moe is not None:
        return moe_ffn(H.reshape(-1, H.shape[-1]), rows, w)
    _require_triton()
    B1, N, d = H.shape
    R, F = rows.shape[0], w.w_gate.shape[0]
    out = torch.empty(R, d, dtype=H.dtype, device=H.device)
    if not R:
        return out
    x = _rmsnorm_gather(H.reshape(B1 * N, d), rows, w.post_norm_w, w.eps)    # [R, d] float32
    act = torch.empty(R, F, dtype=torch.float32, device=H.device)
    BM, BN, BK = 16, 64, 32
    _gate_up_kernel[(triton.cdiv(R, BM), triton.cdiv(F, BN))](
        x, w.w_gate.contiguous(), w.w_up.contiguous(), act, R, d, F,
        BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, PREC=DOT_PRECISION)
    out32 = torch.empty(R, d, dtype=torch.float32, device=H.device)
    _linear_kernel[(triton.cdiv(R, BM), triton.cdiv(d, BN))](
        act, w.w_down.contiguous(), out32, R, F, d,
        BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, PREC=DOT_PRECISION)
    return out32.to(H.dtype)
