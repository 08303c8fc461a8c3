"""Attention of the packed forwards, on one core: `F.scaled_dot_product_attention` over a
block-diagonal layout.

A call attends G forwards of one shape (B branches of T window rows each) at once:
- queries [G, Hkv, B*g*T, D]: the g query heads that share a KV head (GQA, H = g * Hkv, head
  h = kv * g + j) ride as extra query rows, so K/V are never repeated per head;
- keys and values [G, Hkv, P + B*T, D]: the forward's prefix (zero-padded to the group's longest, P)
  followed by every branch's window keys. The prefix is gathered from the paged pool once per
  group and layer (one `index_select` over the members' slots), never copied per branch;
- an additive float bias [G, 1, B*g*T, P + B*T] (0 = may attend, -inf = may not): a row sees its
  forward's valid prefix keys and, of the window keys, only its own branch's under the window mask.

`Group` plans one such call for the forwards of a `Transformer.forward_many` call that share (B, T)
and lie next to each other in the packed rows: the bias, the key/value buffers and the copy targets
are built once per call, so a layer costs a handful of ops however many forwards the group holds.
`attention` (one forward, `Transformer.forward`) and `attend_padded` (fixed shapes,
`models/static.py`) run the same core.

Shapes: q [B,H,T,D]; k, v [B,Hkv,T,D]; a forward's prefix pk, pv [Hkv,P,D] (gathered from its blocks);
window mask [T,T] (True = may attend) or None (full).

Invariants:
- masked keys (padded prefix, other branches) get weight exactly 0 and hold finite values, so a row's
  result does not depend on its call partners (up to float rounding);
- every row must be allowed at least one key (a window mask allows a row itself);
- the softmax accumulates in float32 for 16-bit dtypes and in the input dtype otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specfold.models.forward import Forward


def sdpa(qr: torch.Tensor, ka: torch.Tensor, va: torch.Tensor, bias: torch.Tensor | None, scale: float) -> torch.Tensor:
    """The core: qr [G,Hkv,N,D] against ka, va [G,Hkv,S,D] under bias [G,1,N,S] (or None) -> [G,Hkv,N,D]."""
    return F.scaled_dot_product_attention(qr, ka, va, attn_mask=bias, scale=scale)


def block_bias(masks: torch.Tensor, valid: torch.Tensor | None, B: int, g: int, dtype: torch.dtype) -> torch.Tensor:
    """The additive bias [G, 1, B*g*T, P + B*T] of G forwards from their window masks [G, T, T] (bool,
    True = may attend) and prefix validity `valid` [G, P] (bool; None: no prefix)."""
    G, T, _ = masks.shape
    own = torch.eye(B, dtype=torch.bool, device=masks.device)  # a row sees its own branch's window only
    win = own[None, :, None, None, :, None] & masks[:, None, None, :, None, :]  # [G, B, 1, T, B, T]
    allow = win.expand(G, B, g, T, B, T).reshape(G, B * g * T, B * T)
    if valid is not None:
        allow = torch.cat([valid[:, None, :].expand(G, B * g * T, valid.shape[1]), allow], dim=-1)
    bias = torch.zeros(allow.shape, dtype=dtype, device=masks.device).masked_fill_(~allow, float("-inf"))
    return bias[:, None]


def _rows(q: torch.Tensor, G: int, B: int, T: int, g: int) -> torch.Tensor:
    """Packed queries [G*B*T, H, D] -> [G, Hkv, B*g*T, D] (rows ordered branch, head-in-group, position)."""
    _, H, D = q.shape
    return q.view(G, B, T, H // g, g, D).permute(0, 3, 1, 4, 2, 5).reshape(G, H // g, B * g * T, D)


def _unrows(o: torch.Tensor, G: int, B: int, T: int, g: int) -> torch.Tensor:
    """The core's output [G, Hkv, B*g*T, D] -> packed rows [G*B*T, H*D]."""
    hkv, D = o.shape[1], o.shape[-1]
    return o.view(G, hkv, B, g, T, D).permute(0, 2, 4, 1, 3, 5).reshape(G * B * T, hkv * g * D)


