"""The native decoder-only transformer behind every family (no `trust_remote_code`).

RMSNorm, RoPE with absolute positions (full or partial), GQA, optional q/k/v bias, optional per-head
q/k norm, SwiGLU or a mixture of experts (models/moe.py: a layer past `spec.dense_layers` of a MoE
spec has `moe` instead of gate/up/down_proj), tied or untied head. `forward` runs B branches of one window of T positions against one shared
prefix KV cache; `forward_many` runs several such `Forward`s (of different requests) in one call,
the position-wise work over their packed rows and attention per forward against its own cache;
`write_kv` writes a window's K/V from hidden states a forward returned (no forward):

    tokens [B, T]  positions [T]  mask [T, T] (window query x window key, True = may attend)
    every query also sees the whole cached prefix [0, P) through zero-copy views.

Invariants:
- the prefix cache is read through views and never copied per branch;
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

from specfold.models.forward import Forward, ForwardResult
from specfold.models.cache import PrefixCache
from specfold.models.moe import MoE
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
    def __init__(self, s: ModelSpec, index: int = 0):
        super().__init__()
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
                           s.topk_groups, s.routed_scaling, s.shared_experts, s.router_bias)
            return
        self.gate_proj = nn.Linear(d, s.intermediate_size, bias=False)
        self.up_proj = nn.Linear(d, s.intermediate_size, bias=False)
        self.down_proj = nn.Linear(s.intermediate_size, d, bias=False)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        h = self.post_norm(x)
        if self.moe is not None:
            return self.moe(h)
        return self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pk: torch.Tensor | None,
              pv: torch.Tensor | None, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """q [B,H,T,D]; k, v [B,Hkv,T,D]; pk, pv [Hkv,P,D] shared prefix (or None); mask [T,T].

    Returns [B, T, H*D]. Prefix scores come from one matmul over all branches at once, so the prefix
    K/V are read, never broadcast-copied."""
    B, H, T, D = q.shape
    hkv = k.shape[1]
    g = H // hkv
    qg = q.reshape(B, hkv, g, T, D)
    s_win = torch.matmul(qg, k.unsqueeze(2).transpose(-1, -2)) * scale  # [B,Hkv,g,T,T]
    if mask is not None:
        s_win = s_win.masked_fill(~mask, float("-inf"))
    sm_dtype = torch.float32 if q.dtype in _LOW else q.dtype
    P = 0 if pk is None else pk.shape[1]
    if P == 0:
        p = torch.softmax(s_win, dim=-1, dtype=sm_dtype).to(q.dtype)
        out = torch.matmul(p, v.unsqueeze(2))  # [B,Hkv,g,T,D]
    else:
        qp = qg.permute(1, 0, 2, 3, 4).reshape(hkv, B * g * T, D)
        s_pre = torch.matmul(qp, pk.transpose(-1, -2)) * scale  # [Hkv, B*g*T, P]
        s_pre = s_pre.view(hkv, B, g, T, P).permute(1, 0, 2, 3, 4)
        p = torch.softmax(torch.cat([s_pre, s_win], dim=-1), dim=-1, dtype=sm_dtype).to(q.dtype)
        p_pre = p[..., :P].permute(1, 0, 2, 3, 4).reshape(hkv, B * g * T, P)
        out = torch.matmul(p_pre, pv).view(hkv, B, g, T, D).permute(1, 0, 2, 3, 4)
        out = out + torch.matmul(p[..., P:], v.unsqueeze(2))
    return out.reshape(B, H, T, D).transpose(1, 2).reshape(B, T, H * D)


def attention_many(qkv: list, prefixes: list, masks: list, scale: float) -> list[torch.Tensor]:
    """`attention` for G forwards of one window length T in one padded call: forward i has q_i
    [B_i,H,T,D], k_i, v_i [B_i,Hkv,T,D], its own prefix (pk_i, pv_i) [Hkv,P_i,D] (or (None, None))
    and window mask [T,T] (or None). Branches are padded to max B_i with zero queries and prefixes to
    max P_i with keys masked out, so every result row equals `attention` on its forward alone (up to
    float rounding). Returns [B_i, T, H*D] per forward."""
    if len(qkv) == 1:
        (q, k, v), (pk, pv) = qkv[0], prefixes[0]
        return [attention(q, k, v, pk, pv, masks[0], scale)]
    q0 = qkv[0][0]
    _, H, T, D = q0.shape
    hkv = qkv[0][1].shape[1]
    G = len(qkv)
    Bm = max(q.shape[0] for q, _, _ in qkv)
    Pm = max(0 if pk is None else pk.shape[1] for pk, _ in prefixes)
    Q = q0.new_zeros(G, Bm, H, T, D)
    K, V = q0.new_zeros(G, Bm, hkv, T, D), q0.new_zeros(G, Bm, hkv, T, D)
    M = torch.ones(G, T, T, dtype=torch.bool, device=q0.device)
    for i, ((q, k, v), m) in enumerate(zip(qkv, masks)):
        Q[i, : q.shape[0]], K[i, : q.shape[0]], V[i, : q.shape[0]] = q, k, v
        if m is not None:
            M[i] = m
    PK = PV = valid = None
    if Pm:
        PK, PV = q0.new_zeros(G, hkv, Pm, D), q0.new_zeros(G, hkv, Pm, D)
        valid = torch.zeros(G, Pm, dtype=torch.bool, device=q0.device)
        for i, (pk, pv) in enumerate(prefixes):
            if pk is not None and pk.shape[1]:
                PK[i, :, : pk.shape[1]], PV[i, :, : pk.shape[1]] = pk, pv
                valid[i, : pk.shape[1]] = True
    out = attend_padded(Q, K, V, M, PK, PV, valid, scale)
    return [out[i, : q.shape[0]] for i, (q, _, _) in enumerate(qkv)]


def attend_padded(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, M: torch.Tensor, PK: torch.Tensor | None,
                  PV: torch.Tensor | None, valid: torch.Tensor | None, scale: float) -> torch.Tensor:
    """The padded attention of G forwards (fixed shapes, no host data): Q [G,Bm,H,T,D], K, V
    [G,Bm,Hkv,T,D], window masks M [G,T,T], prefixes PK, PV [G,Hkv,P,D] with `valid` [G,P] (keys at
    False contribute exactly 0; their values must be finite) or None. Returns [G, Bm, T, H*D]."""
    G, Bm, H, T, D = Q.shape
    hkv = K.shape[2]
    g = H // hkv
    qg = Q.view(G, Bm, hkv, g, T, D)
    s_win = torch.matmul(qg, K.unsqueeze(3).transpose(-1, -2)) * scale  # [G,Bm,Hkv,g,T,T]
    s_win = s_win.masked_fill(~M[:, None, None, None], float("-inf"))
    sm_dtype = torch.float32 if Q.dtype in _LOW else Q.dtype
    if PK is None:
        p = torch.softmax(s_win, dim=-1, dtype=sm_dtype).to(Q.dtype)
        out = torch.matmul(p, V.unsqueeze(3))
    else:
        Pm = PK.shape[2]
        qp = qg.permute(0, 2, 1, 3, 4, 5).reshape(G, hkv, Bm * g * T, D)
        s_pre = torch.matmul(qp, PK.transpose(-1, -2)) * scale  # [G, Hkv, Bm*g*T, Pm]
        s_pre = s_pre.masked_fill(~valid[:, None, None, :], float("-inf"))
        s_pre = s_pre.view(G, hkv, Bm, g, T, Pm).permute(0, 2, 1, 3, 4, 5)
        p = torch.softmax(torch.cat([s_pre, s_win], dim=-1), dim=-1, dtype=sm_dtype).to(Q.dtype)
        p_pre = p[..., :Pm].permute(0, 2, 1, 3, 4, 5).reshape(G, hkv, Bm * g * T, Pm)
        out = torch.matmul(p_pre, PV).view(G, hkv, Bm, g, T, D).permute(0, 2, 1, 3, 4, 5)
        out = out + torch.matmul(p[..., Pm:], V.unsqueeze(3))
    return out.reshape(G, Bm, H, T, D).transpose(2, 3).reshape(G, Bm, T, H * D)


def make_rope(spec: ModelSpec) -> Rope:
    return Rope(spec.head_dim, spec.rope_theta, spec.rope_scaling, spec.max_position_embeddings,
                spec.rotary_dim)


class Transformer(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(Layer(spec, i) for i in range(spec.num_layers))
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

    def new_cache(self, capacity: int = 256) -> PrefixCache:
        s = self.spec
        return PrefixCache(s.num_layers, s.num_kv_heads, s.head_dim, self.dtype, self.device, capacity)

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
            x = x + layer.o_proj(o)
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
        groups: dict[int, list[int]] = {}  # forwards of one window length share padded attention calls
        for i, (_, T) in enumerate(shapes):
            groups.setdefault(T, []).append(i)
        groups = list(groups.values())
        for li, layer in enumerate(self.layers):
            self._keep(hidden, x, sizes, shapes)
            q, k, v = self._packed_heads(layer, x, cos, sin, qscale)  # [R, H or Hkv, D]
            qs, ks, vs = q.split(sizes), k.split(sizes), v.split(sizes)
            heads = [[t.view(B, T, -1, t.shape[-1]).transpose(1, 2) for t in (qs[i], ks[i], vs[i])]
                     for i, (B, T) in enumerate(shapes)]
            outs: list = [None] * len(forwards)
            for group in groups:
                res = attention_many([heads[i] for i in group],
                                     [forwards[i].cache.view(li) if forwards[i].cache is not None else (None, None)
                                      for i in group], [forwards[i].mask for i in group], self.attn_scale)
                for i, o in zip(group, res):
                    outs[i] = o.reshape(sizes[i], -1)
            for f, (_, ki, vi) in zip(forwards, heads):
                if f.write_cache:
                    f.cache.write(li, ki[0], vi[0])
            x = x + layer.o_proj(torch.cat(outs))
            x = x + layer.mlp(x)
        for f in forwards:
            if f.write_cache:
                f.cache.commit_write()
        self._keep(hidden, x, sizes, shapes)
        return self._heads_many(forwards, x, sizes, shapes, d, hidden)

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
