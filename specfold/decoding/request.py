"""What a decode program reads and writes of one request: `DecodeRequest` and its typed `Counters`.

The engine's `Request` (engine/request.py) is a `DecodeRequest` plus scheduling and streaming
fields. A program keeps its own per-request state in `req.state` (a typed object the program
defines: `BlockState`, `CausalState`), never in loose attributes, and hands final tokens to the
request with `emit`, the one place where outputs are cut at a stop token and at max_new_tokens.

Invariants:
- `output_ids` only grows, and only with final tokens, never more than max_new_tokens and nothing
  from the first stop token on;
- the seed is fixed when the request is made (drawn when SamplingParams has none).
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

from specfold.outputs import DecodeStats
from specfold.params import EngineConfig, SamplingParams


@dataclass
class Counters:
    """Typed per-request counters (written into `DecodeStats.extra` under the same names)."""
    prefill_forwards: int = 0
    commit_forwards: int = 0
    commits_reused: int = 0
    reused_states: int = 0
    drafts_verified: int = 0
    eager_windows: int = 0
    filled: int = 0  # positions the rule filled (the progress the draft-budget chooser measures)
    model_seconds: float = 0.0
    draft_seconds: float = 0.0
    node_drafts: Counter = field(default_factory=Counter)
    node_hits: Counter = field(default_factory=Counter)
    budgets: Counter = field(default_factory=Counter)  # drafts verified -> verifications (the chosen budgets)
    fold: dict | None = None  # summed per-layer fold counters (folded verifiers only)
    prefix_cache_hit_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache
    preemptions: int = 0  # times the engine preempted the request (it resumed with the same tokens)

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

    def write(self, stats: DecodeStats, fold_report=None) -> None:
        """Into `stats.extra`; `fold_report(counts) -> dict` derives the fold ratios (the verifier's)."""
        ex = stats.extra
        for name in ("prefill_forwards", "commit_forwards", "commits_reused", "reused_states", "drafts_verified",
                     "eager_windows", "model_seconds", "draft_seconds", "prefix_cache_hit_tokens", "preemptions"):
            ex[name] = getattr(self, name)
        ex["node_drafts"] = dict(sorted(self.node_drafts.items()))
        ex["node_hits"] = dict(sorted(self.node_hits.items()))
        ex["draft_budgets"] = dict(sorted(self.budgets.items()))
        if self.fold is not None and fold_report is not None:  # ratios are None where no draft was verified
            ex.update(fold_report(self.fold))


class DecodeRequest:
    def __init__(self, prompt_ids: list[int], params: SamplingParams, config: EngineConfig, stop_ids: set[int]):
        self.prompt_ids = list(prompt_ids)
        self.params = params
        self.config = config  # the engine config resolved for this request (block size, steps)
        self.seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(4), "little")
        self.stop_ids = set(stop_ids) | set(params.stop_token_ids or ())
        self.stats = DecodeStats()
        self.counters = Counters()
        self.finish_reason: str | None = None
        self.output_ids: list[int] = []
        # per output token, {token id: log-probability} from the forward that committed it (when asked)
        self.output_logprobs: list[dict[int, float]] | None = [] if params.logprobs is not None else None
        self.state = None  # the program's typed per-request state
        self.cache = None  # the request's PrefixCache (the program makes it)
        # what the program prefills: the prompt, and after a preemption the prompt + committed output
        self.context_ids = self.prompt_ids

    @property
    def limit(self) -> int:
        """Positions at or beyond this are never unmasked."""
        return len(self.prompt_ids) + self.params.max_new_tokens

    def emit(self, tokens: list[int], mask_id: int, logprobs: list | None = None) -> bool:
        """Append final tokens, cut at the first stop token (excluded) and at max_new_tokens. Returns
        True when the output is decided (a stop token was reached or the length is used up).
        `logprobs`: per token, its {token id: log-probability} (kept when the request asked for them)."""
        keep = self.output_logprobs
        for i, t in enumerate(tokens):
            if len(self.output_ids) >= self.params.max_new_tokens:
                break
            if t in self.stop_ids:
                self.finish_reason = "stop"
                return True
            if t == mask_id:
                raise RuntimeError("internal error: a mask token reached the output")
            self.output_ids.append(int(t))
            if keep is not None:
                if logprobs is None or logprobs[i] is None:
                    raise RuntimeError("internal error: a final token without its log-probabilities")
                keep.append(logprobs[i])
        return len(self.output_ids) >= self.params.max_new_tokens
