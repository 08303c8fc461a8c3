"""Folded verification, PyTorch twins (float64): correction exactness and layer equivalence."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from fold_helpers import make_problem, make_weights, window_mask
from specfold.kernels import fold_pack as fp
from specfold.kernels import fold_torch as ft
from specfold.kernels.fold_torch import LayerWeights

# chains of depth >= 3 plus branching (a DAG flattened to a tree)
PARS = [
    [-1, 0, 1, 2, 3],            # one chain, depth 4
    [-1, 0, 0, 1, 2, 3, 4, 1],   # two chains + side branch
    [-1, 0],                     # single draft
]


# ---------------------------------------------------------------------------- gate / sources


def test_gate_folds_exact_copies_at_delta0_and_never_branch0() -> None:
    p = make_problem(0, PARS[1], N=9, fold_prob=0.5)
    rec, rho = ft.gate_compact(p.H, p.par, 0.0)
    assert rec[0].all() and torch.isinf(rho[0]).all()
    for i in range(1, len(PARS[1])):
        same = (p.H[i] == p.H[PARS[1][i]]).all(-1)
        assert torch.equal(~rec[i], same)
    # delta > 0: fold iff rho <= delta, rho is the relative residual
    p2 = make_problem(1, PARS[1], N=9, fold_prob=0.5, tiny=0.05)
    rec2, rho2 = ft.gate_compact(p2.H, p2.par, 0.1)
    i, n = 3, 4
    ref = (p2.H[i, n] - p2.H[PARS[1][i], n]).norm() / p2.H[PARS[1][i], n].norm()
    assert rho2[i, n].item() == pytest.approx(ref.item(), rel=1e-5)
    assert torch.equal(rec2[1:], rho2[1:] > 0.1)


def test_gate_zero_parent_no_nan() -> None:
    H = torch.zeros(3, 2, 4, dtype=torch.float64)
    H[2, 1, 0] = 1.0
    rec, rho = ft.gate_compact(H, torch.tensor([-1, 0, 1]), 0.0)
    assert not torch.isnan(rho).any()
    assert rec.tolist() == [[True, True], [False, False], [False, True]]


def test_bad_par_rejected() -> None:
    H = torch.zeros(3, 2, 4)
    with pytest.raises(ValueError):
        ft.gate_compact(H, torch.tensor([-1, 2, 0]), 0.0)
    with pytest.raises(ValueError):
        ft.gate_compact(H, torch.tensor([0, 0, 1]), 0.0)


def test_resolve_sources_and_compaction() -> None:
    par = torch.tensor([-1, 0, 1, 2, 1])
    rec = torch.tensor([
        [1, 1, 1, 1],
        [0, 1, 0, 1],
        [0, 0, 1, 1],
        [0, 0, 0, 0],
        [1, 0, 0, 0],
    ], dtype=torch.bool)
    src = ft.resolve_sources(rec, par)
    assert src.tolist() == [
        [0, 0, 0, 0],
        [0, 1, 0, 1],
        [0, 1, 2, 2],
        [0, 1, 2, 2],   # chain 3 -> 2 -> 1 -> 0
        [4, 1, 0, 1],
    ]
    rows, folded, row_of = ft.compact_rows(rec)
    flat = rec.reshape(-1)
    assert rows.tolist() == [r for r in range(20) if flat[r]]
    assert folded.tolist() == [r for r in range(20) if not flat[r]]
    assert row_of.reshape(-1)[rows].tolist() == list(range(len(rows)))
    assert (row_of.reshape(-1)[folded] == -1).all()


# ---------------------------------------------------------------------------- attention


def _direct_attention(q: Tensor, keys: Tensor, vals: Tensor, scale: float) -> Tensor:
    """q [Hq, D], keys/vals [L, Hkv, D] -> softmax(q k^T * scale) v  [Hq, D] (GQA by repeat)."""
    G = q.shape[0] // keys.shape[1]
    k = keys.repeat_interleave(G, dim=1)
    v = vals.repeat_interleave(G, dim=1)
    s = torch.einsum("hd,lhd->hl", q, k) * scale
    return torch.einsum("hl,lhd->hd", s.softmax(-1), v)


def _random_state(seed: int, par: list[int], N: int, Hq: int, Hkv: int, D: int, P: int, how: str, mask_kind: str):
    g = torch.Generator().manual_seed(seed)
    B1 = len(par)
    rec = torch.rand(B1, N, generator=g) < 0.45
    if how == "all_folded":
        rec[:] = False
    elif how == "none_folded":
        rec[:] = True
    rec[0] = True
    rows, folded, row_of = ft.compact_rows(rec)
    src = ft.resolve_sources(rec, torch.tensor(par))
    kv_row = row_of.gather(0, src)
    R = rows.shape[0]
    q = torch.randn(R, Hq, D, generator=g, dtype=torch.float64) * 1.5
    k = torch.randn(R, Hkv, D, generator=g, dtype=torch.float64)
    v = torch.randn(R, Hkv, D, generator=g, dtype=torch.float64)
    pk = torch.randn(Hkv, P, D, generator=g, dtype=torch.float64)
    pv = torch.randn(Hkv, P, D, generator=g, dtype=torch.float64)
    M = window_mask(mask_kind, N, g, sub=2)
    return rec, rows, folded, src, kv_row, q, k, v, pk, pv, M


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("N", [5, 13])
@pytest.mark.parametrize("how", ["mixed", "all_folded", "none_folded"])
@pytest.mark.parametrize("mask_kind", ["full", "block", "random"])
@pytest.mark.parametrize("par", PARS[:2])
@pytest.mark.parametrize("heads", [(4, 2, 8), (3, 3, 6), (6, 1, 5)])  # (Hq, Hkv, D): GQA, MHA, MQA
def test_corrected_attention_equals_branch_attention(seed, N, how, mask_kind, par, heads) -> None:
    Hq, Hkv, D = heads
    P = 3 + seed * 8  # 3, 11
    rec, rows, folded, src, kv_row, q, k, v, pk, pv, M = _random_state(seed, par, N, Hq, Hkv, D, P, how, mask_kind)
    scale = 1 / math.sqrt(D)
    O, m, Z = ft.streaming_attention(q, k, v, rows, kv_row, pk, pv, M, scale)
    # recomputed rows: exact attention over the prefix + own branch window K/V
    for r, row in enumerate(rows.tolist()):
        i, n = divmod(row, N)
        js = M[n].nonzero().squeeze(1)
        keys = torch.cat((pk.transpose(0, 1), k[kv_row[i, js]]))
        vals = torch.cat((pv.transpose(0, 1), v[kv_row[i, js]]))
        torch.testing.assert_close(O[r] / Z[r][:, None], _direct_attention(q[r], keys, vals, scale), rtol=1e-12, atol=1e-12)
    Of, mf, Zf = ft.folded_correction(q, k, v, O, m, Z, folded, src, kv_row, M, scale)
    assert Of.shape == (folded.shape[0], Hq, D)
    if how == "none_folded":
        assert folded.numel() == 0
    n_corrected = 0
    for f, row in enumerate(folded.tolist()):
        i, n = divmod(row, N)
        s = int(src[i, n])
        assert s != i and not rec[i, n] and rec[s, n]
        qf = q[kv_row[i, n]]  # inherited query
        js = M[n].nonzero().squeeze(1)
        keys = torch.cat((pk.transpose(0, 1), k[kv_row[i, js]]))
        vals = torch.cat((pv.transpose(0, 1), v[kv_row[i, js]]))
        torch.testing.assert_close(Of[f] / Zf[f][:, None], _direct_attention(qf, keys, vals, scale), rtol=1e-10, atol=1e-11)
        # the running max is an upper bound of every visible score (no overflow in exp)
        G = Hq // Hkv
        scores = torch.einsum("hd,lhd->hl", qf, keys.repeat_interleave(G, dim=1)) * scale
        assert (mf[f] >= scores.amax(-1) - 1e-12).all()
        n_corrected += bool(((kv_row[i] != kv_row[s]) & M[n]).any())
    if how == "mixed" and len(par) > 4 and folded.numel():
        assert n_corrected > 0  # the test exercises the remove/add path, not only plain inheritance


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("how", ["mixed", "all_folded", "none_folded"])
@pytest.mark.parametrize("mask_kind", ["full", "block", "random"])
@pytest.mark.parametrize("heads", [(4, 2, 8), (6, 1, 5)])
@pytest.mark.parametrize("P", [0, 11])
def test_inherited_attention_equals_branch_attention(seed, how, mask_kind, heads, P) -> None:
    """The torch path: every row with its (inherited) q over the prefix and its own branch's K/V."""
    Hq, Hkv, D = heads
    N = 13
    _rec, _rows, _folded, _src, kv_row, q, k, v, pk, pv, M = _random_state(seed, PARS[1], N, Hq, Hkv, D, P, how,
                                                                          mask_kind)
    scale = 1 / math.sqrt(D)
    out = ft.inherit_attention(q, k, v, kv_row, pk, pv, None if mask_kind == "full" else M, scale)
    assert out.shape == (kv_row.numel(), Hq * D)
    for i in range(kv_row.shape[0]):
        for n in range(N):
            js = M[n].nonzero().squeeze(1)
            keys = torch.cat((pk.transpose(0, 1), k[kv_row[i, js]]))
            vals = torch.cat((pv.transpose(0, 1), v[kv_row[i, js]]))
            ref = _direct_attention(q[kv_row[i, n]], keys, vals, scale)
            torch.testing.assert_close(out[i * N + n].view(Hq, D), ref, rtol=1e-12, atol=1e-12)


