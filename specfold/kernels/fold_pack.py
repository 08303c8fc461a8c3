"""Folded verification of one or many forwards, packed (SPEC.md §6 and §8): the layer composition.

Rows. Every forward s (a "segment") has ``B1_s`` branches of one window of ``N_s`` positions; its
rows ``(i, n)`` sit in one flat array of all forwards' rows at ``offset_s + i * N_s + n``. The
hidden state of the whole verification is ``X [T, d]`` with ``T = sum(B1_s * N_s)``.

``PackPlan`` is built once per verification (never per layer): the draft rows and their parent rows
(the gate), the fold-chain ancestors of every row (source resolution), RoPE tables per row, and
each segment's bounds. Per layer, ``packed_fold_layer``:

1. gates every draft row against its parent row (rho <= delta folds; roots always recompute);
2. compacts the recomputed rows (one host sync: the per-segment counts, read as one list);
3. resolves each row's source (nearest recomputed ancestor in its own forward's branch tree);
4. runs norm + fused q/k/v + RoPE on the packed recomputed rows of all forwards at once;
5. per segment: dense attention if the segment recomputes every row, else the backend's
   ``streaming_attention`` on its recomputed rows and ``folded_correction`` on its folded rows,
   against the segment's own prefix and window mask;
6. ``o_proj`` on all rows, then the FFN re-gate on the post-attention residual (a second sync, only
   if some row folded at the QKV gate: otherwise every row recomputes its FFN), the packed FFN of
   all forwards at once, and every row adds its source row's FFN output to its own residual.

Invariants.
- Folding never crosses forwards: parents, ancestors and sources of a row are rows of its own
  segment; attention of a segment reads only its own rows' K/V and its own prefix.
- A layer where nothing folds runs the dense computation on all rows (no gathers, no correction).
- Gate, compaction and source resolution are flat index ops over all segments (both backends); the
  backend's kernels do the heavy pieces (QKV, attention, correction, FFN) with the twin signatures.
- delta = 0 folds only bit-identical rows, so the result equals dense verification up to rounding.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch
from torch import Tensor

from specfold.kernels.fold_torch import (
    GATE_EPS, LayerFoldStats, LayerWeights, check_par, dense_attention, fused_qkv_rope,
    rms_norm,
)


@dataclass(slots=True)
class Segment:
    """One forward's branches: ``par`` (par[0] == -1, par[i] < i), window mask [N, N] or None."""

    B1: int
    N: int
    par: list[int]
    mask: Tensor | None
    offset: int = 0

    @property
    def size(self) -> int:
        return self.B1 * self.N


class PackPlan:
    """Per-verification index structures of one or many segments (built once, used by every layer)."""

    def __init__(self, segments: list[Segment], cos: list[Tensor], sin: list[Tensor], device: torch.device):
        off, depth, chains_of = 0, 1, []
        for s in segments:
            check_par(torch.tensor(s.par), s.B1)
            s.offset = off
            chains = []
            for i in range(s.B1):  # ancestor chain of branch i: i, par(i), ..., 0
                c = [i]
                while c[-1] > 0:
                    c.append(s.par[c[-1]])
                chains.append(c)
            depth = max(depth, max(len(c) for c in chains))
            chains_of.append(chains)
            off += s.size
        self.segments, self.T = segments, off
        # draft rows (every position of every draft branch) and the parent's row at the same position
        dr, pr = [], []
        for s in segments:
            for i in range(1, s.B1):
                dr.extend(range(s.offset + i * s.N, s.offset + (i + 1) * s.N))
                pr.extend(range(s.offset + s.par[i] * s.N, s.offset + (s.par[i] + 1) * s.N))
        self.draft_rows = torch.tensor(dr, dtype=torch.long, device=device)
        self.parent_rows = torch.tensor(pr, dtype=torch.long, device=device)
        # ancestors [T, depth] (flat rows), padded with the root row of the same position
        anc = []
        for s, chains in zip(segments, chains_of):
            for c in chains:
                c = c + [0] * (depth - len(c))
                anc.extend([s.offset + b * s.N + n for b in c] for n in range(s.N))
        self.anc = torch.tensor(anc, dtype=torch.long, device=device)
        self.cos = torch.cat([c.repeat(s.B1, 1) for c, s in zip(cos, segments)])  # [T, D]
        self.sin = torch.cat([c.repeat(s.B1, 1) for c, s in zip(sin, segments)])
        self.last = torch.tensor([s.offset + s.size - 1 for s in segments], dtype=torch.long, device=device)
        self.has_drafts = bool(dr)

    # ------------------------------------------------------------------ per-layer index ops
    def gate(self, X: Tensor, delta: float) -> Tensor:
        """X [T, d] -> recompute [T] bool: roots always, a draft row iff rho > delta (as gate_compact)."""
        rec = torch.ones(self.T, dtype=torch.bool, device=X.device)
        if not self.has_drafts:
            return rec
        acc = torch.promote_types(X.dtype, torch.float32)
        par = X[self.parent_rows].to(acc)
        num = torch.linalg.vector_norm(X[self.draft_rows].to(acc) - par, dim=-1)
        den = torch.linalg.vector_norm(par, dim=-1).clamp_min(GATE_EPS)
        rec[self.draft_rows] = num / den > delta
        return rec

    def compact(self, rec: Tensor) -> tuple[Tensor, Tensor, Tensor, list[int]]:
        """rec [T] -> rows [R], folded [T-R] (flat ids, increasing), row_of [T] (-1 if folded),
        cumulative recomputed count at each segment end (python ints: the one host sync)."""
        cs = rec.cumsum(0)
        ends = cs[self.last].tolist()
        R = ends[-1]
        if R == self.T:
            rows = torch.arange(self.T, device=rec.device)
            return rows, rows[:0], rows, ends
        rows = _nonzero(rec, R)
        folded = _nonzero(~rec, self.T - R)
        row_of = torch.where(rec, cs - 1, torch.full_like(cs, -1))
        return rows, folded, row_of, ends

    def resolve(self, rec: Tensor) -> Tensor:
        """rec [T] -> src [T]: flat row of the nearest recomputed ancestor (self if recomputed)."""
        if self.anc.shape[1] == 1:
            return torch.arange(self.T, device=rec.device)
        first = rec[self.anc].to(torch.uint8).argmax(1, keepdim=True)
        return self.anc.gather(1, first).squeeze(1)

    def segment_stats(self, ends: list[int]) -> list[int]:
        """Recomputed rows per segment from the cumulative counts."""
        return [e - b for e, b in zip(ends, [0] + ends[:-1])]


