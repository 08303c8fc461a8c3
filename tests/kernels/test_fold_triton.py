"""Every Triton fold kernel equals its PyTorch twin (TRITON_INTERPRET=1 on the CPU, float32).

conftest.py sets TRITON_INTERPRET=1 when there is no GPU, before fold_triton is imported. Skipped
cleanly where triton is not installed.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

triton = pytest.importorskip("triton")

from fold_helpers import make_problem  # noqa: E402
from specfold.kernels import fold_pack as fp
from specfold.kernels import fold_torch as ft  # noqa: E402
from specfold.kernels import fold_triton as fx  # noqa: E402
from specfold.kernels import get_backend  # noqa: E402

pytestmark = pytest.mark.slow  # Triton in interpreter mode on the CPU

DEV = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
TOL = dict(rtol=2e-4, atol=2e-5)
PAR = [-1, 0, 1, 2, 1, 0]   # chain of depth 3 plus side branches


def _problem(seed: int, **kw):
    p = make_problem(seed, PAR, dtype=torch.float32, **kw)
    for f in ("H", "par", "cos", "sin", "prefix_k", "prefix_v", "mask"):
        setattr(p, f, getattr(p, f).to(DEV))
    for f in p.w.__slots__:
        t = getattr(p.w, f)
        if isinstance(t, torch.Tensor):
            setattr(p.w, f, t.to(DEV))
    return p


def test_backend_registry() -> None:
    assert get_backend("triton") is fx and get_backend("torch") is ft
    with pytest.raises(ValueError, match="torch, triton"):
        get_backend("cuda")


@pytest.mark.parametrize("delta", [0.0, 0.1])
def test_gate_compact_and_sources(delta: float) -> None:
    p = _problem(0, N=13, fold_prob=0.6, tiny=0.08 if delta else 0.0)
    rec_t, rho_t = ft.gate_compact(p.H, p.par, delta)
    rec_x, rho_x = fx.gate_compact(p.H, p.par, delta)
    assert torch.isinf(rho_x[0]).all()
    torch.testing.assert_close(rho_x[1:], rho_t[1:], **TOL)
    clear = (rho_t - delta).abs() > 1e-4            # rows not on the threshold
    assert torch.equal(rec_x[clear], rec_t[clear])
    assert (~rec_t).any() and rec_t[1:].any()      # both outcomes present
    for a, b in zip(fx.compact_rows(rec_t), ft.compact_rows(rec_t)):
        assert torch.equal(a, b)
    assert torch.equal(fx.resolve_sources(rec_t, p.par), ft.resolve_sources(rec_t, p.par))


def test_compaction_edge_cases() -> None:
    for rec in (torch.ones(3, 4, dtype=torch.bool), torch.zeros(3, 4, dtype=torch.bool).index_fill_(0, torch.tensor([0]), True)):
        rec = rec.to(DEV)
        for a, b in zip(fx.compact_rows(rec), ft.compact_rows(rec)):
            assert torch.equal(a, b)
        par = torch.tensor([-1, 0, 1], device=DEV)
        assert torch.equal(fx.resolve_sources(rec, par), ft.resolve_sources(rec, par))


def _state(p, delta: float = 0.0):
    rec, _ = ft.gate_compact(p.H, p.par, delta)
    rows, folded, row_of = ft.compact_rows(rec)
    src = ft.resolve_sources(rec, p.par)
    return rows, folded, src, row_of.gather(0, src)


@pytest.mark.parametrize("bias,qk_norm,heads", [(True, False, (4, 2, 8)), (False, True, (6, 2, 16)), (True, True, (2, 1, 6))])
def test_packed_norm_qkv_rope(bias: bool, qk_norm: bool, heads) -> None:
    Hq, Hkv, D = heads
    p = _problem(1, N=5, d=40, Hq=Hq, Hkv=Hkv, D=D, bias=bias, qk_norm=qk_norm)
    rows, *_ = _state(p)
    for a, b in zip(fx.packed_norm_qkv_rope(p.H, rows, p.w, p.cos, p.sin), ft.packed_norm_qkv_rope(p.H, rows, p.w, p.cos, p.sin)):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("mask_kind,P,heads", [("full", 7, (4, 2, 8)), ("block", 40, (3, 1, 16)), ("random", 0, (2, 2, 8))])
def test_streaming_attention_and_correction(mask_kind: str, P: int, heads) -> None:
    Hq, Hkv, D = heads
    p = _problem(2, N=13, P=P, Hq=Hq, Hkv=Hkv, D=D, mask_kind=mask_kind, fold_prob=0.5)
    rows, folded, src, kv_row = _state(p)
    assert folded.numel() > 0
    q, k, v = ft.packed_norm_qkv_rope(p.H, rows, p.w, p.cos, p.sin)
    Ot, mt, Zt = ft.streaming_attention(q, k, v, rows, kv_row, p.prefix_k, p.prefix_v, p.mask, p.scale)
    Ox, mx, Zx = fx.streaming_attention(q, k, v, rows, kv_row, p.prefix_k, p.prefix_v, p.mask, p.scale)
    torch.testing.assert_close(mx, mt, **TOL)
    torch.testing.assert_close(Zx, Zt, **TOL)
    torch.testing.assert_close(Ox, Ot, **TOL)
    Oft, mft, Zft = ft.folded_correction(q, k, v, Ot, mt, Zt, folded, src, kv_row, p.mask, p.scale)
    Ofx, mfx, Zfx = fx.folded_correction(q, k, v, Ot, mt, Zt, folded, src, kv_row, p.mask, p.scale)
    torch.testing.assert_close(mfx, mft, **TOL)
    torch.testing.assert_close(Zfx, Zft, **TOL)
    torch.testing.assert_close(Ofx, Oft, **TOL)


@pytest.mark.parametrize("ffn", [40, 100])
def test_packed_ffn(ffn: int) -> None:
    p = _problem(3, N=5, d=36, F=ffn)
    rows, *_ = _state(p)
    torch.testing.assert_close(fx.packed_ffn(p.H, rows, p.w), ft.packed_ffn(p.H, rows, p.w), **TOL)


@pytest.mark.parametrize("delta", [0.0, 0.1])
def test_fold_layer_triton_equals_torch(delta: float) -> None:
    p = _problem(4, N=5, fold_prob=0.6, tiny=0.03 if delta else 0.0, qk_norm=True)
    args = (p.H, p.par, p.w, p.cos, p.sin, p.prefix_k, p.prefix_v, p.mask, delta, p.scale)
    out_t, st_t = fp.fold_layer(*args)
    out_x, st_x = fp.fold_layer(*args, backend="triton")
    torch.testing.assert_close(out_x, out_t, **TOL)
    assert st_x == st_t
    if delta == 0.0:
        dense = fp.dense_layer(p.H, p.w, p.cos, p.sin, p.prefix_k, p.prefix_v, p.mask, p.scale)
        torch.testing.assert_close(out_x, dense, **TOL)
    assert math.isfinite(st_x.fold_ratio)


def _stack(p, be, delta: float, layers: int = 2):
    """The verifier's layer loop on one forward: layer l+1's q/k/v rows carried from layer l."""
    from specfold.kernels.fold_pack import PackPlan, Segment, packed_fold_layer
    B1, N, d = p.H.shape
    plan = PackPlan([Segment(B1, N, p.par.tolist(), p.mask)], [p.cos], [p.sin], p.H.device)
    X, carried, stats = p.H.reshape(B1 * N, d), None, []
    for _ in range(layers):
        X, st, carried = packed_fold_layer(X, plan, p.w, [(p.prefix_k, p.prefix_v)], delta, p.scale, be,
                                           qkv=carried)
        stats.append(st[0])
    return X.view(B1, N, d), stats


@pytest.mark.parametrize("delta", [0.0, 0.1])
def test_stacked_layers_triton_equal_torch(delta: float) -> None:
    """The carried gate on the triton backend: the same rows fold and the same result as on torch."""
    p = _problem(6, N=8, fold_prob=0.9, tiny=0.03 if delta else 0.0, mask_kind="block")
    out_t, st_t = _stack(p, ft, delta)
    out_x, st_x = _stack(p, fx, delta)
    torch.testing.assert_close(out_x, out_t, **TOL)
    assert st_x == st_t and st_t[1].folded > 0
