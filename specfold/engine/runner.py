"""The model runner: the jobs of one engine step -> their host results, in one packed model call,
one host-to-device copy and one device-to-host read.

1. Every job's integer data (branch tokens, positions, head rows: shared window indices or
   per-branch flat rows) goes to the device in ONE copy (from pinned memory on CUDA); masks are
   made on the device from the positions.
2. With a dense verifier (`packs_with_model`) every forward of the step (prefill, verify, commit)
   runs in ONE `Transformer.forward_many` call. Otherwise the verify forwards with drafts go through
   `verifier.verify_many` and the rest through one `forward_many`. Root-only verifications join
   the dense call (a verifier only changes how draft rows are computed). Reuse jobs (eager commits)
   write K/V from earlier hidden states first. With static shapes (EngineConfig.static_shapes /
   cuda_graphs) the forwards that can run padded to a bucket (engine/graphs.py: dense, against a
   pool slot, no hidden states returned) do, their integers riding in the same one copy; the rest
   run as above in the same step.
3. Every job's `Read` is computed on the device (decoding/readout.py) over its logits rows; the
   reads of all jobs are concatenated and copied to the host at once: the step's only read, apart
   from the folded verifier's gate (one per layer).
"""
from __future__ import annotations

import torch

from specfold.decoding.jobs import Job, JobResult
from specfold.decoding.layout import build_mask, is_full
from specfold.decoding.readout import Read, read_rows, split_rows
from specfold.engine.graphs import StaticRunner
from specfold.models.forward import Forward, ForwardResult, upload
from specfold.models.transformer import Transformer


