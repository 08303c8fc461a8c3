"""Decode settings: `EngineConfig` (fixed per engine) and `SamplingParams` (per request).

`EngineConfig` holds what is built once per engine (method, rule and its fields, draft policy,
graph, branches, depth, δ, backend, eager, scheduler limits); `SamplingParams` holds what a client
may choose per request (max_new_tokens, temperature, seed, stop strings, stop token ids, chat
template, logprobs). No request field names a server-side file. Each field's help line is written
once, here (`setting(default, help, ...)` metadata): the command-line flags of every command are made
from these fields (args.py), so a field, its default and its help exist in one place.
`DecodeParams` is the pair's fields in one flat object (made from them by `dataclasses.fields`, never
restated), for callers that vary both at once (bench sweeps); `split()` gives the pair.

EngineConfig is validated in two stages. `__post_init__` rejects settings that are impossible for
any model (δ < 0, threshold outside [0, 1], unknown rule names). `resolve(spec)` fills unset fields
from the model family's defaults and rejects settings impossible for this model (block not a
multiple of the sub-block, eager on a model that is not block-causal); `for_request` adds the checks
that need the request's max_new_tokens. Nothing is silently clamped.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from specfold.errors import ParamsError

RULES = ("static", "threshold", "sub_block", "dynamic", "llada", "dream", "llada2", "llada2_edit")
CONFIDENCES = ("max_prob", "margin", "neg_entropy")


# The limits of a request, the same in the API, the CLI and the server (serve/protocol.py reads these):
MAX_LOGPROBS = 20  # SamplingParams.logprobs: most alternatives per token (vLLM's default max_logprobs)
MAX_TEMPERATURE = 2.0  # OpenAI's range for temperature: [0, 2]
MAX_SEED = 2**63  # seeds are in [0, MAX_SEED): the one rule of the API, the CLI and the server


def seed_error(v) -> str | None:
    """The one-line refusal of a seed that is not an integer in [0, 2**63) (None: `v` is a valid seed)."""
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < MAX_SEED:
        return None
    return f"seed must be an integer in [0, 2**63), got {v!r}"


def steps_for(steps: int, max_new_tokens: int, minimal_topk: int = 1) -> int:
    """LLaDA2.0's steps per block: `steps` capped at `max_new_tokens // minimal_topk` (the official
    cap; decoding/rules_llada2.py re-exports it)."""
    return min(steps, max_new_tokens // minimal_topk)


def setting(default, help: str, *, choices: tuple | None = None, draft: bool = False, cli_default=dataclasses.MISSING,
            metavar: str | None = None):
    """A settings field with its metadata: `help` (the one line the flags show), `choices` (the accepted
    values, checked in `__post_init__` and offered by the flag), `draft` (read only by draft policies
    and verifiers: vanilla ignores it), `cli_default` (the commands' default where it differs from the
    API's), `metavar` (the flag's placeholder)."""
    meta = {"help": help, "choices": choices, "draft": draft, "metavar": metavar}
    if cli_default is not dataclasses.MISSING:
        meta["cli_default"] = cli_default
    return field(default=default, metadata=meta)


def draft_fields(cls) -> tuple[str, ...]:
    """The fields of `cls` read only by draft policies and verifiers (metadata `draft`)."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("draft"))


def _check_choices(obj) -> None:
    for f in dataclasses.fields(obj):
        choices, v = f.metadata.get("choices"), getattr(obj, f.name)
        if choices and v is not None and v not in choices:
            raise ParamsError(f"unknown {f.name} {v!r}; accepted: {list(choices)}")


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(name: str, v) -> int:
    """A byte count: an int, or a string such as "2GiB", "512MB", "1.5 GiB" or "1000000"."""
    if isinstance(v, int) and not isinstance(v, bool) and v > 0:
        return v
    if isinstance(v, str):
        s = v.strip().lower().replace(" ", "")
        num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = s[len(num):]
        try:
            n = int(float(num) * _UNITS[unit])
        except (ValueError, KeyError):
            n = 0
        if n > 0:
            return n
    raise ParamsError(f"{name} must be a positive number of bytes such as 2GiB, 512MB or 1000000, got {v!r}")


def _int(name: str, v, lo: int | None = None) -> None:
    if not isinstance(v, int) or isinstance(v, bool):
        raise ParamsError(f"{name} must be an integer, got {v!r}")
    if lo is not None and v < lo:
        raise ParamsError(f"{name} must be >= {lo}, got {v}")


