"""The static-shape forward: G forwards padded to fixed sizes, K/V read and written through block tables.

    x = static_forward(model, pool, sb)     # final hidden states [R, d] of every packed row

`forward_many` with every shape fixed by the bucket and every index a device tensor, so one call is
one fixed sequence of kernels (what a CUDA graph captures; engine/graphs.py). A `StaticBatch` holds:

    tokens, positions [R]   the packed rows of all forwards (branch-major per forward), padded to R
    wslot [R]               the flat pool slot each row's K/V are written to: (block of position
                            length + t) * bs + offset for the rows of a forward that writes, else a
                            slot of the pool's scratch block
    gather [G*B*T]          the padded attention layout [G, B, T] -> packed row (padding: any row)
    scatter [R]             packed row -> its place in the padded layout (padding: any place)
    tables [G, ceil(P/bs)]  each forward's block table (padding: the scratch block 0)
    meta [G, 6]             per forward: window start, prefix length, real window length t_real,
                            and its mask as (n, origin, pending): key j is seen by query i iff
                            (pos_i - origin) // n >= (pos_j - origin) // n, except that the first
                            `pending` rows see only the pending rows at or before them
                            (decoding/layout.py's kinds: full = (2**40, 0, 0), block (n, origin, 0),
                            causal (1, 0, 0), ("pending", a) = (2**40, 0, a))

and the prefix bucket P (a Python int: keys [0, P) of each forward are gathered through its block
table, those at or past its length read from the scratch block and masked). Block tables are graph
inputs, so a captured graph serves any block layout. Padding never changes a real row: a real query
sees only its own branch's window rows below t_real and its own keys below its length; padded rows
see themselves (finite, never NaN); padded forwards have length 0 and write the scratch block.
Every op is position-wise or gathers by index, so the arithmetic of a real row is `forward_many`'s.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specfold.models.pool import BlockPool
from specfold.models.attention import attend_padded
from specfold.models.transformer import Transformer

FULL = 1 << 40  # a mask block no window reaches past: every window row sees every other
META = 6  # columns of StaticBatch.meta


@dataclass(slots=True)
class StaticBatch:
    tokens: torch.Tensor
    positions: torch.Tensor
    wslot: torch.Tensor
    scatter: torch.Tensor
    gather: torch.Tensor
    meta: torch.Tensor
    tables: torch.Tensor
    G: int
    B: int
    T: int
    P: int

    @classmethod
    def empty(cls, R: int, G: int, B: int, T: int, P: int, bs: int, device) -> "StaticBatch":
        z = lambda *shape: torch.zeros(*shape, dtype=torch.long, device=device)  # noqa: E731
        return cls(z(R), z(R), z(R), z(R), z(G * B * T), z(G, META), z(G, table_width(P, bs)), G, B, T, P)

    @property
    def parts(self) -> tuple[torch.Tensor, ...]:
        """The input buffers in the order of the host layout (engine/graphs.py fills them)."""
        return self.tokens, self.positions, self.wslot, self.scatter, self.gather, self.meta, self.tables


def table_width(P: int, bs: int) -> int:
    """Block-table columns of a bucket whose prefixes are read up to P."""
    return -(-P // bs)


def prefix_slots(tables: torch.Tensor, length: torch.Tensor, P: int, bs: int) -> torch.Tensor:
    """[G * P] flat pool slots of keys [0, P) of every forward; keys at or past its length -> slot 0
    (the scratch block)."""
    p = torch.arange(P, device=tables.device)
    slots = tables[:, p // bs] * bs + p % bs
    return torch.where(p[None, :] < length[:, None], slots, 0).reshape(-1)


def window_masks(meta: torch.Tensor, T: int) -> torch.Tensor:
    """[G, T, T] bool (True = may attend) from `meta` (see the module docstring)."""
    start, treal, n, origin, pend = meta[:, 0], meta[:, 2], meta[:, 3], meta[:, 4], meta[:, 5]
    i = torch.arange(T, device=meta.device)
    pos = start[:, None] + i  # [G, T]
    blk = torch.div(pos - origin[:, None], n[:, None], rounding_mode="floor")
    m = blk[:, :, None] >= blk[:, None, :]
    row, col = i[None, :, None], i[None, None, :]
    pe = pend[:, None, None]
    m = torch.where(row < pe, (col < pe) & (col <= row), m)
    real = treal[:, None, None]
    return torch.where(row < real, m & (col < real), row == col)


def static_forward(model: Transformer, pool: BlockPool, sb: StaticBatch) -> torch.Tensor:
    """The final (pre-norm) hidden states [R, d] of the packed rows; writes K/V into the pool."""
    s, G, B, T, P = model.spec, sb.G, sb.B, sb.T, sb.P
    H, hkv, D = s.num_heads, s.num_kv_heads, s.head_dim
    mask = window_masks(sb.meta, T)
    length = sb.meta[:, 1]
    valid = torch.arange(P, device=mask.device)[None, :] < length[:, None] if P else None
    slots = prefix_slots(sb.tables, length, P, pool.block_size) if P else None
    x = model.embed(sb.tokens)
    cos, sin = model.rope.cos_sin(sb.positions, x.dtype)
    qscale = model.rope.query_scale(sb.positions, x.dtype)
    cos, sin, qscale = cos[:, None], sin[:, None], (None if qscale is None else qscale[:, None, None])
    for li, layer in enumerate(model.layers):
        q, k, v = model._packed_heads(layer, x, cos, sin, qscale)  # [R, H or Hkv, D]
        Q = q.index_select(0, sb.gather).view(G, B, T, H, D).transpose(2, 3)
        K = k.index_select(0, sb.gather).view(G, B, T, hkv, D).transpose(2, 3)
        V = v.index_select(0, sb.gather).view(G, B, T, hkv, D).transpose(2, 3)
        PK = PV = None
        if P:
            PK = pool.k[li].index_select(1, slots).view(hkv, G, P, D).transpose(0, 1)  # [G, Hkv, P, D]
            PV = pool.v[li].index_select(1, slots).view(hkv, G, P, D).transpose(0, 1)
        out = attend_padded(Q, K, V, mask, PK, PV, valid, model.attn_scale)  # [G, B, T, H*D]
        pool.k[li].transpose(0, 1).index_put_((sb.wslot,), k)
        pool.v[li].transpose(0, 1).index_put_((sb.wslot,), v)
        x = x + layer.attn_out(out.reshape(G * B * T, H * D).index_select(0, sb.scatter))
        x = x + layer.mlp(x)
    return x
