"""The native decoder-only transformer behind every family (no `trust_remote_code`).

RMSNorm, RoPE with absolute positions (full or partial), GQA, optional q/k/v bias, optional per-head
q/k norm, SwiGLU or a mixture of experts (models/moe.py: a layer that `spec.is_moe_layer` has `moe`
instead of gate/up/down_proj), tied or untied head. `forward` runs B branches of one window of T positions against one shared
prefix KV cache; `forward_many` runs several such `Forward`s (of different requests) in one call,
the position-wise work over their packed rows and attention per forward against its own cache;
`write_kv` writes a window's K/V from hidden states a forward returned (no forward):

    tokens [B, T]  positions [T]  mask [T, T] (window query x window key, True = may attend)
    every query also sees the whole cached prefix [0, P), gathered from its blocks (models/cache.py).

Invariants:
- the prefix cache is gathered from the paged pool at most once per forward and layer (into the
  attention's key buffer, models/attention.py: one gather per group of forwards), never per branch;
- `write_cache=True` (B == 1) appends the window's K/V after the forward: prefill and commit;
- `logits_at` selects window positions before the head (the head is the largest matmul of a small
  model's forward: compute it only where a rule reads);
- norms and softmax run in float32 for 16-bit dtypes and in the input dtype otherwise, so float64
  runs are float64 end to end.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specfold.models.attention import Group, attention
from specfold.models.forward import Forward, ForwardResult
from specfold.models.cache import PrefixCache
from specfold.models.moe import MoE
from specfold.models.parallel import ONE, Parallel, local_spec
from specfold.models.pool import BlockPool
from specfold.models.rope import Rope, apply_rope
from specfold.models.spec import ModelSpec

_LOW = (torch.bfloat16, torch.float16)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dt = x.dtype
        xf = x.float() if dt in _LOW else x
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dt)


class Layer(nn.Module):
    """One decoder layer of `s`'s shapes (a rank's shard under tensor parallelism: `s` is then the
    local spec); `tp_reduce` sums a partial output (o_proj's, the FFN's) over the ranks."""

    def __init__(self, s: ModelSpec, index: int = 0, par: Parallel = ONE):
        super().__init__()
        self.tp_reduce = par.reduce if par.size > 1 else None
        d, hd = s.hidden_size, s.head_dim
        self.input_norm = RMSNorm(d, s.rms_eps)
        self.q_proj = nn.Linear(d, s.num_heads * hd, bias=s.qkv_bias)
        self.k_proj = nn.Linear(d, s.num_kv_heads * hd, bias=s.qkv_bias)
        self.v_proj = nn.Linear(d, s.num_kv_heads * hd, bias=s.qkv_bias)
        self.q_norm = RMSNorm(hd, s.rms_eps) if s.qk_norm else None
        self.k_norm = RMSNorm(hd, s.rms_eps) if s.qk_norm else None
        self.o_proj = nn.Linear(s.num_heads * hd, d, bias=False)
        self.post_norm = RMSNorm(d, s.rms_eps)
        self.moe: MoE | None = None
        if s.is_moe_layer(index):
            self.moe = MoE(d, s.num_experts, s.moe_intermediate_size, s.experts_per_token, s.expert_groups,
                           s.topk_groups, s.routed_scaling, s.shared_experts, s.router_bias,
                           experts=par.expert_range(s.num_experts),
                           shared_inter=s.moe_intermediate_size * s.shared_experts // (
                               par.size if par.expert_parallel else 1),
                           scoring=s.router_scoring, norm_topk_prob=s.norm_topk_prob)
            return
        self.gate_proj = nn.Linear(d, s.intermediate_size, bias=False)
        self.up_proj = nn.Linear(d, s.intermediate_size, bias=False)
        self.down_proj = nn.Linear(s.intermediate_size, d, bias=False)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        h = self.post_norm(x)
        if self.moe is not None:
            return self._summed(self.moe(h))
        return self._summed(self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h)))

    def attn_out(self, o: torch.Tensor) -> torch.Tensor:
        """o_proj of the attention output (summed over the ranks)."""
        return self._summed(self.o_proj(o))

    def _summed(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.tp_reduce is None else self.tp_reduce(y)


def make_rope(spec: ModelSpec) -> Rope:
    return Rope(spec.head_dim, spec.rope_theta, spec.rope_scaling, spec.max_position_embeddings,
                spec.rotary_dim)


class Transformer(nn.Module):
    def __init__(self, spec: ModelSpec, par: Parallel = ONE):
        """`spec`: the checkpoint's; with `par` over several ranks the model holds rank `par.rank`'s
        shard and `self.spec` is its local spec (models/parallel.py)."""
        super().__init__()
        self.par = par
        spec = local_spec(spec, par)
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(Layer(spec, i, par) for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_eps)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        self.ar_head: nn.Linear | None = None  # Nemotron-Labs-Diffusion's causal head, when shipped
        if spec.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight
        self.rope = make_rope(spec)
        self.attn_scale = spec.head_dim ** -0.5

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    def new_cache(self, capacity: int = 256, block_size: int = 16) -> PrefixCache:
        """A cache over a private pool of `capacity` positions that grows when a write needs more
        (tests, the cost model's calibration; the engine's requests share its fixed pool instead)."""
        return BlockPool.for_model(self, -(-max(capacity, 1) // block_size) + 1, block_size, growable=True).new_cache()

    def qkv(self, layer: Layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            qscale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B,T,d] (pre-norm hidden) -> q [B,H,T,D], k, v [B,Hkv,T,D] with RoPE applied."""
        h = layer.input_norm(x)
        return self.heads(layer, layer.q_proj(h), layer.k_proj(h), layer.v_proj(h), cos, sin, qscale)

    def heads(self, layer: Layer, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
              sin: torch.Tensor, qscale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Projections q [B,T,H*D], k, v [B,T,Hkv*D] -> per-head q [B,H,T,D], k, v [B,Hkv,T,D] (q/k norm,
        RoPE, query scaling)."""
        B, T, _ = q.shape
        s = self.spec
        q = q.view(B, T, s.num_heads, s.head_dim)
        k = k.view(B, T, s.num_kv_heads, s.head_dim)
        v = v.view(B, T, s.num_kv_heads, s.head_dim)
        if layer.q_norm is not None:
            q, k = layer.q_norm(q), layer.k_norm(k)
        q = apply_rope(q.transpose(1, 2), cos, sin)
        k = apply_rope(k.transpose(1, 2), cos, sin)
        if qscale is not None:
            q = q * qscale[:, None]
        return q, k, v.transpose(1, 2)

    def head(self, x: torch.Tensor, which: str = "lm") -> torch.Tensor:
        h = self.ar_head if (which == "ar" and self.ar_head is not None) else self.lm_head
        return h(self.norm(x))

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cache: PrefixCache | None = None,
                mask: torch.Tensor | None = None, write_cache: bool = False,
                logits_at: torch.Tensor | None = None, return_hidden: bool = False,
                head: str = "lm"):
        """Returns logits [B, T or len(logits_at), V] (and the per-layer inputs, a list of [B,T,d],
        plus the final pre-norm hidden, when `return_hidden`)."""
        B, T = tokens.shape
        if write_cache and (cache is None or B != 1):
            raise ValueError("write_cache needs a cache and exactly one branch")
        x = self.embed(tokens)
        cos, sin = self.rope.cos_sin(positions, x.dtype)
        qscale = self.rope.query_scale(positions, x.dtype)
        hidden = []
        for li, layer in enumerate(self.layers):
            if return_hidden:
                hidden.append(x)
            q, k, v = self.qkv(layer, x, cos, sin, qscale)
            pk, pv = cache.view(li) if cache is not None else (None, None)
            o = attention(q, k, v, pk, pv, mask, self.attn_scale)
            if write_cache:
                cache.write(li, k[0], v[0])
            x = x + layer.attn_out(o)
            x = x + layer.mlp(x)
        if write_cache:
            cache.commit_write()
        if return_hidden:
            hidden.append(x)
        if logits_at is not None:
            x = x[:, logits_at]
        logits = self.head(x, head)
        return (logits, hidden) if return_hidden else logits

    # ------------------------------------------------------------------ packed forwards
    def forward_many(self, forwards: list[Forward]) -> list[ForwardResult]:
        """Run every `Forward` in one call: embedding, norms, projections, FFN and head over the packed
        rows of all forwards; RoPE and attention per forward (its positions, its own prefix cache and
        window mask). Equal, up to float rounding, to `forward` on each alone. Two forwards of one
        call must not share a cache they write."""
        if not forwards:
            return []
        for f in forwards:
            if f.write_cache and (f.cache is None or f.tokens.shape[0] != 1):
                raise ValueError("write_cache needs a cache and exactly one branch")
        shapes = [tuple(f.tokens.shape) for f in forwards]
        sizes = [b * t for b, t in shapes]
        x = self.embed(torch.cat([f.tokens.reshape(-1) for f in forwards]))  # [R, d]
        d = x.shape[-1]
        cos, sin, qscale = self._packed_rope(forwards, shapes, x.dtype)
        hidden: list[list | None] = [[] if f.return_hidden else None for f in forwards]
        by_len: dict[int, list[int]] = {}  # forwards of one window length share padded attention calls
        for i, (_, T) in enumerate(shapes):
            by_len.setdefault(T, []).append(i)
        starts = [0]
        for n in sizes[:-1]:
            starts.append(starts[-1] + n)
        heads = (self.spec.num_heads, self.spec.num_kv_heads, self.spec.head_dim)
        plans = [p for idx in by_len.values() for p in Group.split(forwards, idx, starts, shapes, heads, x)]
        for li, layer in enumerate(self.layers):
            self._keep(hidden, x, sizes, shapes)
            q, k, v = self._packed_heads(layer, x, cos, sin, qscale)  # [R, H or Hkv, D]
            x = x + layer.attn_out(self._attend(forwards, plans, li, q, k, v, starts, shapes))
            x = x + layer.mlp(x)
        for f in forwards:
            if f.write_cache:
                f.cache.commit_write()
        self._keep(hidden, x, sizes, shapes)
        return self._heads_many(forwards, x, sizes, shapes, d, hidden)

    def _attend(self, forwards, plans, li, q, k, v, starts, shapes) -> torch.Tensor:
        """Layer `li`'s attention output for every packed row, in row order (one `Group` call per run
        of same-shape forwards); writes the K/V of the forwards that append to their cache."""
        chunks = sorted(((g.idx[0], g.attend(forwards, li, q, k, v, self.attn_scale)) for g in plans),
                        key=lambda c: c[0])
        for i, f in enumerate(forwards):
            if f.write_cache:
                rows = slice(starts[i], starts[i] + shapes[i][1])
                f.cache.write(li, k[rows].transpose(0, 1), v[rows].transpose(0, 1))
        return chunks[0][1] if len(chunks) == 1 else torch.cat([c for _, c in chunks])

    def _packed_rope(self, forwards, shapes, dtype):
        """cos, sin [R, 1, D] and the query scale [R, 1, 1] (or None) of every packed row."""
        pos = torch.cat([f.positions.repeat(b) for f, (b, _) in zip(forwards, shapes)])
        cos, sin = self.rope.cos_sin(pos, dtype)
        qscale = self.rope.query_scale(pos, dtype)
        return cos[:, None], sin[:, None], (None if qscale is None else qscale[:, None, None])

    def _packed_heads(self, layer: Layer, x: torch.Tensor, cos, sin, qscale):
        """Position-wise attention inputs of packed rows x [R, d]: q [R,H,D], k, v [R,Hkv,D] (norm,
        projections, q/k norm, RoPE, query scale), the same arithmetic as `heads` per row."""
        s = self.spec
        h = layer.input_norm(x)
        q = layer.q_proj(h).view(-1, s.num_heads, s.head_dim)
        k = layer.k_proj(h).view(-1, s.num_kv_heads, s.head_dim)
        v = layer.v_proj(h).view(-1, s.num_kv_heads, s.head_dim)
        if layer.q_norm is not None:
            q, k = layer.q_norm(q), layer.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if qscale is not None:
            q = q * qscale
        return q, k, v

    @staticmethod
    def _keep(hidden: list, x: torch.Tensor, sizes: list[int], shapes: list[tuple[int, int]]) -> None:
        for i, part in enumerate(x.split(sizes)):
            if hidden[i] is not None:
                hidden[i].append(part.view(*shapes[i], -1))

    def _heads_many(self, forwards, x, sizes, shapes, d, hidden) -> list[ForwardResult]:
        """The head over the selected rows of every forward (`logits_at` for every branch, or each
        branch's own `head_rows`), one matmul per head kind."""
        sel = []
        for f, part, (B, T) in zip(forwards, x.split(sizes), shapes):
            if f.head_rows is not None:  # each branch's own rows: [1, n, d]
                sel.append(part.index_select(0, f.head_rows)[None])
                continue
            xi = part.view(B, T, d)
            if f.logits_at is not None:
                xi = xi[:, f.logits_at]
            sel.append(xi)
        logits: list[torch.Tensor | None] = [None] * len(forwards)
        for kind in dict.fromkeys(f.head for f in forwards):
            idx = [i for i, f in enumerate(forwards) if f.head == kind]
            rows = self.head(torch.cat([sel[i].reshape(-1, d) for i in idx]), kind)
            for i, part in zip(idx, rows.split([sel[i].shape[0] * sel[i].shape[1] for i in idx])):
                logits[i] = part.view(sel[i].shape[0], sel[i].shape[1], rows.shape[-1])
        return [ForwardResult(lg, h) for lg, h in zip(logits, hidden)]

    def write_kv(self, cache: PrefixCache, hidden: list[torch.Tensor], positions: torch.Tensor) -> None:
        """Append a window's K/V to `cache` from its per-layer input hidden states (`hidden[l]` [T, d],
        as `forward(..., return_hidden=True)` returned them for one branch): exactly the K/V a forward
        over that window would write, without running attention or FFN."""
        x0 = hidden[0]
        cos, sin = self.rope.cos_sin(positions, x0.dtype)
        qscale = self.rope.query_scale(positions, x0.dtype)
        for li, layer in enumerate(self.layers):
            _, k, v = self.qkv(layer, hidden[li][None], cos, sin, qscale)
            cache.write(li, k[0], v[0])
        cache.commit_write()