class ModelRunner:
    def __init__(self, model: Transformer, verifier, mask_id: int, static: StaticRunner | None = None):
        self.model, self.verifier, self.M = model, verifier, mask_id
        self.device = model.device
        self.static = static  # static-shape buckets / CUDA graphs (engine/graphs.py), when on
        self.reads = True  # False on tensor-parallel ranks other than 0 (engine/mirror.py): rank 0 reads

    def run(self, jobs: list[Job]) -> list[JobResult]:
        if not jobs:
            return []
        logits: list[torch.Tensor | None] = [None] * len(jobs)
        results: list[ForwardResult | None] = [None] * len(jobs)
        for i, j in enumerate(jobs):
            if j.kind == "reuse":  # first: a forward of the same request reads what it writes
                logits[i] = self._reuse(j)
        groups = self._static_groups(jobs)
        fixed = {i for g in groups for i in g.jobs}
        forwards, buf = self._to_device(jobs, fixed, groups)
        idx = [i for i, j in enumerate(jobs) if j.kind != "reuse" and i not in fixed]
        for i, r in zip(idx, self._forward([forwards[i] for i in idx])):
            results[i], logits[i] = r, r.logits
        for g in groups:
            for i, lg in zip(g.jobs, self.static.run(g, buf)):
                logits[i] = lg
        if groups:
            self.static.commit(jobs, groups)
        rows = self._read(jobs, logits) if self.reads else [[] for _ in jobs]
        return [JobResult(rows[i], r.hidden if r is not None else None, r.stats if r is not None else None)
                for i, r in enumerate(results)]

    # ------------------------------------------------------------------ host -> device
    def _static_groups(self, jobs: list[Job]) -> list:
        """The jobs that run with static shapes, grouped into buckets (host data only)."""
        if self.static is None:
            return []
        v = self.verifier
        folds = v is not None and not v.packs_with_model  # its verify forwards with drafts stay its own
        ok = [i for i, j in enumerate(jobs)
              if self.static.eligible(j) and not (folds and j.kind == "verify" and len(j.tokens) > 1)]
        return self.static.plan(jobs, ok) if ok else []

    def _to_device(self, jobs: list[Job], skip: set[int], groups: list) -> tuple[list[Forward | None], torch.Tensor]:
        """Every eager job's integers, then every static group's, in ONE host-to-device copy."""
        flat: list[int] = []
        for i, j in enumerate(jobs):
            if j.kind == "reuse" or i in skip:
                continue
            for t in j.tokens:
                flat += t
            flat += range(j.start, j.start + j.width)  # positions: in the same copy, no arange kernel
            flat += (j.rows_at if j.rows_at is not None else j.logits_at) or []
        for g in groups:
            g.offset = len(flat)
            flat += g.ints
        buf = upload(flat, self.device)
        out: list[Forward | None] = []
        o = 0
        for i, j in enumerate(jobs):
            if j.kind == "reuse" or i in skip:
                out.append(None)
                continue
            B, T = len(j.tokens), j.width
            toks = buf[o: o + B * T].view(B, T)
            pos = buf[o + B * T: o + B * T + T]
            o += B * T + T
            sel = j.rows_at if j.rows_at is not None else j.logits_at
            k = len(sel or [])
            at = buf[o: o + k] if sel is not None else None
            o += k
            mask = None if is_full(j.mask, j.start, T) else build_mask(j.mask, pos)
            per_branch = j.rows_at is not None
            out.append(Forward(toks, pos, j.cache, mask, j.write_cache, None if per_branch else at, j.head,
                               list(j.parents), j.return_hidden, j.kind, at if per_branch else None))
        return out, buf

    # ------------------------------------------------------------------ the model
    def _forward(self, forwards: list[Forward]) -> list[ForwardResult]:
        v = self.verifier
        if v is None or v.packs_with_model:
            return self.model.forward_many(forwards) if forwards else []
        out: list[ForwardResult | None] = [None] * len(forwards)
        ver = [i for i, f in enumerate(forwards) if f.kind == "verify" and f.tokens.shape[0] > 1]
        rest = [i for i in range(len(forwards)) if i not in set(ver)]
        for idx, res in ((rest, self.model.forward_many([forwards[i] for i in rest]) if rest else []),
                         (ver, v.verify_many([forwards[i] for i in ver]) if ver else [])):
            for i, r in zip(idx, res):
                out[i] = r
        return out

    def _reuse(self, job: Job) -> torch.Tensor | None:
        """An eager commit: K/V from the kept hidden states; the head on the last row when read."""
        *layers, final = job.hidden.rows()
        self.model.write_kv(job.cache, layers, torch.arange(job.start, job.start + job.width, device=self.device))
        return self.model.head(final[-1:], job.head)[None] if job.read is not None else None

    # ------------------------------------------------------------------ device -> host
    def _read(self, jobs: list[Job], logits: list[torch.Tensor | None]) -> list[list]:
        """Every job's read in one device-to-host copy. Jobs whose reads have the same layout share
        one `read_rows` call over their concatenated rows (every read is row-wise, so a row's values
        do not depend on its partners): at T = 0 a step issues as many read kernels for 16 requests as
        for 1 (at T > 0 the keyed noise is still drawn row by row)."""
        groups: dict[tuple, list[int]] = {}
        for i, (j, lg) in enumerate(zip(jobs, logits)):
            if j.read is not None and lg is not None and lg.shape[0] * lg.shape[1]:
                r = j.read
                groups.setdefault((r.kind, r.temperature, r.topk, r.probs, r.logprobs), []).append(i)
        parts, spans, o = [], {}, 0
        for idx in groups.values():
            rows = [logits[i].reshape(-1, logits[i].shape[-1]) for i in idx]
            r0 = jobs[idx[0]].read
            keys = None if r0.keys is None else [k for i in idx for k in jobs[i].read.keys]
            read = Read(r0.kind, r0.temperature, r0.topk, r0.probs, keys, r0.logprobs)
            # owned: the logits are the step's own (no result carries them), so masking may be in place
            parts.append(read_rows(rows[0] if len(rows) == 1 else torch.cat(rows), self.M, read, owned=True).reshape(-1))
            for i, x in zip(idx, rows):
                spans[i] = (o, x.shape[0])
                o += x.shape[0] * read.width
        flat = (parts[0] if len(parts) == 1 else torch.cat(parts)).tolist() if parts else []  # the step's one read
        out = []
        for i, j in enumerate(jobs):
            if i in spans:
                a, n = spans[i]
                out.append(split_rows(flat[a: a + n * j.read.width], n, j.read))
            else:
                out.append([])
        return out
