"""Attention of the packed forwards: one forward (`attention`), several forwards of one window length
padded into one call (`attention_many`, `attend_padded`), and `Group`, the per-call plan that lets
`Transformer.forward_many` build a group's padded inputs in a few ops instead of a few per forward.

Shapes: q [B,H,T,D]; k, v [B,Hkv,T,D]; a forward's prefix pk, pv [Hkv,P,D] (zero-copy cache views);
window mask [T,T] (True = may attend) or None (full). GQA: H = g * Hkv.

Invariants:
- every padded row (zero queries, prefix keys past a forward's length) contributes exactly nothing
  to a real row, so a row's result does not depend on its call partners (up to float rounding);
- a `Group` gives `attend_padded` the same tensors, in the same layout, as `attention_many` builds
  from per-forward pieces: the two paths compute the same numbers;
- softmax runs in float32 for 16-bit dtypes and in the input dtype otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence

from specfold.models.forward import Forward

_LOW = (torch.bfloat16, torch.float16)


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


@dataclass(slots=True)
class Group:
    """Forwards of one call that share (B, T), have a cache each and lie next to each other in the
    packed rows [lo, hi): their padded queries, keys and values are views of the packed q, k, v; the
    masks and the prefix validity are built once per call, not once per layer."""
    idx: list[int]
    lo: int
    hi: int
    B: int
    T: int
    M: torch.Tensor  # [G, T, T] bool
    valid: torch.Tensor | None  # [G, P] bool (None: no forward has a prefix)
    lengths: list[int]

    @staticmethod
    def split(forwards: list[Forward], idx: list[int], starts: list[int], shapes: list[tuple[int, int]],
              device) -> list[tuple[list[int], "Group | None"]]:
        """Forwards `idx` (one window length, in packed order) -> their runs of consecutive forwards
        with the same branch count and a cache each, planned as groups, and the rest in one list
        without a group (the per-forward path)."""
        runs: list[list[int]] = []
        for i in idx:
            r = runs[-1] if runs else None
            if r and r[-1] == i - 1 and shapes[r[-1]] == shapes[i] and forwards[i].cache is not None \
                    and forwards[r[-1]].cache is not None:
                r.append(i)
            else:
                runs.append([i])
        out = [(r, Group.plan(forwards, r, starts, shapes, device)) for r in runs]
        rest = sorted(i for r, g in out if g is None for i in r)
        return [(r, g) for r, g in out if g is not None] + ([(rest, None)] if rest else [])

    @staticmethod
    def plan(forwards: list[Forward], idx: list[int], starts: list[int], shapes: list[tuple[int, int]],
             device) -> "Group | None":
        """The group of forwards `idx` (consecutive, one shape), or None for a single forward or one
        without a cache (the per-forward path)."""
        B, T = shapes[idx[0]]
        if len(idx) < 2 or any(forwards[i].cache is None for i in idx):
            return None
        G = len(idx)
        full = torch.ones(T, T, dtype=torch.bool, device=device)
        M = torch.stack([full if forwards[i].mask is None else forwards[i].mask for i in idx])
        lengths = [forwards[i].cache.length for i in idx]
        valid = None
        if max(lengths):
            valid = torch.zeros(G, max(lengths), dtype=torch.bool, device=device)
            for g, n in enumerate(lengths):
                if n:
                    valid[g, :n] = True
        return Group(idx, starts[idx[0]], starts[idx[-1]] + B * T, B, T, M, valid, lengths)

    def attend(self, forwards: list[Forward], layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float) -> torch.Tensor:
        """Packed q [R,H,D], k, v [R,Hkv,D] of this layer -> this group's rows [hi - lo, H*D]."""
        G, B, T = len(self.idx), self.B, self.T

        def pad(t: torch.Tensor) -> torch.Tensor:  # [G*B*T, h, D] -> [G, B, h, T, D], contiguous
            return t[self.lo: self.hi].view(G, B, T, t.shape[1], t.shape[2]).transpose(2, 3).contiguous()

        PK = PV = None
        if self.valid is not None:
            views = [forwards[i].cache.view(layer) for i in self.idx]
            if [pk.shape[1] for pk, _ in views] != self.lengths:
                raise RuntimeError("internal error: a prefix cache changed length inside a forward")
            PK, PV = (pad_sequence([t[j].transpose(0, 1) for t in views], batch_first=True).transpose(1, 2).contiguous()
                      for j in (0, 1))
        out = attend_padded(pad(q), pad(k), pad(v), self.M, PK, PV, self.valid, scale)  # [G, B, T, H*D]
        return out.reshape(G * B * T, -1)
