"""Static-shape buckets on the host: which bucket a step's static forwards take, and their integers.

`plan_groups(jobs, idx, pool)` groups the jobs `idx` by window bucket; each group is padded to a
bucket `(R, G, B, T, P)` (packed rows, forwards, branches, window rows, prefix keys), each size the
smallest of `LADDER` that holds it (P: at least `MIN_PREFIX`). Host data only: job lists, cache
lengths and block tables, never a device read. A `Group` carries its integers in
models/static.py's `StaticBatch` layout, then its head rows grouped by head kind (packed row
indices), ready to join the runner's one host-to-device copy.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from specfold.decoding.jobs import Job
from specfold.models.pool import BlockPool
from specfold.models.static import FULL, table_width


def _ladder(top: int = 1 << 16) -> list[int]:
    out, p = [1, 2, 3], 4
    while p <= top:
        out += [p, p + p // 2]
        p *= 2
    return out


LADDER = _ladder()  # bucket sizes: 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (padding wastes at most 50 %)
MAX_WINDOW = 512  # longer windows (long prefills) run eagerly
MIN_PREFIX = 16


def bucket(n: int, lo: int = 1) -> int:
    """The smallest ladder size >= max(n, lo)."""
    n = max(n, lo)
    for b in LADDER:
        if b >= n:
            return b
    raise ValueError(f"no bucket holds {n}")


def mask_code(desc: tuple | None) -> tuple[int, int, int]:
    """A mask description (decoding/layout.py) -> (n, origin, pending) of `StaticBatch.meta`."""
    if desc is None:
        return FULL, 0, 0
    if desc[0] == "block":
        return desc[1], desc[2], 0
    if desc[0] == "causal":
        return 1, 0, 0
    if desc[0] == "pending":
        return FULL, 0, desc[1]
    raise ValueError(f"unknown mask description {desc!r}")


@dataclass(slots=True)
class Group:
    """The static forwards of one step that share a window bucket, in host data."""
    key: tuple[int, int, int, int, int]  # (R, G, B, T, P)
    jobs: list[int]  # indices into the step's jobs
    ints: list[int]  # the StaticBatch layout, then every head row (packed row indices)
    heads: list[tuple | None] = field(default_factory=list)  # per job: (head kind, first row, rows, shape)
    kinds: list[tuple[str, int, int]] = field(default_factory=list)  # (head kind, offset in ints, rows)
    offset: int = 0  # where `ints` starts in the step's device buffer


def plan_groups(jobs: list[Job], idx: list[int], pool: BlockPool) -> list[Group]:
    by_t: dict[int, list[int]] = {}
    for i in idx:
        by_t.setdefault(bucket(jobs[i].width), []).append(i)
    return [_group([jobs[i] for i in g], g, T, pool) for T, g in by_t.items()]


def _group(jobs: list[Job], idx: list[int], T: int, pool: BlockPool) -> Group:
    G, B = bucket(len(jobs)), bucket(max(len(j.tokens) for j in jobs))
    R = bucket(sum(len(j.tokens) * j.width for j in jobs))
    top = max(j.cache.length for j in jobs)
    P = 0 if top == 0 else bucket(top, MIN_PREFIX)
    lay = _Layout(B, T, pool.block_size, table_width(P, pool.block_size))
    for g, j in enumerate(jobs):
        lay.add(g, j)
    lay.pad(R, G - len(jobs))
    ints, kinds = lay.flat()
    return Group((R, G, B, T, P), idx, ints, lay.shapes, kinds)


class _Layout:
    """The integers of one group, built forward by forward (see models/static.py's layout)."""

    def __init__(self, B: int, T: int, bs: int, width: int):
        self.B, self.T, self.bs, self.width = B, T, bs, width
        self.tok, self.pos, self.wslot, self.scatter, self.gather, self.meta, self.tables = [], [], [], [], [], [], []
        self.heads: dict[str, list[int]] = {}  # head kind -> its packed rows
        self.shapes: list[tuple | None] = []

    def add(self, g: int, j: Job) -> None:
        B, T, nb, t, r0, c = self.B, self.T, len(j.tokens), j.width, len(self.tok), j.cache
        for row in j.tokens:
            self.tok += row
        self.pos += list(range(j.start, j.start + t)) * nb
        bs = self.bs
        if j.write_cache:  # the engine reserved these blocks before the step
            self.wslot += [c.blocks[p // bs] * bs + p % bs for p in range(c.length, c.length + t)]
        else:
            self.wslot += [0] * (nb * t)  # the scratch block
        base = g * B * T
        for b in range(nb):
            self.scatter += range(base + b * T, base + b * T + t)
            self.gather += range(r0 + b * t, r0 + b * t + t)
            self.gather += [r0] * (T - t)
        self.gather += [r0] * ((B - nb) * T)
        self.meta += [j.start, c.length, t, *mask_code(j.mask)]
        table = c.blocks[: -(-c.length // bs)]
        self.tables += table + [0] * (self.width - len(table))
        rows, shape = head_rows(j, r0)
        kind = self.heads.setdefault(j.head, [])
        self.shapes.append((j.head, len(kind), len(rows), shape) if rows else None)
        kind += rows

    def pad(self, R: int, forwards: int) -> None:
        """Padding rows (token 0 at position 0, writing the scratch block) and padding forwards (length
        0: every prefix key masked; the scratch block as their table)."""
        n = R - len(self.tok)
        self.tok += [0] * n
        self.pos += [0] * n
        self.wslot += [0] * n
        self.scatter += [0] * n
        self.gather += [0] * (forwards * self.B * self.T)
        self.meta += [0, 0, self.T, FULL, 0, 0] * forwards
        self.tables += [0] * (forwards * self.width)

    def flat(self) -> tuple[list[int], list[tuple[str, int, int]]]:
        ints = self.tok + self.pos + self.wslot + self.scatter + self.gather + self.meta + self.tables
        kinds = []
        for kind, rows in self.heads.items():
            if rows:
                kinds.append((kind, len(ints), len(rows)))
                ints += rows
        return ints, kinds


def head_rows(j: Job, r0: int) -> tuple[list[int], tuple]:
    """The packed rows the head runs on for job `j` (b-major, as the runner reads them) and the
    logits' leading shape."""
    nb, t = len(j.tokens), j.width
    if j.read is None:
        return [], ()
    if j.rows_at is not None:
        return [r0 + r for r in j.rows_at], (1, len(j.rows_at))
    at = j.logits_at if j.logits_at is not None else range(t)
    return [r0 + b * t + k for b in range(nb) for k in at], (nb, len(at))