def _nonzero(mask: Tensor, count: int) -> Tensor:
    if hasattr(torch, "nonzero_static") and mask.device.type != "cpu":
        return torch.nonzero_static(mask, size=count).squeeze(1)  # no second sync on accelerators
    return mask.nonzero().squeeze(1)


def _qkv_all(X: Tensor, w: LayerWeights, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Norm + fused q/k/v + RoPE on every row of X [T, d] (the dense path)."""
    return fused_qkv_rope(rms_norm(X, w.input_norm_w, w.eps), w, cos, sin)


def _ffn_all(X: Tensor, w: LayerWeights) -> Tensor:
    x = rms_norm(X, w.post_norm_w, w.eps)
    gu = x @ w.fused_gate_up().t()
    F = w.w_gate.shape[0]
    return (torch.nn.functional.silu(gu[:, :F]) * gu[:, F:]) @ w.w_down.t()


def packed_fold_layer(
    X: Tensor, plan: PackPlan, w: LayerWeights, prefixes: list[tuple[Tensor, Tensor]], delta: float,
    scale: float, be: ModuleType, ffn_gate: bool = True,
) -> tuple[Tensor, list[LayerFoldStats]]:
    """One decoder layer over the packed rows of every segment -> X_out [T, d], stats per segment.

    ``prefixes[s]`` = (K, V) [Hkv, P_s, D] of segment s's prefix cache at this layer.
    """
    T = plan.T
    Hq, D = w.num_heads, w.head_dim
    rec = plan.gate(X, delta)
    rows, folded, row_of, ends = plan.compact(rec)
    R = ends[-1]
    per_seg = plan.segment_stats(ends)
    if R == T:
        q, k, v = _qkv_all(X, w, plan.cos, plan.sin)
        parts = [dense_attention(q[s.offset: s.offset + s.size].view(s.B1, s.N, Hq, D),
                                 k[s.offset: s.offset + s.size].view(s.B1, s.N, -1, D),
                                 v[s.offset: s.offset + s.size].view(s.B1, s.N, -1, D), *pre, s.mask,
                                 scale).view(s.size, Hq * D)
                 for s, pre in zip(plan.segments, prefixes)]
        attn = parts[0] if len(parts) == 1 else torch.cat(parts)
        X_mid = X + attn @ w.wo.t()
        X_out = X_mid + _ffn_all(X_mid, w)
        return X_out, [LayerFoldStats(0, s.size - s.N, s.size, 0) for s in plan.segments]
    src = plan.resolve(rec)
    kv_row = row_of[src]                                                          # [T] packed ids
    q, k, v = be.packed_norm_qkv_rope(X[None], rows, w, plan.cos, plan.sin)
    attn = X.new_empty(T, Hq, D)
    r0 = 0
    for s, (pk, pv), n_rec in zip(plan.segments, prefixes, per_seg):
        t0, t1, r1 = s.offset, s.offset + s.size, r0 + n_rec
        qs, ks, vs = q[r0:r1], k[r0:r1], v[r0:r1]
        if n_rec == s.size:                                                        # nothing folded here
            attn[t0:t1] = dense_attention(qs.view(s.B1, s.N, Hq, D), ks.view(s.B1, s.N, -1, D),
                                          vs.view(s.B1, s.N, -1, D), pk, pv, s.mask, scale).view(s.size, Hq, D)
        elif not _use_correction(be, s.size - n_rec, pk.shape[1], Hq * D):
            # short prefix: every row's attention directly, folded rows with their source's q over
            # their own branch's K/V (the same result as the correction, in fewer, larger ops)
            flat = kv_row[t0:t1] - r0
            attn[t0:t1] = dense_attention(qs[flat].view(s.B1, s.N, Hq, D), ks[flat].view(s.B1, s.N, -1, D),
                                          vs[flat].view(s.B1, s.N, -1, D), pk, pv, s.mask,
                                          scale).view(s.size, Hq, D)
        else:
            mask = s.mask if s.mask is not None else _full_mask(s.N, X.device)
            rows_s = rows[r0:r1] - t0
            kvr = (kv_row[t0:t1] - r0).view(s.B1, s.N)
            O, m, Z = be.streaming_attention(qs, ks, vs, rows_s, kvr, pk, pv, mask, scale)
            attn[rows[r0:r1]] = (O / Z[..., None]).to(X.dtype)
            f0 = t0 - r0                                                           # folded rows before s
            fs = folded[f0: f0 + s.size - n_rec]
            src_b = torch.div(src[t0:t1] - t0, s.N, rounding_mode="floor").view(s.B1, s.N)
            Of, _mf, Zf = be.folded_correction(qs, ks, vs, O, m, Z, fs - t0, src_b, kvr, mask, scale)
            attn[fs] = (Of / Zf[..., None]).to(X.dtype)
        r0 = r1
    X_mid = X + attn.view(T, Hq * D) @ w.wo.t()
    if ffn_gate:
        rec2 = plan.gate(X_mid, delta) | rec
        rows2, _f2, row_of2, ends2 = plan.compact(rec2)
        per_seg2 = plan.segment_stats(ends2)
        if ends2[-1] == T:
            X_out = X_mid + _ffn_all(X_mid, w)
        else:
            ffn = be.packed_ffn(X_mid[None], rows2, w)
            X_out = X_mid + ffn[row_of2[plan.resolve(rec2)]]
    else:
        per_seg2 = per_seg
        X_out = X_mid + be.packed_ffn(X_mid[None], rows, w)[kv_row]
    return X_out, [LayerFoldStats(s.size - r, s.size - s.N, r, s.size - r2)
                   for s, r, r2 in zip(plan.segments, per_seg, per_seg2)]


# The torch backend computes folded rows' attention directly (dense over the row's own branch, with
# the inherited q) unless the prefix work the correction saves, folded rows x prefix x Hq*D
# multiply-adds, exceeds this; below it the correction's extra small ops cost more than they save
# on a CPU. The triton backend always corrects. `fold_pack.CORRECTION_MIN_MACS = 0` forces it.
CORRECTION_MIN_MACS = 5_000_000


def _use_correction(be: ModuleType, folded: int, prefix: int, width: int) -> bool:
    if be.__name__.endswith("fold_triton"):
        return True
    return folded * prefix * width >= CORRECTION_MIN_MACS


_MASKS: dict = {}


def _full_mask(N: int, device: torch.device) -> Tensor:
    key = (N, str(device))
    if key not in _MASKS:
        _MASKS[key] = torch.ones(N, N, dtype=torch.bool, device=device)
    return _MASKS[key]


def fold_layer_one(
    H: Tensor, par: Tensor, w: LayerWeights, cos: Tensor, sin: Tensor, prefix_k: Tensor, prefix_v: Tensor,
    window_mask: Tensor, delta: float, scale: float, be: ModuleType, ffn_gate: bool = True,
) -> tuple[Tensor, LayerFoldStats]:
    """``fold_layer`` for one forward: H [B1, N, d] -> H_out [B1, N, d], LayerFoldStats."""
    B1, N, d = H.shape
    mask = None if bool(window_mask.all()) else window_mask
    plan = PackPlan([Segment(B1, N, [int(x) for x in par.tolist()], mask)], [cos], [sin], H.device)
    out, st = packed_fold_layer(H.reshape(B1 * N, d), plan, w, [(prefix_k, prefix_v)], delta, scale, be, ffn_gate)
    return out.view(B1, N, d), st[0]


__all__ = ["PackPlan", "Segment", "packed_fold_layer", "fold_layer_one"]
