"""`Request`: everything one request owns while it runs; the unit the engine advances.

Invariants:
- all of a request's decoding state lives here (its program's generator frame included, in
  `program_state`), so requests interleave freely and never see each other's state;
- memory is bounded by the request's own length: the prefix cache holds prompt + max_new_tokens
  (+ one block), the logits store one verification batch; `free()` drops all of it on finish/abort;
- `output_ids` only grows, and only with final tokens (a committed or completed block, cut at the
  first stop token); `reported` counts those already handed out in a `RequestDelta`.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import torch

from specfold.decoding.store import LogitsStore
from specfold.outputs import DecodeStats
from specfold.params import EngineConfig, SamplingParams

PHASES = ("waiting", "prefill", "denoise", "commit", "done")


@dataclass
class Counters:
    """Typed per-request counters (written into `DecodeStats.extra` under the same names)."""
    prefill_forwards: int = 0
    commit_forwards: int = 0
    commits_reused: int = 0
    reused_states: int = 0
    drafts_verified: int = 0
    eager_windows: int = 0
    model_seconds: float = 0.0
    draft_seconds: float = 0.0
    node_drafts: Counter = field(default_factory=Counter)
    node_hits: Counter = field(default_factory=Counter)
    fold: dict | None = None  # summed per-layer fold counters (folded verifiers only)

    def add_fold(self, counts: dict | None) -> None:
        if counts is None:
            return
        if self.fold is None:
            self.fold = {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in counts.items()}
            return
        for k, v in counts.items():  # per-layer lists add elementwise, scalar counts add
            old = self.fold.get(k)
            if isinstance(v, (list, tuple)):
                self.fold[k] = list(v) if old is None else [a + b for a, b in zip(old, v)]
            else:
                self.fold[k] = v if old is None else old + v

    def write(self, stats: DecodeStats, delta: float | None = None) -> None:
        ex = stats.extra
        for name in ("prefill_forwards", "commit_forwards", "commits_reused", "reused_states", "drafts_verified",
                     "eager_windows", "model_seconds", "draft_seconds"):
            ex[name] = getattr(self, name)
        ex["node_drafts"] = dict(sorted(self.node_drafts.items()))
        ex["node_hits"] = dict(sorted(self.node_hits.items()))
        if self.fold is not None:
            f = self.fold
            tot = sum(f["positions"])
            ex["fold_ratio"] = sum(f["folded"]) / tot if tot else 0.0
            ex["fold_ratio_per_layer"] = [a / p if p else 0.0 for a, p in zip(f["folded"], f["positions"])]
            ex["ffn_fold_ratio"] = sum(f["ffn_folded"]) / tot if tot else 0.0
            if delta is not None:
                ex["delta"] = delta


class Request:
    def __init__(self, request_id: str, prompt_ids: list[int], params: SamplingParams, config: EngineConfig,
                 stop_ids: set[int], prompt: str | None = None):
        self.id = request_id
        self.prompt = prompt
        self.prompt_ids = list(prompt_ids)
        self.params = params
        self.config = config  # the engine config resolved for this request (block size, steps)
        self.seed = params.seed if params.seed is not None else int.from_bytes(_urandom(), "little")
        self.stop_ids = set(stop_ids) | set(params.stop_token_ids or ())
        self.phase = "waiting"
        self.stats = DecodeStats()
        self.counters = Counters()
        self.arrival = time.perf_counter()
        self.finish_reason: str | None = None
        self.output_ids: list[int] = []
        self.reported = 0  # output ids already handed out
        self.text_reported = 0  # characters of text already handed out
        self.text = ""  # decided text so far (final text once finished)
        self.draft_budget: int | None = None  # the scheduler's cap on draft branches (None = no cap)
        # decoding state (set by the program)
        self.cache = None  # PrefixCache
        self.store = LogitsStore()
        self.seq: torch.Tensor | None = None  # committed tokens by absolute position (eager keys)
        self.align_origin = 0  # absolute position block boundaries are counted from
        self.last_batch = None  # eager: (branch tokens, per-layer hidden, window start) of the last verify
        self.generator: torch.Generator | None = None
        self.program_state = None  # the program's own state (the block program: its generator)
        self.pending = None  # forwards asked for and not run yet
        self.inbox = None  # results of the last forwards, for the program to absorb

    @property
    def limit(self) -> int:
        """Positions at or beyond this are never unmasked."""
        return len(self.prompt_ids) + self.params.max_new_tokens

    @property
    def finished(self) -> bool:
        return self.phase == "done"

    def emit(self, tokens: list[int], mask_id: int) -> bool:
        """Append final tokens, cut at the first stop token (excluded) and at max_new_tokens. Returns
        True when the output is decided (a stop token was reached or the length is used up)."""
        for t in tokens:
            if len(self.output_ids) >= self.params.max_new_tokens:
                break
            if t in self.stop_ids:
                self.finish_reason = "stop"
                return True
            if t == mask_id:
                raise RuntimeError("internal error: a mask token reached the output")
            self.output_ids.append(int(t))
        return len(self.output_ids) >= self.params.max_new_tokens

    def finish(self, reason: str) -> None:
        if self.finish_reason is None or reason == "abort":
            self.finish_reason = reason
        self.phase = "done"
        self.stats.tokens = len(self.output_ids)
        self.stats.seconds = time.perf_counter() - self.arrival
        self.free()

    def free(self) -> None:
        gen = self.program_state
        self.program_state = None
        if gen is not None and hasattr(gen, "close"):
            gen.close()
        self.cache = None
        self.store.clear(0)
        self.seq = self.last_batch = self.pending = self.inbox = None

    def memory_bytes(self) -> int:
        """Bytes held in tensors right now (prefix cache, committed-token buffer, last eager batch)."""
        n = 0
        if self.cache is not None:
            n += self.cache.k.numel() * self.cache.k.element_size() * 2
        if self.seq is not None:
            n += self.seq.numel() * self.seq.element_size()
        for e in self.store._d.values():
            n += e.logits.numel() * e.logits.element_size()
        if self.last_batch is not None and self.last_batch[1] is not None:
            n += sum(h.numel() * h.element_size() for h in self.last_batch[1])
        return n


def _urandom() -> bytes:
    import os
    return os.urandom(4)