@dataclass(slots=True)
class SamplingParams:
    """What one request asks for. `seed=None` draws a fresh seed when the request is added (recorded
    in the request); `stop` strings cut the text before the first match (finish reason "stop");
    `stop_token_ids` add to the model's own stop tokens. `logprobs=N` (0..20; None = off) returns,
    per output token, its log-probability in the forward that committed it and the N most likely
    tokens there (`RequestOutput.logprobs`; docs/SERVING.md says what the numbers mean)."""
    max_new_tokens: int = setting(256, "tokens generated at most")
    temperature: float = setting(0.0, f"0 = greedy; above: sampled (at most {MAX_TEMPERATURE:g})")
    seed: int | None = setting(None, "seed of the sampling at temperature > 0 (unset: drawn per request; the "
                                     "commands use 0, so a run repeats)", cli_default=0)
    stop: list[str] | None = setting(None, "a stop string: the text is cut before its first match (repeatable)",
                                     metavar="TEXT")
    stop_token_ids: list[int] | None = setting(None, "token ids that end the answer, beside the model's own "
                                                     "(comma-separated)", metavar="ID,ID,...")
    chat_template: bool = setting(False, "wrap a string prompt as one user message through the checkpoint's chat "
                                         "template (the commands do unless --no-chat-template)", cli_default=True)
    logprobs: int | None = setting(None, f"per output token, the log-probabilities of the chosen token and the N "
                                         f"most likely (0..{MAX_LOGPROBS}; unset: none)", metavar="N")

    def __post_init__(self) -> None:
        _int("max_new_tokens", self.max_new_tokens, 1)
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)):
            raise ParamsError(f"temperature must be a number, got {self.temperature!r}")
        if not 0 <= self.temperature <= MAX_TEMPERATURE:
            raise ParamsError(f"temperature must be a number in [0, {MAX_TEMPERATURE:g}], got {self.temperature}")
        self.temperature = float(self.temperature)
        if self.seed is not None and seed_error(self.seed):
            raise ParamsError(seed_error(self.seed))
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is not None:
            if not isinstance(self.stop, (list, tuple)) or not all(isinstance(x, str) and x for x in self.stop):
                raise ParamsError(f"stop must be a non-empty string or a list of non-empty strings, got {self.stop!r}")
            self.stop = list(self.stop)
        if self.stop_token_ids is not None:
            if not isinstance(self.stop_token_ids, (list, tuple)):
                raise ParamsError(f"stop_token_ids must be a list of integers, got {self.stop_token_ids!r}")
            for t in self.stop_token_ids:
                _int("stop_token_ids[i]", t, 0)
            self.stop_token_ids = list(self.stop_token_ids)
        if not isinstance(self.chat_template, bool):
            raise ParamsError(f"chat_template must be true or false, got {self.chat_template!r}")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or isinstance(self.logprobs, bool)
                                          or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise ParamsError(f"logprobs must be an integer in [0, {MAX_LOGPROBS}] (alternatives per token) or "
                              f"None (off), got {self.logprobs!r}")

    def replace(self, **kw) -> "SamplingParams":
        return dataclasses.replace(self, **kw)


