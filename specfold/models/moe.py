"""Mixture-of-experts FFN with sigmoid, bias-corrected, group-limited routing (LLaDA2 / Ling-2.0,
the DeepSeek-V3 router; docs/LLADA2.md) and one shared expert, or with softmax routing (Qwen3-MoE,
SDAR-MoE: `route_softmax`, no groups, bias or shared expert).

Routing of a row h (the post-attention-normed hidden state), E experts in G groups, top-k:
    s = sigmoid(W_r h)                          [E]  selection scores
    c = s + b                                   [E]  b: per-expert bias, used for selection only
    group score = sum of the 2 largest c in the group; keep the `topk_groups` best groups
    experts = top-k of c over the kept groups (the others at -inf)
    weights = s[experts] / (sum s[experts] + 1e-20) (when k > 1), times `routed_scaling`
    out = sum_j weights_j SwiGLU_{e_j}(h) + SwiGLU_shared(h)

Softmax routing (`scoring="softmax"`): p = softmax(W_r h) over all E experts, experts = top-k of p,
weights = p[experts], divided by their sum only when `norm_topk_prob` (transformers' Qwen3MoE router).

Invariants:
- routing and the weighted sum run in float32 for 16-bit dtypes (the official code's router dtype;
  the softmax router's logits are the input dtype's, as Qwen3-MoE's, its softmax float32) and in the
  input dtype otherwise, so float64 runs are float64 end to end;
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


ROUTER_SCORINGS = ("sigmoid", "softmax")


def check_routing(num_experts: int, top_k: int, groups: int, topk_groups: int, scoring: str = "sigmoid") -> None:
    """ConfigError unless the router's shape is well formed. groups == topk_groups == 1: no groups
    (top-k over every expert), the only shape softmax routing has."""
    if scoring not in ROUTER_SCORINGS:
        raise ConfigError(f"router_scoring={scoring!r}; accepted: {ROUTER_SCORINGS}")
    if groups == 1 and topk_groups == 1:
        least = 2 if scoring == "sigmoid" else 1  # the sigmoid router's group score reads 2 experts
        if num_experts < least:
            raise ConfigError(f"num_experts={num_experts} must be >= {least}")
        if not 1 <= top_k <= num_experts:
            raise ConfigError(f"num_experts_per_tok={top_k} must be in [1, num_experts={num_experts}]")
        return
    if scoring == "softmax":
        raise ConfigError(f"softmax routing has no expert groups; got n_group={groups}, topk_group={topk_groups}")
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


def route_softmax(x: torch.Tensor, router: torch.Tensor, top_k: int, norm_topk_prob: bool
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-MoE routing: x [R, d] -> (experts [R, k] long, weights [R, k] in the router dtype): the
    top-k of softmax(x W_r^T) (logits in x's dtype, softmax in float32 for 16-bit dtypes),
    renormalised over the k only when `norm_topk_prob`."""
    rd = torch.float32 if x.dtype in _LOW else x.dtype
    probs = torch.softmax(F.linear(x, router.to(x.dtype)), dim=-1, dtype=rd)  # [R, E]
    weights, experts = probs.topk(top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(-1, keepdim=True)
    return experts, weights


def grouped_swiglu(xs: torch.Tensor, counts: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
                   w_down: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """xs [N, d] sorted by expert (`counts` [E] rows each); w_gate, w_up [E, I, d], w_down [E, d, I]
    -> [N, d]: row n goes through its expert's SwiGLU only. Rows past sum(counts) (pairs routed to
    another rank's experts) come back unspecified: the caller discards them."""
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
                 scaling: float, shared: int, router_bias: bool, *, experts: tuple[int, int] | None = None,
                 shared_inter: int | None = None, scoring: str = "sigmoid", norm_topk_prob: bool = True):
        """`experts` = [lo, hi): the experts this module holds (expert parallelism: a rank's share;
        default all); `inter` is each held expert's intermediate width (a tensor-parallel rank's
        slice), `shared_inter` the shared expert's (default inter x shared). `scoring`: "sigmoid"
        (`route`) or "softmax" (`route_softmax`, renormalised only when `norm_topk_prob`)."""
        super().__init__()
        check_routing(num_experts, top_k, groups, topk_groups, scoring)
        self.scoring, self.norm_topk_prob = scoring, norm_topk_prob
        self.top_k, self.groups, self.topk_groups, self.scaling = top_k, groups, topk_groups, scaling
        self.experts = experts if experts is not None else (0, num_experts)
        held = self.experts[1] - self.experts[0]
        self.router = nn.Parameter(torch.empty(num_experts, d))
        self.expert_bias = nn.Parameter(torch.zeros(num_experts)) if router_bias else None
        self.w_gate = nn.Parameter(torch.empty(held, inter, d))
        self.w_up = nn.Parameter(torch.empty(held, inter, d))
        self.w_down = nn.Parameter(torch.empty(held, d, inter))
        self.shared = SwiGLU(d, shared_inter or inter * shared) if shared else None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.scoring == "softmax":
            return route_softmax(x, self.router, self.top_k, self.norm_topk_prob)
        return route(x, self.router, self.expert_bias, self.top_k, self.groups, self.topk_groups,
                     self.scaling)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        shape = h.shape
        x = h.reshape(-1, shape[-1])
        experts, weights = self.route(x)  # [R, k]
        lo, hi = self.experts
        flat = experts.reshape(-1) - lo
        held = (flat >= 0) & (flat < hi - lo)  # pairs routed to an expert this module holds
        flat = torch.where(held, flat, hi - lo)  # the others sort last, past every held expert's rows
        order = torch.argsort(flat, stable=True)  # (row, slot) pairs grouped by expert
        counts = torch.bincount(flat, minlength=hi - lo + 1)[: hi - lo]
        ys = grouped_swiglu(x[order // self.top_k], counts, self.w_gate, self.w_up, self.w_down)
        per_slot = torch.empty_like(ys)
        per_slot[order] = ys
        if hi - lo < self.router.shape[0]:  # expert parallelism: the rows of other ranks' experts add 0
            per_slot = torch.where(held[:, None], per_slot, 0)
        routed = (per_slot.view(x.shape[0], self.top_k, -1).to(weights.dtype) * weights[..., None]).sum(1)
        out = routed.to(x.dtype)
        if self.shared is not None:
            out = out + self.shared(x)
        return out.view(shape)
