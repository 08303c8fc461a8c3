"""Mixture-of-experts FFN with sigmoid, bias-corrected, group-limited routing (LLaDA2 / Ling-2.0,
the DeepSeek-V3 router; docs/LLADA2.md) and one shared expert.

Routing of a row h (the post-attention-normed hidden state), E experts in G groups, top-k:
    s = sigmoid(W_r h)                          [E]  selection scores
    c = s + b                                   [E]  b: per-expert bias, used for selection only
    group score = sum of the 2 largest c in the group; keep the `topk_groups` best groups
    experts = top-k of c over the kept groups (the others at -inf)
    weights = s[experts] / (sum s[experts] + 1e-20) (when k > 1), times `routed_scaling`
    out = sum_j weights_j SwiGLU_{e_j}(h) + SwiGLU_shared(h)

Invariants:
- routing and the weighted sum run in float32 for 16-bit dtypes (the official code's router dtype)
  and in the input dtype otherwise, so float64 runs are float64 end to end;
- the routed experts run as grouped GEMMs: the (row, expert) pairs are sorted by expert and each
  non-empty expert multiplies its contiguous slice once (`grouped_swiglu`: torch's grouped GEMM, or
  one GEMM per non-empty expert); no loop over rows and
  no evaluation of an expert on rows not routed to it. Rows of every branch and every request of a
  packed forward share those GEMMs (the caller packs them);
- ties in a top-k keep torch.topk's order (random float64 weights have none; the tests check the
  margins they rely on).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specfold.errors import ConfigError

_LOW = (torch.bfloat16, torch.float16)
# "auto": torch's grouped GEMM (one call per projection, no host read) in float32 and, on CUDA, in
# 16-bit; the per-expert loop otherwise (float64; 16-bit on a CPU, where the grouped GEMM needs
# 16-byte aligned strides). On a CPU both cost the same within 10% (BENCHMARKS.md).
# "grouped" / "loop" force one (the tests run both).
BACKEND = "auto"


def check_routing(num_experts: int, top_k: int, groups: int, topk_groups: int) -> None:
    """ConfigError unless the router's shape is well formed."""
    per = num_experts // max(groups, 1)
    if groups < 1 or num_experts % groups or per < 2:
        raise ConfigError(f"num_experts={num_experts} must split into n_group={groups} groups of >= 2 experts")
    if not 1 <= topk_groups <= groups:
        raise ConfigError(f"topk_group={topk_groups} must be in [1, n_group={groups}]")
    if not 1 <= top_k <= topk_groups * per:
        raise ConfigError(f"num_experts_per_tok={top_k} must be in [1, {topk_groups * per}] "
                          f"(the experts of the kept groups)")


class SwiGLU(nn.Module):
    def __init__(self, d: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(d, inter, bias=False)
        self.up_proj = nn.Linear(d, inter, bias=False)
        self.down_proj = nn.Linear(inter, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def route(x: torch.Tensor, router: torch.Tensor, bias: torch.Tensor | None, top_k: int, groups: int,
          topk_groups: int, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, d] -> (experts [R, k] long, weights [R, k] in the router dtype)."""
    rd = torch.float32 if x.dtype in _LOW else x.dtype
    scores = torch.sigmoid(F.linear(x.to(rd), router.to(rd)))  # [R, E]
    choice = scores if bias is None else scores + bias.to(rd)
    R, E = choice.shape
    best2 = choice.view(R, groups, E // groups).topk(2, dim=-1).values.sum(-1)  # [R, G]
    kept = torch.zeros(R, groups, dtype=torch.bool, device=x.device)
    kept.scatter_(1, best2.topk(topk_groups, dim=-1).indices, True)
    choice = choice.masked_fill(~kept.repeat_interleave(E // groups, dim=1), float("-inf"))
    experts = choice.topk(top_k, dim=-1).indices
    weights = scores.gather(1, experts)
    if top_k > 1:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return experts, weights * scaling


def grouped_swiglu(xs: torch.Tensor, counts: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
                   w_down: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """xs [N, d] sorted by expert (`counts` [E] rows each); w_gate, w_up [E, I, d], w_down [E, d, I]
    -> [N, d]: row n goes through its expert's SwiGLU only."""
    backend = backend or BACKEND
    if backend == "auto":
        grouped = xs.dtype == torch.float32 or (xs.is_cuda and xs.dtype in _LOW)
        backend = "grouped" if grouped else "loop"
    if backend == "grouped":
        offs = counts.cumsum(0).to(torch.int32)
        g = F.grouped_mm(xs, w_gate.transpose(1, 2), offs=offs)
        u = F.grouped_mm(xs, w_up.transpose(1, 2), offs=offs)
        return F.grouped_mm(F.silu(g) * u, w_down.transpose(1, 2), offs=offs)
    out = torch.empty_like(xs)
    start = 0
    for e, n in enumerate(counts.tolist()):  # one host read per layer; empty experts cost nothing
        if n:
            part = xs[start: start + n]
            out[start: start + n] = F.linear(F.silu(F.linear(part, w_gate[e])) * F.linear(part, w_up[e]),
                                             w_down[e])
            start += n
    return out


class MoE(nn.Module):
    """Routed experts (stacked weights) + shared expert; `forward(h)` takes the normed hidden state."""

    def __init__(self, d: int, num_experts: int, inter: int, top_k: int, groups: int, topk_groups: int,
                 scaling: float, shared: int, router_bias: bool):
        super().__init__()
        check_routing(num_experts, top_k, groups, topk_groups)
        self.top_k, self.groups, self.topk_groups, self.scaling = top_k, groups, topk_groups, scaling
        self.router = nn.Parameter(torch.empty(num_experts, d))
        self.expert_bias = nn.Parameter(torch.zeros(num_experts)) if router_bias else None
        self.w_gate = nn.Parameter(torch.empty(num_experts, inter, d))
        self.w_up = nn.Parameter(torch.empty(num_experts, inter, d))
        self.w_down = nn.Parameter(torch.empty(num_experts, d, inter))
        self.shared = SwiGLU(d, inter * shared) if shared else None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return route(x, self.router, self.expert_bias, self.top_k, self.groups, self.topk_groups,
                     self.scaling)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        shape = h.shape
        x = h.reshape(-1, shape[-1])
        experts, weights = self.route(x)  # [R, k]
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)  # (row, slot) pairs grouped by expert
        counts = torch.bincount(flat, minlength=self.router.shape[0])
        ys = grouped_swiglu(x[order // self.top_k], counts, self.w_gate, self.w_up, self.w_down)
        per_slot = torch.empty_like(ys)
        per_slot[order] = ys
        routed = (per_slot.view(x.shape[0], self.top_k, -1).to(weights.dtype) * weights[..., None]).sum(1)
        out = routed.to(x.dtype)
        if self.shared is not None:
            out = out + self.shared(x)
        return out.view(shape)
