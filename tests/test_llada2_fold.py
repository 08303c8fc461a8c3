"""SpecFold on LLaDA2's mixture-of-experts layers (float64, a random LLaDA2 checkpoint): δ = 0 gives
the dense verification's logits; a folded position reuses its source's whole MoE output (routed and
shared experts), so the experts run only on the recomputed rows; the triton backend's FFN falls back
to the same packed MoE on these layers."""
from __future__ import annotations

import pytest
import torch

from specfold.decoding.verify.dense import DenseVerifier
from specfold.decoding.verify.fold import FoldVerifier, layer_weights
from tests import llada2_checkpoint as C

N = 8  # block


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from specfold.models.loader import load_model
    folder, cfg, _ = C.make(tmp_path_factory.mktemp("l2fold") / "ckpt", seed=3, head_scale=4.0)
    m, spec, _ = load_model(folder, torch.float64, "cpu", overrides=C.overrides(cfg))
    assert spec.num_experts and any(layer.moe is not None for layer in m.layers)
    return m, spec


def _batch(M: int, V: int):
    """A root block with a prompt tail and masks, and a tree of drafts (depth 3 and a sibling)."""
    g = torch.Generator().manual_seed(0)
    root = torch.randint(0, V - 2, (N,), generator=g)
    root[3:] = M
    d1 = root.clone(); d1[3] = 7
    d2 = d1.clone(); d2[4] = 9
    d3 = d2.clone(); d3[6] = 2
    d4 = root.clone(); d4[5] = 11
    return torch.stack([root, d1, d2, d3, d4]), [-1, 0, 1, 2, 0]


def _verify(m, spec, verifier):
    toks, parents = _batch(spec.mask_token_id, spec.vocab_size)
    cache = m.new_cache(4 * N)
    g = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        pos = torch.arange(2 * N)
        blk = pos // N
        m(torch.randint(0, spec.vocab_size - 2, (1, 2 * N), generator=g), pos, cache=cache,
          mask=blk[:, None] >= blk[None, :], write_cache=True)  # two committed blocks
        return verifier(toks, parents, torch.arange(2 * N, 3 * N), cache, torch.ones(N, N, dtype=torch.bool),
                        torch.arange(N))


def test_delta_zero_equals_dense_on_moe_layers(model):
    m, spec = model
    dense = _verify(m, spec, DenseVerifier(m))
    fv = FoldVerifier(m, 0.0)
    folded = _verify(m, spec, fv)
    assert (folded - dense).abs().max().item() <= 1e-10
    assert fv.last_stats[0].report()["fold_ratio"] > 0  # identical embeddings were folded at the input gate
    loose = FoldVerifier(m, 0.5)
    approx = _verify(m, spec, loose)
    assert (approx[0] - dense[0]).abs().max().item() <= 1e-10  # the root always recomputes


@pytest.mark.parametrize("delta", [0.0, 0.05, 0.5])
def test_experts_run_only_on_recomputed_rows(model, delta):
    """Each MoE layer's experts see exactly the rows its post-attention gate recomputes; the folded
    ones add their source's MoE output."""
    m, spec = model
    seen: dict[int, int] = {}
    hooks = [layer.moe.register_forward_pre_hook(lambda mod, args, i=i: seen.__setitem__(i, args[0].shape[0]))
             for i, layer in enumerate(m.layers) if layer.moe is not None]
    try:
        fv = FoldVerifier(m, delta)
        _verify(m, spec, fv)
    finally:
        for h in hooks:
            h.remove()
    st = fv.last_stats[0]
    rows = 5 * N
    assert set(seen) == {i for i, layer in enumerate(m.layers) if layer.moe is not None}
    for i, n in seen.items():
        assert n == rows - st.ffn_folded[i], (i, n, st.ffn_folded)
    if delta == 0.5:
        assert sum(st.ffn_folded[i] for i in seen) > 0  # folding saved expert rows


def test_triton_ffn_falls_back_to_the_packed_moe(model):
    from specfold.kernels import fold_torch, fold_triton
    m, spec = model
    i = next(i for i, layer in enumerate(m.layers) if layer.moe is not None)
    w = layer_weights(m)[i]
    assert w.moe is m.layers[i].moe and w.w_gate is None
    H = torch.randn(3, N, spec.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    rows = torch.tensor([0, 2, 5, 9, 17, 23])
    want = m.layers[i].mlp(H.reshape(-1, spec.hidden_size)[rows])  # the model's own post-norm + MoE
    for be in (fold_torch, fold_triton):
        assert (be.packed_ffn(H, rows, w) - want).abs().max().item() <= 1e-12