def test_correction_with_dominant_removed_key() -> None:
    """The removed key carries almost all the mass (large score). Removal is a subtraction, so the
    documented accuracy is eps * Z_source / Z_kept (absolute accuracy of the source's Z): check it."""
    N, Hq, Hkv, D = 3, 2, 1, 4
    rec = torch.tensor([[1, 1, 1], [0, 1, 0]], dtype=torch.bool)
    rows, folded, row_of = ft.compact_rows(rec)
    src = ft.resolve_sources(rec, torch.tensor([-1, 0]))
    kv_row = row_of.gather(0, src)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(rows.shape[0], Hq, D, generator=g, dtype=torch.float64)
    k = torch.randn(rows.shape[0], Hkv, D, generator=g, dtype=torch.float64)
    v = torch.randn(rows.shape[0], Hkv, D, generator=g, dtype=torch.float64)
    k[1] = q[0, 0][None] * 3.0   # branch 0's key at position 1 dominates row (0, 0) head 0
    pk = torch.randn(Hkv, 2, D, generator=g, dtype=torch.float64)
    pv = torch.randn(Hkv, 2, D, generator=g, dtype=torch.float64)
    M = torch.ones(N, N, dtype=torch.bool)
    O, m, Z = ft.streaming_attention(q, k, v, rows, kv_row, pk, pv, M, 1.0)
    Of, mf, Zf = ft.folded_correction(q, k, v, O, m, Z, folded, src, kv_row, M, 1.0)
    eps = torch.finfo(torch.float64).eps
    worst = 0.0
    for f, row in enumerate(folded.tolist()):
        i, n = divmod(row, N)
        r = int(kv_row[i, n])
        keys = torch.cat((pk.transpose(0, 1), k[kv_row[i]]))
        vals = torch.cat((pv.transpose(0, 1), v[kv_row[i]]))
        kept = torch.cat((pk.transpose(0, 1), k[kv_row[0, :1]], k[kv_row[0, 2:]]))  # keys branch 1 shares with 0
        s_kept = torch.einsum("hd,lhd->hl", q[r], kept.repeat_interleave(Hq // Hkv, dim=1))
        amplification = (Z[r] / torch.exp(s_kept - m[r][:, None]).sum(-1)).max().item()
        worst = max(worst, amplification)
        err = (Of[f] / Zf[f][:, None] - _direct_attention(q[r], keys, vals, 1.0)).abs().max().item()
        assert err <= 64 * eps * amplification
    assert worst > 1e6  # the case really is ill-conditioned


# ---------------------------------------------------------------------------- whole layer


def reference_folded_layer(p, delta: float, ffn_gate: bool = True) -> Tensor:
    """One layer with the QKV gate on its own input (layer 0, or ``fold_layer`` alone)."""
    return _reference_layer(p, p.H, p.w, p.prefix_k, p.prefix_v, None, delta, ffn_gate)[0]


def _reference_layer(p, H, w, prefix_k, prefix_v, rec, delta: float, ffn_gate: bool = True):
    """Folding semantics written directly: dense q/k/v/FFN, then every (i, n) takes q/k/v of
    (src[i, n], n), attention per branch over its own effective K/V; the FFN output comes from the
    source under the second gate on H_mid (or the QKV-gate source if not ffn_gate). ``rec``: the
    QKV rows carried from the layer before (None: gate H). -> (H_out, the post-attention rec)."""
    B1, N, d = H.shape
    if rec is None:
        rec, _ = ft.gate_compact(H, p.par, delta)
    src = ft.resolve_sources(rec, p.par)
    all_rows = torch.arange(B1 * N)
    q, k, v = ft.packed_norm_qkv_rope(H, all_rows, w, p.cos, p.sin)      # dense, [B1*N, h, D]
    eff = (src * N + torch.arange(N)).reshape(-1)                         # [B1*N] flat source row
    q, k, v = q[eff].view(B1, N, -1, w.head_dim), k[eff].view(B1, N, -1, w.head_dim), v[eff].view(B1, N, -1, w.head_dim)
    out = torch.empty(B1, N, w.num_heads, w.head_dim, dtype=H.dtype)
    for i in range(B1):
        for n in range(N):
            js = p.mask[n].nonzero().squeeze(1)
            keys = torch.cat((prefix_k.transpose(0, 1), k[i, js]))
            vals = torch.cat((prefix_v.transpose(0, 1), v[i, js]))
            out[i, n] = _direct_attention(q[i, n], keys, vals, p.scale)
    H_mid = H + out.reshape(B1, N, -1) @ w.wo.t()
    rec2 = ft.gate_compact(H_mid, p.par, delta)[0] if ffn_gate else rec
    eff2 = (ft.resolve_sources(rec2, p.par) * N + torch.arange(N)).reshape(-1)
    ffn = ft.packed_ffn(H_mid, all_rows, w)[eff2].view(B1, N, d)
    return H_mid + ffn, rec2


LAYER_CASES = [
    dict(par=PARS[0], N=5, mask_kind="full", bias=True, qk_norm=False),
    dict(par=PARS[1], N=13, mask_kind="block", bias=False, qk_norm=True),
    dict(par=PARS[1], N=5, mask_kind="random", bias=True, qk_norm=True, Hq=6, Hkv=2),
    dict(par=PARS[2], N=13, mask_kind="full", bias=False, qk_norm=False, Hq=3, Hkv=1),
]


@pytest.fixture(params=["inherit", "correction"])
def attention_path(request, monkeypatch):
    """fold_layer's two attention paths for folded rows on torch (fold_pack.TORCH_CORRECTS picks one)."""
    from specfold.kernels import fold_pack

    monkeypatch.setattr(fold_pack, "TORCH_CORRECTS", request.param == "correction")
    return request.param


@pytest.mark.parametrize("case", LAYER_CASES)
@pytest.mark.parametrize("fold_prob", [0.0, 0.6, 1.0])
def test_fold_layer_delta0_equals_dense(case, fold_prob, attention_path) -> None:
    p = make_problem(7, fold_prob=fold_prob, **case)
    dense = fp.dense_layer(p.H, p.w, p.cos, p.sin, p.prefix_k, p.prefix_v, p.mask, p.scale)
    out, stats = fp.fold_layer(p.H, p.par, p.w, p.cos, p.sin, p.prefix_k, p.prefix_v, p.mask, 0.0, p.scale)
    assert (out - dense).abs().max().item() <= 1e-10
    assert stats.draft_positions == (len(case["par"]) - 1) * case["N"]
    if fold_prob == 1.0:
        assert stats.folded == stats.draft_positions and stats.fold_ratio == 1.0
    if fold_prob == 0.0:
        assert stats.folded == 0
    assert stats.recomputed_rows == len(case["par"]) * case["N"] - stats.folded


def test_fold_ratio_undefined_without_drafts() -> None:
    p = make_problem(2, [-1], N=5)
    out, stats = fp.fold_layer(p.H, p.par, p.w, p.cos, p.sin, p.prefix_k, p.prefix_v, p.mask, 0.1, p.scale)
    dense = fp.dense_layer(p.H, p.w, p.cos, p.sin, p.prefix_k, p.prefix_v, p.mask, p.scale)
    assert (out - dense).abs().max().item() <= 1e-10
    assert stats.draft_positions == 0 and stats.fold_ratio is None and stats.ffn_fold_ratio is None


def test_resolve_sources_with_prebuilt_ancestors() -> None:
    par = torch.tensor([-1, 0, 1, 2, 1, 0])
    anc = ft.ancestors(par)
    assert anc.tolist() == [[0, 0, 0, 0], [1, 0, 0, 0], [2, 1, 0, 0], [3, 2, 1, 0], [4, 1, 0, 0], [5, 0, 0, 0]]
    g = torch.Generator().manual_seed(5)
    for _ in range(5):
        rec = torch.rand(6, 7, generator=g) < 0.4
        rec[0] = True
        src = ft.resolve_sources(rec, par, anc)
        assert torch.equal(src, ft.resolve_sources(rec, par))
        for i in range(6):  # the definition: nearest recomputed ancestor on the chain
            for n in range(7):
                a = i
                while not rec[a, n]:
                    a = int(par[a])
                assert src[i, n] == a


def test_fused_weights_follow_replaced_tensors() -> None:
    p = make_problem(3, PARS[0])
    w = p.w
    wqkv, b = w.fused_qkv()
    assert torch.equal(wqkv, torch.cat((w.wq, w.wk, w.wv))) and torch.equal(b, torch.cat((w.bq, w.bk, w.bv)))
    assert w.fused_qkv()[0] is wqkv  # cached
    w.wk = w.wk * 2
    assert torch.equal(w.fused_qkv()[0][w.wq.shape[0]: w.wq.shape[0] + w.wk.shape[0]], w.wk)
    assert torch.equal(w.fused_gate_up(), torch.cat((w.w_gate, w.w_up)))


@pytest.mark.parametrize("case", LAYER_CASES[:2])
def test_fold_layer_without_ffn_gate_is_inexact_at_delta0(case, attention_path) -> None:
    """Inheriting the FFN output with the QKV-gate decision alone is not exact (hence ffn_gate)."""
    p = make_problem(7, fold_prob=0.6, **case)
    dense = fp.dense_layer(p.H, p.w, p.cos, p.sin, p.prefix_k, p.prefix_v, p.mask, p.scale)
    out, stats = fp.fold_layer(p.H, p.par, p.w, p.cos, p.sin, p.prefix_k, p.prefix_v, p.mask, 0.0, p.scale, ffn_gate=False)
    assert stats.ffn_folded == stats.folded > 0
    assert (out - reference_folded_layer(p, 0.0, ffn_gate=False)).abs().max().item() <= 1e-10
    assert (out - dense).abs().max().item() > 1e-6


@pytest.mark.parametrize("case", LAYER_CASES)
@pytest.mark.parametrize("delta", [0.05, 0.2])
def test_fold_layer_delta_positive(case, delta, attention_path) -> None:
    p = make_problem(11, fold_prob=0.7, tiny=0.1, **case)
    dense = fp.dense_layer(p.H, p.w, p.cos, p.sin, p.prefix_k, p.prefix_v, p.mask, p.scale)
    out, stats = fp.fold_layer(p.H, p.par, p.w, p.cos, p.sin, p.prefix_k, p.prefix_v, p.mask, delta, p.scale)
    rec, rho = ft.gate_compact(p.H, p.par, delta)
    assert stats.folded == int((~rec).sum())
    # the folding semantics exactly
    ref = reference_folded_layer(p, delta)
    assert (out - ref).abs().max().item() <= 1e-10
    # branch 0 (all recomputed, own K/V) is exact
    assert (out[0] - dense[0]).abs().max().item() <= 1e-10
    # drafts with nothing folded at all see only recomputed keys: exact too
    src = ft.resolve_sources(rec, p.par)
    for i in range(1, len(case["par"])):
        if (src[i] == i).all():
            assert (out[i] - dense[i]).abs().max().item() <= 1e-10
    # folding only approximates: the approximation error is visible and bounded by the perturbation
    if stats.folded:
        err = (out - dense).norm(dim=-1) / dense.norm(dim=-1)
        assert err.max().item() > 1e-8
        assert err.max().item() < 0.5


def _two_layers(seed: int, mask_kind: str, tiny: float):
    p = make_problem(seed, PARS[1], N=13, fold_prob=0.7, tiny=tiny, mask_kind=mask_kind)
    g = torch.Generator().manual_seed(seed + 100)
    w2 = make_weights(g, p.H.shape[-1], 4, 2, 8, 40, bias=True, qk_norm=False)
    pk2, pv2 = torch.randn(p.prefix_k.shape, generator=g, dtype=torch.float64), torch.randn(
        p.prefix_v.shape, generator=g, dtype=torch.float64)
    return p, [(p.w, p.prefix_k, p.prefix_v), (w2, pk2, pv2)]


def _stack(p, layers, delta: float, be):
    from specfold.kernels.fold_pack import PackPlan, Segment, packed_fold_layer
    B1, N, d = p.H.shape
    plan = PackPlan([Segment(B1, N, p.par.tolist(), p.mask)], [p.cos], [p.sin], p.H.device)
    X, carried, stats = p.H.reshape(B1 * N, d), None, []
    for w, pk, pv in layers:
        X, st, carried = packed_fold_layer(X, plan, w, [(pk, pv)], delta, p.scale, be, qkv=carried)
        stats.append(st[0])
    return X.view(B1, N, d), stats, plan.syncs


@pytest.mark.parametrize("delta,mask_kind,tiny", [(0.0, "block", 0.0), (0.2, "full", 0.1), (0.2, "block", 0.1)])
def test_stacked_layers_carry_the_post_attention_gate(delta, mask_kind, tiny, attention_path) -> None:
    """In a stack, layer l+1's q/k/v rows are layer l's post-attention gate (one sync per layer,
    plus layer 0's input gate), and the result is that semantics exactly; at delta = 0, dense."""
    p, layers = _two_layers(21, mask_kind, tiny)
    out, stats, syncs = _stack(p, layers, delta, ft)
    assert syncs == len(layers) + 1
    H, rec = p.H, None
    for w, pk, pv in layers:
        H, rec = _reference_layer(p, H, w, pk, pv, rec, delta)
    assert (out - H).abs().max().item() <= 1e-10
    # the carried decision: layer 1 folds at QKV exactly the draft rows that inherited layer 0's FFN
    assert stats[1].folded == stats[0].ffn_folded > 0
    if delta == 0.0:
        dense = p.H
        for w, pk, pv in layers:
            dense = fp.dense_layer(dense, w, p.cos, p.sin, pk, pv, p.mask, p.scale)
        assert (out - dense).abs().max().item() <= 1e-10


def test_layer_weights_validation_and_from_layer() -> None:
    class Lin:
        def __init__(self, o: int, i: int, b: bool) -> None:
            self.weight = torch.randn(o, i)
            self.bias = torch.randn(o) if b else None

    class Norm:
        def __init__(self, k: int) -> None:
            self.weight, self.eps = torch.ones(k), 1e-5

    class Layer:
        input_norm, post_norm = Norm(16), Norm(16)
        q_proj, k_proj, v_proj = Lin(16, 16, True), Lin(8, 16, True), Lin(8, 16, True)
        q_norm, k_norm = Norm(4), None
        o_proj = Lin(16, 16, False)
        gate_proj, up_proj, down_proj = Lin(20, 16, False), Lin(20, 16, False), Lin(16, 20, False)

    w = LayerWeights.from_layer(Layer(), head_dim=4)
    assert (w.num_heads, w.num_kv_heads, w.eps) == (4, 2, 1e-5)
    assert w.bq is not None and w.k_norm_w is None
    with pytest.raises(ValueError):
        LayerWeights.from_layer(Layer(), head_dim=3)


@pytest.mark.slow
def test_triton_backend_importable_without_triton() -> None:
    """fold_triton imports with triton unavailable and fails with a clear error when called."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['triton'] = None; sys.modules['triton.language'] = None\n"
        "import torch\n"
        "from specfold.kernels import get_backend\n"
        "fx = get_backend('triton')\n"
        "assert not fx.HAS_TRITON\n"
        "try:\n"
        "    fx.compact_rows(torch.ones(2, 3, dtype=torch.bool))\n"
        "except RuntimeError as e:\n"
        "    assert 'triton' in str(e); print('ok')\n"
    )
    env = {**__import__("os").environ, "PYTHONPATH": str(__import__("pathlib").Path(__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr
