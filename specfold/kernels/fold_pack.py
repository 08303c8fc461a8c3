"""Folded verification of one or many forwards, packed (SPEC.md §6 and §8): the layer composition.

Rows. Every forward s (a "segment") has ``B1_s`` branches of one window of ``N_s`` positions; its
rows ``(i, n)`` sit in one flat array of all forwards' rows at ``offset_s + i * N_s + n``. The
hidden state of the whole verification is ``X [T, d]`` with ``T = sum(B1_s * N_s)``.

``PackPlan`` is built once per verification (never per layer): the draft rows and their parent rows
(the gate), the fold-chain ancestors of every row (source resolution), RoPE tables per row, and
each segment's bounds.

Gate points. A gate compares every draft row with its parent row (rho <= delta folds; roots always
recompute) and compacts the result into a ``RowSet`` (packed recomputed rows, folded rows, each
row's source = nearest recomputed ancestor in its own forward's branch tree). Compacting reads the
per-segment counts in one list: one host sync per gate point. There is one gate point per layer,
on the post-attention residual: it decides which rows recompute this layer's FFN *and* the next
layer's q/k/v (the residual a row adds its source's FFN output to differs from its parent's by
exactly the post-attention difference, so the decision carries); only layer 0 also gates its input
(the embeddings). A verification of L layers makes L + 1 syncs.

Per layer, ``packed_fold_layer``:

1. (layer 0 only) gates the input;
2. runs norm + fused q/k/v + RoPE on the packed recomputed rows of all forwards at once;
3. per segment, against its own prefix and window mask: dense attention if the segment recomputes
   every row; else on triton ``streaming_attention`` on its recomputed rows and
   ``folded_correction`` on its folded rows, on torch ``inherit_attention`` for all its rows;
4. ``o_proj`` on all rows, then the gate on the post-attention residual, the packed FFN of all
   forwards at once, and every row adds its source row's FFN output to its own residual.

Invariants.
- Folding never crosses forwards: parents, ancestors and sources of a row are rows of its own
  segment; attention of a segment reads only its own rows' K/V and its own prefix.
- A layer where nothing folds runs the dense computation on all rows (no gathers, no correction).
- Gate, compaction and source resolution are flat index ops over all segments (both backends); the
  backend's kernels do the heavy pieces (QKV, attention, correction, FFN) with the twin signatures.
- delta = 0 folds only bit-identical rows, so the result equals dense verification up to rounding:
  a row whose post-attention residual equals its parent's bit for bit gets the same FFN output and
  so the same next-layer input, whose q/k/v it then inherits.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch
from torch import Tensor

from specfold.kernels.backends import get_backend
from specfold.kernels.fold_common import (GATE_EPS, LayerFoldStats, LayerWeights, check_parents, moe_ffn, rms_norm,
                                          rotate_half)
from specfold.kernels.fold_torch import dense_attention, fused_qkv_rope, inherit_attention
from specfold.models.forward import upload


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
            check_parents(s.par, s.B1)
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
        # ancestors [T, depth] (flat rows), padded with the root row of the same position
        anc = []
        for s, chains in zip(segments, chains_of):
            for c in chains:
                c = c + [0] * (depth - len(c))
                for n in range(s.N):
                    anc.extend(s.offset + b * s.N + n for b in c)
        last = [s.offset + s.size - 1 for s in segments]
        self.draft_rows, self.parent_rows, anc_flat, self.last = _upload([dr, pr, anc, last], device)
        self.anc = anc_flat.view(self.T, depth)
        self.cos = torch.cat([c.repeat(s.B1, 1) for c, s in zip(cos, segments)])  # [T, D]
        self.sin = torch.cat([c.repeat(s.B1, 1) for c, s in zip(sin, segments)])
        self.has_drafts = bool(dr)
        self.syncs = 0  # host syncs made by select (one per gate point)

    # ------------------------------------------------------------------ per-layer index ops
    def gate(self, X: Tensor, delta: float) -> Tensor:
        """X [T, d] -> recompute [T] bool: roots always, a draft row iff rho > delta (as gate_compact)."""
        rec = torch.ones(self.T, dtype=torch.bool, device=X.device)
        if not self.has_drafts:
            return rec
        acc = torch.promote_types(X.dtype, torch.float32)
        par = X.index_select(0, self.parent_rows).to(acc)
        num = torch.linalg.vector_norm(X.index_select(0, self.draft_rows).to(acc) - par, dim=-1)
        den = torch.linalg.vector_norm(par, dim=-1).clamp_min(GATE_EPS)
        rec[self.draft_rows] = num / den > delta
        return rec

    def select(self, rec: Tensor) -> "RowSet":
        """rec [T] -> its RowSet: packed rows, folded rows, sources. Reads the per-segment counts
        (python ints) in one list: the host sync of a gate point, the only one it makes."""
        self.syncs += 1
        cs = rec.cumsum(0)
        ends = cs[self.last].tolist()
        R = ends[-1]
        if R == self.T:
            return self.everything(rec.device)
        rows = _nonzero(rec, R)
        folded = _nonzero(~rec, self.T - R)
        row_of = torch.where(rec, cs - 1, torch.full_like(cs, -1))
        return RowSet(rows, folded, row_of, ends, self._resolve(rec))

    def everything(self, device: torch.device) -> "RowSet":
        """The RowSet where every row recomputes (no gate, no sync)."""
        rows = torch.arange(self.T, device=device)
        return RowSet(rows, rows[:0], rows, [s.offset + s.size for s in self.segments], rows)

    def _resolve(self, rec: Tensor) -> Tensor:
        """rec [T] -> src [T]: flat row of the nearest recomputed ancestor (self if recomputed)."""
        if self.anc.shape[1] == 1:
            return torch.arange(self.T, device=rec.device)
        first = rec[self.anc].to(torch.uint8).argmax(1, keepdim=True)
        return self.anc.gather(1, first).squeeze(1)


def _upload(parts: list[list[int]], device: torch.device) -> list[Tensor]:
    """Host index lists -> device tensors (views of one buffer): one host-to-device copy, from pinned
    memory on CUDA."""
    buf = upload([v for p in parts for v in p], device)
    out, o = [], 0
    for p in parts:
        out.append(buf[o: o + len(p)])
        o += len(p)
    return out


@dataclass(slots=True)
class RowSet:
    """The rows that recompute at one gate point, compacted (flat ids over all segments).

    rows [R] and folded [T-R] increasing; row_of [T] = packed id of a recomputed row, -1 if folded;
    ends = cumulative recomputed count at each segment's end (python ints); src [T] = nearest
    recomputed ancestor of every row (itself if recomputed); kv_row = row_of[src], the packed row
    whose q/k/v (or FFN output) each row uses."""

    rows: Tensor
    folded: Tensor
    row_of: Tensor
    ends: list[int]
    src: Tensor

    @property
    def complete(self) -> bool:
        return self.folded.numel() == 0

    @property
    def kv_row(self) -> Tensor:
        return self.row_of[self.src]

    def per_segment(self) -> list[int]:
        """Recomputed rows per segment."""
        return [e - b for e, b in zip(self.ends, [0] + self.ends[:-1])]


def _nonzero(mask: Tensor, count: int) -> Tensor:
    if hasattr(torch, "nonzero_static") and mask.device.type != "cpu":
        return torch.nonzero_static(mask, size=count).squeeze(1)  # no second sync on accelerators
    return mask.nonzero().squeeze(1)


def _ffn_all(X: Tensor, w: LayerWeights) -> Tensor:
    if w.moe is not None:
        return moe_ffn(X, None, w)
    x = rms_norm(X, w.post_norm_w, w.eps)
    gu = x @ w.fused_gate_up().t()
    F = w.w_gate.shape[0]
    return torch.nn.functional.silu(gu[:, :F]).mul_(gu[:, F:]) @ w.w_down.t()


def packed_fold_layer(
    X: Tensor, plan: PackPlan, w: LayerWeights, prefixes: list[tuple[Tensor, Tensor]], delta: float,
    scale: float, be: ModuleType, qkv: RowSet | None = None, ffn_gate: bool = True, need: Tensor | None = None,
) -> tuple[Tensor, list[LayerFoldStats], RowSet | None]:
    """One decoder layer over the packed rows of every segment -> X_out [T, d], stats per segment,
    and the RowSet of its post-attention gate (the next layer's ``qkv``; None without ``ffn_gate``).

    ``prefixes[s]`` = (K, V) [Hkv, P_s, D] of segment s's prefix cache at this layer. ``qkv``: the
    rows that recompute q/k/v here, carried from the previous layer's post-attention gate; None gates
    X itself (layer 0, or a layer on its own: one more sync).

    ``need`` (flat rows, increasing): the only rows of X_out the caller reads (the last layer: the
    head's rows). The FFN then runs only on the packed rows those rows take their FFN output from;
    the other rows of X_out hold their post-attention residual, not the layer's output. The gates,
    the attention and the statistics are those of the whole layer, so the rows in ``need`` get the
    values they get without it (up to float rounding of a GEMM over fewer rows).
    """
    if qkv is None:
        qkv = plan.select(plan.gate(X, delta))
    attn = _attention(X, plan, w, prefixes, scale, be, qkv)
    X_mid = torch.addmm(X, attn, w.wo.t()) if w.reduce is None else X + w.reduce(attn @ w.wo.t())
    ffn = plan.select(plan.gate(X_mid, delta)) if ffn_gate else qkv
    if need is not None and need.numel() == 0:
        X_out = X_mid
    elif need is not None:
        if ffn.complete:
            out = w.summed(_ffn_all(X_mid.index_select(0, need), w))
        else:  # each needed row's FFN source, computed once however many needed rows share it
            src, inv = torch.unique(ffn.kv_row.index_select(0, need), return_inverse=True)
            out = w.summed(be.packed_ffn(X_mid[None], ffn.rows.index_select(0, src), w)).index_select(0, inv)
        X_out = X_mid.index_copy_(0, need, X_mid.index_select(0, need) + out)
    elif ffn.complete:
        X_out = X_mid + w.summed(_ffn_all(X_mid, w))
    else:
        X_out = X_mid + w.summed(be.packed_ffn(X_mid[None], ffn.rows, w)).index_select(0, ffn.kv_row)
    stats = [LayerFoldStats(s.size - r, s.size - s.N, r, s.size - r2)
             for s, r, r2 in zip(plan.segments, qkv.per_segment(), ffn.per_segment())]
    return X_out, stats, (ffn if ffn_gate else None)


def _attention(X: Tensor, plan: PackPlan, w: LayerWeights, prefixes: list[tuple[Tensor, Tensor]],
               scale: float, be: ModuleType, qkv: RowSet) -> Tensor:
    """Norm + QKV on the recomputed rows, attention of every row (folded rows: inherited q/k/v,
    their own branch's K/V) -> [T, Hq*D]."""
    T, Hq, D = plan.T, w.num_heads, w.head_dim
    if qkv.complete:
        q, k, v = fused_qkv_rope(rms_norm(X, w.input_norm_w, w.eps), w, plan.cos, plan.sin)
        parts = [dense_attention(q[s.offset: s.offset + s.size].view(s.B1, s.N, Hq, D),
                                 k[s.offset: s.offset + s.size].view(s.B1, s.N, -1, D),
                                 v[s.offset: s.offset + s.size].view(s.B1, s.N, -1, D), *pre, s.mask,
                                 scale).view(s.size, Hq * D)
                 for s, pre in zip(plan.segments, prefixes)]
        return parts[0] if len(parts) == 1 else torch.cat(parts)
    rows, folded, src, kv_row = qkv.rows, qkv.folded, qkv.src, qkv.kv_row        # kv_row: [T] packed ids
    q, k, v = be.packed_norm_qkv_rope(X[None], rows, w, plan.cos, plan.sin)
    attn = X.new_empty(T, Hq, D)
    r0 = 0
    for s, (pk, pv), n_rec in zip(plan.segments, prefixes, qkv.per_segment()):
        t0, t1, r1 = s.offset, s.offset + s.size, r0 + n_rec
        qs, ks, vs = q[r0:r1], k[r0:r1], v[r0:r1]
        if n_rec == s.size:                                                        # nothing folded here
            attn[t0:t1] = dense_attention(qs.view(s.B1, s.N, Hq, D), ks.view(s.B1, s.N, -1, D),
                                          vs.view(s.B1, s.N, -1, D), pk, pv, s.mask, scale).view(s.size, Hq, D)
        elif not _use_correction(be):
            # every row's attention in the window layout, the prefix part once per recomputed row
            attn[t0:t1] = inherit_attention(qs, ks, vs, (kv_row[t0:t1] - r0).view(s.B1, s.N), pk, pv, s.mask,
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
    return attn.view(T, Hq * D)


# Folded rows' attention: the triton backend starts from the source's streaming state and corrects
# it (SPEC §6). The torch backend reuses the source's prefix state and computes the window part of
# every row directly (`inherit_attention`: the same result, with fewer and larger ops on a CPU);
# `TORCH_CORRECTS = True` makes it run the correction twins instead (tests check both paths).
TORCH_CORRECTS = False


def _use_correction(be: ModuleType) -> bool:
    return be.__name__.endswith("fold_triton") or TORCH_CORRECTS


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
    out, st, _ = packed_fold_layer(H.reshape(B1 * N, d), plan, w, [(prefix_k, prefix_v)], delta, scale, be,
                                   ffn_gate=ffn_gate)
    return out.view(B1, N, d), st[0]


__all__ = ["PackPlan", "RowSet", "Segment", "packed_fold_layer", "fold_layer_one"]


# ----------------------------------------------------------------------------------------------
# one forward: the per-layer entry points (the folded layer, and the dense reference)


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
    return fold_layer_one(H, par, w, cos, sin, prefix_k, prefix_v, window_mask, delta, scale,
                          get_backend(backend), ffn_gate)


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
    if w.moe is not None:
        return H_mid + moe_ffn(H_mid.reshape(B1 * N, d), None, w).view(B1, N, d)
    xf = rms_norm(H_mid, w.post_norm_w, w.eps)
    ffn = (torch.nn.functional.silu(xf @ w.w_gate.t()) * (xf @ w.w_up.t())) @ w.w_down.t()
    return H_mid + ffn
