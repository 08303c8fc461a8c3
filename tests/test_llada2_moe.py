"""LLaDA2's MoE block (models/moe.py) against `transformers`' DeepSeek-V3 MoE, which uses the same
routing: sigmoid scores, a bias added for selection only, group score = sum of the 2 best biased
scores in the group, the best `topk_group` groups kept (others at -inf), top-k inside them, weights =
the unbiased scores renormalised (+1e-20) times `routed_scaling_factor`, plus shared experts.

What differs, and how the test handles it:
- names: DeepSeek-V3 calls the bias `e_score_correction_bias` and stores each expert's gate and up
  rows fused (`experts.gate_up_proj` [E, 2I, d], gate first); the test maps the weights;
- DeepSeek-V3 renormalises only under `norm_topk_prob`; LLaDA2's code renormalises whenever top-k > 1
  (its configs set norm_topk_prob true anyway): the test sets it true;
- transformers runs the router in float32 whatever the model dtype. For the float64 comparison the
  router's own source is re-executed with `torch.float32` replaced by the input dtype (no other
  change); the float32 comparison runs it unpatched;
- transformers loops over the experts hit and index-adds each one's weighted output; specfold sums
  the weighted slots per row: the same terms in another order.
"""
from __future__ import annotations

import pytest
import torch

from specfold.models import moe as moe_mod
from specfold.models.moe import MoE, grouped_swiglu
from tests.hf_reference import patched_forward


def _moe(E=16, k=3, G=4, kg=2, d=32, inter=16, seed=0, dtype=torch.float64) -> MoE:
    g = torch.Generator().manual_seed(seed)
    m = MoE(d, E, inter, k, G, kg, 2.5, 1, True)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
        m.expert_bias.copy_(0.1 * torch.randn(E, generator=g))
    return m.to(dtype)


def _deepseek(m: MoE, dtype):
    import transformers as tf
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
    E, inter, d = m.w_gate.shape
    cfg = tf.DeepseekV3Config(hidden_size=d, moe_intermediate_size=inter, n_routed_experts=E,
                              num_experts_per_tok=m.top_k, n_group=m.groups, topk_group=m.topk_groups,
                              n_shared_experts=1, routed_scaling_factor=m.scaling, norm_topk_prob=True,
                              num_attention_heads=4, num_key_value_heads=4)
    hf = DeepseekV3MoE(cfg)
    with torch.no_grad():
        hf.gate.weight.copy_(m.router)
        hf.gate.e_score_correction_bias.copy_(m.expert_bias)
        hf.experts.gate_up_proj.copy_(torch.cat([m.w_gate, m.w_up], dim=1))
        hf.experts.down_proj.copy_(m.w_down)
        for n in ("gate_proj", "up_proj", "down_proj"):
            getattr(hf.shared_experts, n).weight.copy_(getattr(m.shared, n).weight)
    return hf.to(dtype).eval()


def router_in_input_dtype():
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as mod
    return patched_forward(mod.DeepseekV3TopkRouter, "torch.float32", "hidden_states.dtype", 2, "deepseek_v3_router")


def _margins(m: MoE, x: torch.Tensor) -> float:
    """Smallest gap at the group cut and at the expert cut over the rows (float64)."""
    xd = x.double()
    s = torch.sigmoid(xd @ m.router.double().T) + m.expert_bias.double()
    R, E = s.shape
    gs = s.view(R, m.groups, E // m.groups).topk(2, -1).values.sum(-1).sort(-1, descending=True).values
    gap_g = (gs[:, m.topk_groups - 1] - gs[:, m.topk_groups]).min()
    kept = torch.zeros(R, m.groups, dtype=torch.bool)
    kept.scatter_(1, s.view(R, m.groups, -1).topk(2, -1).values.sum(-1).topk(m.topk_groups, -1).indices, True)
    c = s.masked_fill(~kept.repeat_interleave(E // m.groups, 1), float("-inf")).sort(-1, descending=True).values
    return min(gap_g.item(), (c[:, m.top_k - 1] - c[:, m.top_k]).min().item())


@pytest.mark.parametrize("shape", [dict(), dict(E=8, k=2, G=2, kg=1), dict(E=16, k=4, G=8, kg=3, seed=3)])
def test_moe_matches_deepseek_v3_float64(shape):
    m = _moe(**shape)
    x = torch.randn(2, 13, 32, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    assert _margins(m, x.view(-1, 32)) > 1e-6
    hf = _deepseek(m, torch.float64)
    with torch.no_grad(), router_in_input_dtype():
        ref = hf(x)
        _, w_hf, i_hf = hf.gate(x.view(-1, 32))
    idx, w = m.route(x.view(-1, 32))
    assert torch.equal(idx.sort(-1).values, i_hf.sort(-1).values)
    assert (w.sort(-1).values - w_hf.sort(-1).values).abs().max().item() <= 1e-14
    with torch.no_grad():
        assert (m(x) - ref).abs().max().item() <= 1e-12


def test_moe_matches_deepseek_v3_float32_unpatched():
    m = _moe(dtype=torch.float32)
    x = torch.randn(26, 32, generator=torch.Generator().manual_seed(2))
    assert _margins(m, x) > 1e-4  # far above float32 rounding, so the same experts are chosen
    hf = _deepseek(m, torch.float32)
    with torch.no_grad():
        assert (m(x) - hf(x)).abs().max().item() <= 1e-5


def test_grouped_gemm_and_expert_loop_agree():
    """Both backends of `grouped_swiglu` (torch's grouped GEMM runs on a CPU in float32), with empty
    experts in the middle and at the ends."""
    g = torch.Generator().manual_seed(4)
    E, inter, d = 6, 8, 16
    wg, wu, wd = (torch.randn(E, inter, d, generator=g), torch.randn(E, inter, d, generator=g),
                  torch.randn(E, d, inter, generator=g))
    counts = torch.tensor([0, 3, 0, 5, 1, 0])
    xs = torch.randn(int(counts.sum()), d, generator=g)
    loop = grouped_swiglu(xs, counts, wg, wu, wd, backend="loop")
    grouped = grouped_swiglu(xs, counts, wg, wu, wd, backend="grouped")
    per_row = torch.cat([torch.nn.functional.silu(xs[s:s + n] @ wg[e].T) * (xs[s:s + n] @ wu[e].T) @ wd[e].T
                         for e, n, s in zip(range(E), counts.tolist(), [0, 0, 3, 3, 8, 9]) if n])
    assert (loop - per_row).abs().max().item() <= 1e-4
    assert (grouped - loop).abs().max().item() <= 1e-4
    m = _moe(dtype=torch.float32)
    x = torch.randn(40, 32, generator=g)
    out = {}
    with torch.no_grad():
        for backend in ("grouped", "loop"):
            moe_mod.BACKEND = backend
            try:
                out[backend] = m(x)
            finally:
                moe_mod.BACKEND = "auto"
    assert (out["grouped"] - out["loop"]).abs().max().item() <= 1e-5