def _window(t: torch.Tensor, G: int, B: int, T: int) -> torch.Tensor:
    """Packed keys or values [G*B*T, Hkv, D] -> [G, Hkv, B*T, D] (a view)."""
    return t.view(G, B * T, t.shape[1], t.shape[2]).transpose(1, 2)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pk: torch.Tensor | None,
              pv: torch.Tensor | None, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """One forward: q [B,H,T,D]; k, v [B,Hkv,T,D]; pk, pv [Hkv,P,D] shared prefix (or None); mask [T,T].
    Returns [B, T, H*D]."""
    B, H, T, D = q.shape
    hkv = k.shape[1]
    g = H // hkv
    P = 0 if pk is None else pk.shape[1]
    rows = lambda t: t.transpose(1, 2).reshape(B * T, t.shape[1], D)  # noqa: E731
    ka, va = (_window(rows(t), 1, B, T) for t in (k, v))
    if P:
        ka, va = torch.cat([pk[None], ka], dim=2), torch.cat([pv[None], va], dim=2)
    bias = None
    if B > 1 or mask is not None:
        m = torch.ones(T, T, dtype=torch.bool, device=q.device) if mask is None else mask
        valid = torch.ones(1, P, dtype=torch.bool, device=q.device) if P else None
        bias = block_bias(m[None], valid, B, g, q.dtype)
    out = sdpa(_rows(rows(q), 1, B, T, g), ka, va, bias, scale)
    return _unrows(out, 1, B, T, g).view(B, T, H * D)


def attend_padded(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, M: torch.Tensor, PK: torch.Tensor | None,
                  PV: torch.Tensor | None, valid: torch.Tensor | None, scale: float) -> torch.Tensor:
    """The padded attention of G forwards (fixed shapes, no host data): Q [G,Bm,H,T,D], K, V
    [G,Bm,Hkv,T,D], window masks M [G,T,T], prefixes PK, PV [G,Hkv,P,D] with `valid` [G,P] (keys at
    False contribute exactly 0; their values must be finite) or None. Returns [G, Bm, T, H*D]."""
    G, Bm, H, T, D = Q.shape
    hkv = K.shape[2]
    g = H // hkv
    P = 0 if PK is None else PK.shape[2]
    rows = lambda t: t.transpose(2, 3).reshape(G * Bm * T, t.shape[2], D)  # noqa: E731
    ka, va = (_window(rows(t), G, Bm, T) for t in (K, V))
    if P:
        ka, va = torch.cat([PK, ka], dim=2), torch.cat([PV, va], dim=2)
    bias = block_bias(M, valid if P else None, Bm, g, Q.dtype)
    return _unrows(sdpa(_rows(rows(Q), G, Bm, T, g), ka, va, bias, scale), G, Bm, T, g).view(G, Bm, T, H * D)