@dataclass(slots=True)
class EngineConfig:
    """Engine-wide decode settings, fixed when the engine is built (policy and verifier built once).

    Scheduling: at most `max_num_seqs` requests run at once and at most `max_waiting` wait (more is
    refused with `EngineFull`); one step runs forwards of at most `max_num_batched_tokens` token rows
    (always at least one forward). `draft_budget`: the drafts a verification verifies, "auto" (a
    bandit over the budgets 0, 1, 2 and 4 that measures positions filled per second of the steps,
    per batch size: engine/budget.py) or an integer N >= 0 (the first N of the policy's list; 0 = no
    drafts). Budgets change speed, never tokens.
    KV memory: every request's K/V live in blocks of `kv_block_size` positions of one preallocated
    pool of `kv_cache_memory` bytes (an int or a string such as "2GiB"; unset: `gpu_memory_utilization`
    (0.9) of the GPU's memory less what is in use once the weights are loaded, on CUDA, or an eighth of the
    RAM on the CPU, capped at what `max_num_seqs` requests of the full context need; logged). A request
    is admitted when its prompt's blocks and one more are free; when a running request needs a block
    and none is free, the most recently admitted one is preempted (it resumes later with the same
    tokens). `enable_prefix_caching` (None: on where exact, engine/kv.py) shares the blocks of equal
    prompt prefixes between requests. `static_shapes`: the runner pads the step's dense forwards to
    bucket sizes (engine/graphs.py), reading K/V through block tables; the tokens are the same.
    `cuda_graphs` (CUDA only; implies static_shapes) also captures one CUDA graph per bucket and
    replays it."""
    method: str = setting("vanilla", "decode method: vanilla or a speculative one")
    rule: str | None = setting(None, "unmask rule (unset: the model family's)", choices=RULES)
    block_size: int | None = setting(None, "positions decoded as one block (unset: the family's)")
    sub_block_size: int | None = setting(None, "rule sub_block: positions of a sub-block (unset: the family's)")
    tokens_per_step: int | None = setting(None, "k of the static / dynamic rules (unset: the family's)")
    threshold: float | None = setting(None, "confidence threshold of the threshold rules, in [0, 1] (unset: the "
                                            "family's)")
    threshold_ge: bool | None = setting(None, "unmask at confidence >= threshold instead of > (Nemotron-Labs-"
                                              "Diffusion, FreeDave; unset: the family's)")
    confidence: str | None = setting(None, "the confidence the rules rank by (unset: the family's)",
                                     choices=CONFIDENCES)
    steps: int | None = setting(None, "llada / llada2: steps per block; dream: total steps")
    edit_threshold: float | None = setting(None, "llada2_edit: a written token is rewritten when p > this")
    max_post_steps: int | None = setting(None, "llada2_edit: forwards a block may run once it has no mask")
    early_stop: bool = setting(True, "stop denoising a block once a stop token is committed with no mask before it")
    # speculative decoding (FreeDave, Spiffy) and SpecFold
    draft_depth: int = setting(8, "FreeDave: draft chain depth, in [1, 64]", draft=True)
    eager: bool = setting(False, "drafts may reach into the next block (block-causal models)", draft=True)
    branches: int = setting(7, "Spiffy / SpecFold / LinearSpec: draft branches, in [1, 64]", draft=True)
    graph: object = setting(None, "Spiffy draft graph JSON (a path or DraftGraph, resolved at load, never from a "
                                  "client; unset: the one shipped for the model and rule)", draft=True, metavar="PATH")
    graph_depth: int | None = setting(None, "Spiffy / SpecFold: only the graph's nodes at most this deep (unset: all)",
                                      draft=True)
    delta: float = setting(0.05, "SpecFold fold threshold δ >= 0 (0 = exact; 0.05: the sweep in BENCHMARKS.md)",
                           draft=True)
    drafts: str = setting("spiffy", "SpecFold's draft policy", choices=("spiffy", "freedave"), draft=True)
    backend: str = setting("torch", "SpecFold kernels", choices=("torch", "triton"), draft=True)
    # scheduling and the runner
    max_num_seqs: int = setting(64, "requests decoded at once")
    max_waiting: int = setting(256, "requests queued beyond those; more are refused (EngineFull; the server's 429)")
    max_num_batched_tokens: int = setting(8192, "token rows of one engine step (at least one forward always runs)")
    draft_budget: int | str = setting("auto", "drafts a verification verifies: 'auto' (a bandit over 0, 1, 2 and 4 "
                                              "that measures the steps on this machine) or N >= 0 (the first N; "
                                              "0 = none); tokens never change", draft=True, metavar="auto|N")
    static_shapes: bool = setting(False, "each step's packed rows and KV lengths padded to "
                                         "buckets (the same tokens)")
    cuda_graphs: bool = setting(False, "CUDA only: one captured CUDA graph per bucket (implies static_shapes)")
    kv_cache_memory: int | str | None = setting(None, "bytes of the paged KV pool, e.g. 2GiB or 1000000 (unset: "
                                                      "gpu_memory_utilization of the GPU after the weights on CUDA, "
                                                      "an eighth of the RAM on the CPU)", metavar="BYTES")
    gpu_memory_utilization: float | None = setting(None, "CUDA, kv_cache_memory unset: the share of the GPU's "
                                                        "memory the process may fill, in (0, 1] (unset: 0.9)")
    kv_block_size: int = setting(16, "positions per KV block")
    enable_prefix_caching: bool | None = setting(None, "share the KV blocks of equal prompt prefixes (unset: on "
                                                       "where exact)")

    def __post_init__(self) -> None:
        _check_choices(self)
        if self.threshold is not None and not 0.0 <= self.threshold <= 1.0:
            raise ParamsError(f"threshold must be in [0, 1] (0 = unmask every candidate), got {self.threshold}")
        if self.edit_threshold is not None and not 0.0 <= self.edit_threshold <= 1.0:
            raise ParamsError(f"edit_threshold must be in [0, 1] (0 = rewrite every changed token), "
                              f"got {self.edit_threshold}")
        if self.max_post_steps is not None:
            _int("max_post_steps", self.max_post_steps, 0)
        for name in ("block_size", "sub_block_size", "tokens_per_step", "steps"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ParamsError(f"{name} must be a positive integer, got {v}")
        if self.delta < 0:
            raise ParamsError(f"delta must be >= 0 (0 = dense verification), got {self.delta}")
        if not 1 <= self.draft_depth <= 64:
            raise ParamsError(f"draft_depth must be in [1, 64], got {self.draft_depth}")
        if not 1 <= self.branches <= 64:
            raise ParamsError(f"branches must be in [1, 64], got {self.branches}")
        if self.graph_depth is not None and not 1 <= self.graph_depth <= 64:
            raise ParamsError(f"graph_depth must be in [1, 64] (or unset: every node), got {self.graph_depth}")
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            _int(name, getattr(self, name), 1)
        _int("max_waiting", self.max_waiting, 0)
        for name in ("static_shapes", "cuda_graphs"):
            if not isinstance(getattr(self, name), bool):
                raise ParamsError(f"{name} must be true or false, got {getattr(self, name)!r}")
        self.static_shapes = self.static_shapes or self.cuda_graphs
        if self.kv_cache_memory is not None:
            self.kv_cache_memory = parse_bytes("kv_cache_memory", self.kv_cache_memory)
        u = self.gpu_memory_utilization
        if u is not None and (isinstance(u, bool) or not isinstance(u, (int, float)) or not 0 < u <= 1):
            raise ParamsError(f"gpu_memory_utilization must be a number in (0, 1], got {self.gpu_memory_utilization!r}")
        _int("kv_block_size", self.kv_block_size, 1)
        if self.enable_prefix_caching is not None and not isinstance(self.enable_prefix_caching, bool):
            raise ParamsError(f"enable_prefix_caching must be true, false or unset, got {self.enable_prefix_caching!r}")
        if self.draft_budget != "auto":
            if isinstance(self.draft_budget, str) and self.draft_budget.strip().isdigit():
                self.draft_budget = int(self.draft_budget)
            if not isinstance(self.draft_budget, int) or isinstance(self.draft_budget, bool) or self.draft_budget < 0:
                raise ParamsError(f"draft_budget must be 'auto' or an integer >= 0 (0 = no drafts), "
                                  f"got {self.draft_budget!r}")

    def replace(self, **kw) -> "EngineConfig":
        return dataclasses.replace(self, **kw)

    def resolve(self, spec) -> "EngineConfig":
        """A copy with the rule fields set from the family's defaults. The Dream rule with no block
        size decodes the whole canvas as one block, so its block size (and steps) are per request:
        they stay None here and `for_request` fills them."""
        p = dataclasses.replace(self)
        p.rule = p.rule or spec.rule
        if p.rule == "dream" and spec.attention != "bidirectional":
            raise ParamsError(f"rule 'dream' decodes the whole answer as one bidirectional canvas: it is for "
                              f"bidirectional models (Dream, LLaDA), not {spec.family} ({spec.attention} "
                              f"attention); use this family's default rule ({spec.rule!r}) or another one")
        if p.rule == "dream" and p.block_size is None:
            return p  # the canvas size is the request's max_new_tokens: resolved per request
        return p._resolve_block(spec)

    def _resolve_block(self, spec) -> "EngineConfig":
        p = self
        p.block_size = p.block_size or spec.block_size
        if p.sub_block_size is None:
            p.sub_block_size = spec.sub_block_size if p.rule == "sub_block" else None
        if p.rule == "sub_block" and p.sub_block_size is None:
            raise ParamsError("rule 'sub_block' needs sub_block_size (the model's config has none)")
        if p.sub_block_size is not None and p.block_size % p.sub_block_size:
            raise ParamsError(f"block_size={p.block_size} is not a multiple of sub_block_size={p.sub_block_size}")
        p.tokens_per_step = p.tokens_per_step or spec.tokens_per_step
        if p.tokens_per_step > p.block_size:
            raise ParamsError(f"tokens_per_step={p.tokens_per_step} exceeds block_size={p.block_size}")
        p.threshold = spec.threshold if p.threshold is None else p.threshold
        p.threshold_ge = spec.threshold_ge if p.threshold_ge is None else p.threshold_ge
        p.confidence = p.confidence or spec.confidence
        if p.steps is None and p.rule in ("llada", "dream"):
            p.steps = p.block_size
        if p.steps is None and p.rule == "llada2":
            p.steps = spec.steps or p.block_size
        p.edit_threshold = spec.edit_threshold if p.edit_threshold is None else p.edit_threshold
        p.max_post_steps = spec.max_post_steps if p.max_post_steps is None else p.max_post_steps
        if p.eager and p.rule in ("llada2", "llada2_edit"):
            raise ParamsError(f"eager windows are not supported with rule {p.rule!r} (LLaDA2 decodes its last "
                              f"block in full and, under llada2_edit, edits a block until it settles); drop eager")
        if p.eager and spec.attention != "block_causal":
            raise ParamsError(f"eager mode needs a block-causal model; {spec.family} uses {spec.attention!r}")
        return p

    def for_request(self, spec, max_new_tokens: int, whole_blocks: bool = True) -> "EngineConfig":
        """The settings one request decodes with (resolved; the Dream canvas sized to the request).
        `whole_blocks`: the program decodes whole blocks (the diffusion modes; the causal programs
        do not), so a family that only decodes whole blocks needs max_new_tokens to be a multiple."""
        p = self if self.block_size is not None else dataclasses.replace(self, block_size=max_new_tokens)._resolve_block(spec)
        if whole_blocks and spec.max_new_tokens_multiple_of_block and max_new_tokens % p.block_size:
            raise ParamsError(f"{spec.family} decodes whole blocks: max_new_tokens={max_new_tokens} must be "
                              f"a multiple of block_size={p.block_size}")
        if p.rule == "llada2" and p.steps is not None and steps_for(p.steps, max_new_tokens) != p.steps:
            p = dataclasses.replace(p, steps=steps_for(p.steps, max_new_tokens))
        return p


class _Joined:
    """The methods of `DecodeParams` (its fields are made below from EngineConfig's and SamplingParams')."""
    __slots__ = ()

    def __post_init__(self) -> None:
        self.split()  # validates both halves

    def replace(self, **kw) -> "DecodeParams":
        return dataclasses.replace(self, **kw)

    def split(self) -> tuple[EngineConfig, SamplingParams]:
        """The engine-wide part and the per-request part of these settings."""
        return tuple(cls(**{f.name: getattr(self, f.name) for f in dataclasses.fields(cls)})
                     for cls in (EngineConfig, SamplingParams))

    @classmethod
    def join(cls, config: EngineConfig, sampling: SamplingParams) -> "DecodeParams":
        """The inverse of `split`."""
        return cls(**{f.name: getattr(half, f.name) for half in (config, sampling) for f in dataclasses.fields(half)})

    def resolve(self, spec) -> EngineConfig:
        """The engine config resolved for `spec` and these settings' max_new_tokens."""
        cfg, sp = self.split()
        return cfg.resolve(spec).for_request(spec, sp.max_new_tokens, whole_blocks=False)


# every field of EngineConfig, then of SamplingParams, with its type, default and metadata (no name is in both)
DecodeParams = dataclasses.make_dataclass(
    "DecodeParams", [(f.name, f.type, field(default=f.default, metadata=f.metadata))
                     for cls in (EngineConfig, SamplingParams) for f in dataclasses.fields(cls)],
    bases=(_Joined,), slots=True, namespace={"__module__": __name__, "__doc__": (
        "EngineConfig's and SamplingParams' fields in one object (the same names, types and defaults), "
        "for callers that vary both at once; `split()` gives the pair, `join(config, sampling)` the "
        "inverse; every check is theirs. `LLM.generate(prompts, DecodeParams)` builds (and keeps) an "
        "engine for its EngineConfig half.")})
