"""Static-shape buckets and CUDA graphs (EngineConfig(static_shapes=True) / cuda_graphs=True).

The runner hands this part the step's jobs that can run with fixed shapes (`eligible`): a dense
forward against the engine's paged pool (models/pool.py), no hidden states returned, a window of at most
`MAX_WINDOW` rows. engine/buckets.py groups them and pads each group to a bucket, from host data
only. The group's integers (models/static.py's `StaticBatch` layout) and its head rows are
appended to the runner's one host-to-device copy; `run` copies them device-to-device into the
bucket's fixed input buffer and runs `static_forward` over it, then the LM head on the real head
rows only (outside the graph: exact rows, one matmul per head kind).

With `cuda_graphs` on a CUDA model, the first use of a bucket warms `static_forward` up on a side
stream and captures it into a `torch.cuda.CUDAGraph` (all graphs share one memory pool, as
nano-vllm and SGLang do per batch size); later uses replay it. The head of a group runs right after
its replay, so a later replay in the same step (same pool) can never overwrite hidden states still
to be read. At most `MAX_GRAPHS` graphs are held; later buckets run without one. The capture is
thread-local (the server's other threads may use CUDA meanwhile). Graphs are dropped and captured again if the model's weight tensors were replaced
(the fold verifier fuses q/k/v weights into new tensors when it is built). Elsewhere the same
function runs eagerly over the same buffers, so the CPU tests exercise the fill, pad and slice path.
The capture itself is unverified until a GPU run (docs/DESIGN.md).

The host keeps the caches' lengths: a forward that writes advances its cache once every forward of
the step has run (`commit`), as `forward_many` commits after its last layer.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specfold.decoding.jobs import Job
from specfold.engine.buckets import LADDER, MAX_WINDOW, Group, plan_groups
from specfold.errors import ConfigError
from specfold.models.pool import BlockPool
from specfold.models.static import META, StaticBatch, static_forward, table_width
from specfold.models.transformer import Transformer


MAX_GRAPHS = 256  # graphs held at once; buckets past it run the same function without a graph


@dataclass(slots=True)
class Bucket:
    ints: torch.Tensor  # the one input buffer; `batch` holds views of it
    batch: StaticBatch
    graph: object = None  # torch.cuda.CUDAGraph once captured
    out: torch.Tensor | None = None  # the graph's output (hidden states)


class StaticRunner:
    def __init__(self, model: Transformer, pool: BlockPool, cuda_graphs: bool = False):
        self.model, self.pool, self.cuda_graphs = model, pool, cuda_graphs
        self.buckets: dict[tuple, Bucket] = {}
        self._mempool = None
        self._weights: list[int] | None = None
        self.captures = 0  # graphs captured (statistics)
        self._dropped = 0  # of those, dropped (the weights changed)
        self.forwards = 0  # forwards run with static shapes (statistics)
        self.rows = [0, 0]  # packed rows asked for, and computed after padding (statistics)

    @staticmethod
    def supports(model: Transformer) -> str | None:
        """Why this model cannot run static shapes (None: it can)."""
        if not model.spec.uses_cache:
            return f"{model.spec.family} decodes without a KV cache"
        if any(layer.moe is not None for layer in model.layers):
            return "its mixture-of-experts layers route rows with data-dependent shapes"
        return None

    def eligible(self, job: Job) -> bool:
        c = job.cache
        if job.kind == "reuse" or job.return_hidden or c is None or c.pool is not self.pool:
            return False
        return job.width <= MAX_WINDOW and len(job.tokens) <= LADDER[-1]

    # ------------------------------------------------------------------ host: buckets and integers
    def plan(self, jobs: list[Job], idx: list[int]) -> list[Group]:
        groups = plan_groups(jobs, idx, self.pool)
        self.rows[0] += sum(len(jobs[i].tokens) * jobs[i].width for i in idx)
        self.rows[1] += sum(g.key[0] for g in groups)
        return groups

    # ------------------------------------------------------------------ device
    def run(self, g: Group, buf: torch.Tensor) -> list[torch.Tensor | None]:
        """Logits per job of the group ([B, K, V] as the runner reads them; None where nothing is read)."""
        b = self._bucket(g.key)
        self.forwards += len(g.jobs)
        b.ints.copy_(buf[g.offset: g.offset + b.ints.numel()], non_blocking=True)
        x = self._forward(b)
        logits = {}
        for kind, o, n in g.kinds:
            logits[kind] = self.model.head(x.index_select(0, buf[g.offset + o: g.offset + o + n]), kind)
        return [None if h is None else logits[h[0]][h[1]: h[1] + h[2]].view(*h[3], -1) for h in g.heads]

    @staticmethod
    def commit(jobs: list[Job], groups: list[Group]) -> None:
        """Advance the caches the step's static forwards wrote (host bookkeeping only)."""
        for g in groups:
            for i in g.jobs:
                if jobs[i].write_cache:
                    jobs[i].cache.grew(jobs[i].width)

    def _bucket(self, key: tuple) -> Bucket:
        b = self.buckets.get(key)
        if b is None:
            R, G, B, T, P = key
            W = table_width(P, self.pool.block_size)
            ints = torch.zeros(4 * R + G * B * T + G * META + G * W, dtype=torch.long, device=self.model.device)
            parts, o = [], 0
            for n in (R, R, R, R, G * B * T, G * META, G * W):
                parts.append(ints[o: o + n])
                o += n
            parts[-2], parts[-1] = parts[-2].view(G, META), parts[-1].view(G, W)
            b = self.buckets[key] = Bucket(ints, StaticBatch(*parts, G, B, T, P))
        return b

    def _forward(self, b: Bucket) -> torch.Tensor:
        if not self.cuda_graphs:
            return static_forward(self.model, self.pool, b.batch)
        self._check_weights()
        if b.graph is None:
            if self.captures - self._dropped >= MAX_GRAPHS:  # bounded graph memory: the rest run unreplayed
                return static_forward(self.model, self.pool, b.batch)
            self._capture(b)
        b.graph.replay()
        return b.out

    def _check_weights(self) -> None:
        ptrs = [p.data_ptr() for p in self.model.parameters()]
        if ptrs != self._weights:
            for b in self.buckets.values():
                b.graph, b.out = None, None
            self._dropped, self._weights = self.captures, ptrs

    def _capture(self, b: Bucket) -> None:
        """Warm up on a side stream (the real inputs: the writes are idempotent), then capture into
        the shared memory pool."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            static_forward(self.model, self.pool, b.batch)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._mempool, capture_error_mode="thread_local"):
            b.out = static_forward(self.model, self.pool, b.batch)
        if self._mempool is None:
            self._mempool = graph.pool()
        b.graph = graph
        self.captures += 1


def static_runner(model: Transformer, config, pool: BlockPool | None) -> StaticRunner | None:
    """The engine's static runner over its paged pool for `config` (None when static shapes are off).
    ConfigError (one line) for CUDA graphs off CUDA or a model static shapes cannot run."""
    if not (config.static_shapes or config.cuda_graphs):
        return None
    what = "cuda_graphs" if config.cuda_graphs else "static_shapes"
    if config.cuda_graphs and model.device.type != "cuda":
        raise ConfigError(f"cuda_graphs=True needs the model on a CUDA device, not {str(model.device)!r}; "
                          f"use static_shapes=True for the same padded steps without graphs")
    why = StaticRunner.supports(model)
    if why is not None or pool is None:
        raise ConfigError(f"{what}=True is not supported for this model: {why}; leave it off")
    return StaticRunner(model, pool, config.cuda_graphs)