@dataclass(slots=True)
class Group:
    """Forwards of one call that share (B, T) and lie next to each other in the packed rows [lo, hi):
    their queries and window keys come from views of the packed q, k, v; the bias, the key/value
    buffers [G, Hkv, P + B*T, D] (zero where padded) and the prefix copy targets are built once per
    call, not once per layer."""
    idx: list[int]
    lo: int
    hi: int
    B: int
    T: int
    g: int
    P: int
    lengths: list[int]
    bias: torch.Tensor | None  # [G, 1, B*g*T, P + B*T]; None: nothing is masked
    ka: torch.Tensor  # [G, Hkv, P + B*T, D]
    va: torch.Tensor
    dst: list[int]  # the members with a prefix (their slices of ka, va are the copy targets)
    dk: list[torch.Tensor]
    dv: list[torch.Tensor]
    pool: object = None  # the one KV pool of every member's prefix (then `slots`), else None
    slots: torch.Tensor | None = None  # [G * P] each member's prefix slots, padded with the scratch slot

    @staticmethod
    def split(forwards: list[Forward], idx: list[int], starts: list[int], shapes: list[tuple[int, int]],
              heads: tuple[int, int, int], like: torch.Tensor) -> list["Group"]:
        """Forwards `idx` (one window length, in packed order) -> their runs of consecutive forwards
        with the same branch count, each planned as a group. heads = (H, Hkv, D); `like` gives the
        dtype and device."""
        runs: list[list[int]] = []
        for i in idx:
            if runs and runs[-1][-1] == i - 1 and shapes[runs[-1][-1]] == shapes[i]:
                runs[-1].append(i)
            else:
                runs.append([i])
        return [Group.plan(forwards, r, starts, shapes, heads, like) for r in runs]

    @staticmethod
    def plan(forwards: list[Forward], idx: list[int], starts: list[int], shapes: list[tuple[int, int]],
             heads: tuple[int, int, int], like: torch.Tensor) -> "Group":
        """The group of forwards `idx` (consecutive in the packed rows, one shape)."""
        (B, T), (H, hkv, D) = shapes[idx[0]], heads
        G, g, dev = len(idx), H // hkv, like.device
        lengths = [0 if forwards[i].cache is None else forwards[i].cache.length for i in idx]
        P = max(lengths)
        masks = [forwards[i].mask for i in idx]
        bias = None
        if B > 1 or any(m is not None for m in masks) or min(lengths) != P:
            full = torch.ones(T, T, dtype=torch.bool, device=dev)
            M = torch.stack([full if m is None else m for m in masks])
            valid = None
            if P:  # fills, not an upload: the step's host data reaches the device in the runner's one copy
                valid = torch.zeros(G, P, dtype=torch.bool, device=dev)
                for j, n in enumerate(lengths):
                    valid[j, :n] = True
            bias = block_bias(M, valid, B, g, like.dtype)
        ka = like.new_zeros(G, hkv, P + B * T, D)
        va = like.new_zeros(G, hkv, P + B * T, D)
        dst = [j for j, n in enumerate(lengths) if n]
        grp = Group(idx, starts[idx[0]], starts[idx[-1]] + B * T, B, T, g, P, lengths, bias, ka, va, dst,
                    [ka[j, :, : lengths[j]] for j in dst], [va[j, :, : lengths[j]] for j in dst])
        pools = {id(forwards[idx[j]].cache.pool): forwards[idx[j]].cache.pool for j in dst}
        if len(pools) == 1:  # one gather per layer over the shared pool instead of a copy per member
            grp.pool = next(iter(pools.values()))
            grp.slots = torch.zeros(G * P, dtype=torch.long, device=dev)
            for j in dst:
                grp.slots[j * P: j * P + lengths[j]] = forwards[idx[j]].cache.slots[: lengths[j]]
        return grp

    def attend(self, forwards: list[Forward], layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float) -> torch.Tensor:
        """Packed q [R,H,D], k, v [R,Hkv,D] of this layer -> this group's rows [hi - lo, H*D]."""
        G, B, T, P = len(self.idx), self.B, self.T, self.P
        if self.pool is not None:
            hkv, D = self.ka.shape[1], self.ka.shape[3]
            for src, dst in ((self.pool.k[layer], self.ka), (self.pool.v[layer], self.va)):
                dst[:, :, :P].copy_(src.index_select(1, self.slots).view(hkv, G, P, D).transpose(0, 1))
        elif self.dst:
            views = [forwards[self.idx[j]].cache.view(layer) for j in self.dst]
            if any(pk.shape[1] != self.lengths[j] for (pk, _), j in zip(views, self.dst)):
                raise RuntimeError("internal error: a prefix cache changed length inside a forward")
            torch._foreach_copy_(self.dk, [pk for pk, _ in views])
            torch._foreach_copy_(self.dv, [pv for _, pv in views])
        self.ka[:, :, P:].copy_(_window(k[self.lo: self.hi], G, B, T))
        self.va[:, :, P:].copy_(_window(v[self.lo: self.hi], G, B, T))
        out = sdpa(_rows(q[self.lo: self.hi], G, B, T, self.g), self.ka, self.va, self.bias, scale)
        return _unrows(out, G, B, T, self.g)
