"""What a Ray deployment or Ray Data processor of specfold runs, as plain data (no ray import).

`SpecfoldLLMConfig` (Serve: N engine replicas behind one OpenAI ingress) and `SpecfoldProcessorConfig`
(Ray Data: one engine per actor) follow the shape of Ray's `LLMConfig` and engine processor configs:
a model source, engine settings, and per-replica resources.

Invariants:
- Both configs are picklable plain data, checked in `__post_init__`: a bad value is one ParamsError
  line naming the field and what is accepted, raised on the driver before anything is deployed.
- Engine settings (`EngineConfig`) are fixed per replica; requests choose only `SamplingParams`.
- A replica reserves `num_cpus` and `num_gpus` from Ray and runs torch with `torch_threads` threads
  (default: `num_cpus` rounded down, at least 1), set before its model is loaded.
- `deployment_options()` is the only mapping onto Ray Serve's deployment options; fields given in
  `deployment_config` override it, as in Ray's LLMConfig.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from specfold.errors import ParamsError


def _positive(name: str, v, integer: bool = False, zero: bool = False) -> None:
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok or not math.isfinite(v) or v < 0 or (v == 0 and not zero):
        what = "an integer" if integer else "a number"
        raise ParamsError(f"{name} must be {what} {'>= 0' if zero else '> 0'}, got {v!r}")


@dataclass
class EngineSpec:
    """Where an engine comes from: the checkpoint, how it is loaded, and its engine settings."""
    model_source: str = "tiny"  # a local HuggingFace folder (on every node), or "tiny"
    engine_config: object = None  # an EngineConfig; None: EngineConfig(**engine_kwargs)
    engine_kwargs: dict = field(default_factory=dict)
    llm_kwargs: dict = field(default_factory=dict)  # LLM(...) keywords: dtype, device, overrides
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    torch_threads: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model_source, str) or not self.model_source:
            raise ParamsError(f"model_source must be a checkpoint folder or 'tiny', got {self.model_source!r}")
        _positive("num_cpus", self.num_cpus)
        _positive("num_gpus", self.num_gpus, zero=True)
        if self.torch_threads is not None:
            _positive("torch_threads", self.torch_threads, integer=True)
        unknown = set(self.llm_kwargs) - {"dtype", "device", "overrides"}
        if unknown:
            raise ParamsError(f"unknown llm_kwargs {sorted(unknown)}; accepted: ['device', 'dtype', 'overrides']")
        device = str(self.llm_kwargs.get("device", "cpu"))
        if self.num_gpus > 0 and not device.startswith("cuda"):
            raise ParamsError(f"num_gpus={self.num_gpus} reserves a GPU but the engine runs on {device!r}: "
                              f"set device 'cuda' (--device cuda)")
        if device.startswith("cuda") and self.num_gpus == 0:
            raise ParamsError("device 'cuda' needs a GPU per replica: set num_gpus (--replica-gpus), e.g. 1")
        if self.engine_config is not None and self.engine_kwargs:
            raise ParamsError("give engine_config or engine_kwargs, not both")
        self.engine()  # bad engine settings fail here, on the driver

    @property
    def threads(self) -> int:
        return self.torch_threads or max(1, int(self.num_cpus))

    def engine(self):
        """The EngineConfig every replica builds its engine with."""
        from specfold.params import EngineConfig
        return self.engine_config if self.engine_config is not None else EngineConfig(**self.engine_kwargs)

    def actor_options(self) -> dict:
        return {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}

    def load(self):
        """The LLM of this spec, in the calling process (a replica or an actor): threads first."""
        import torch

        from specfold.api import LLM
        torch.set_num_threads(self.threads)
        llm = LLM(self.model_source, **self.llm_kwargs)
        llm.engine_config = self.engine()
        return llm


@dataclass
class SpecfoldLLMConfig(EngineSpec):
    """One served model: `num_replicas` engines (or `min_replicas`..`max_replicas`, autoscaled)."""
    model_id: str | None = None  # the `model` clients pass (default: model_source)
    num_replicas: int | None = None  # fixed count (default 1), or the initial count when autoscaling
    min_replicas: int | None = None  # either bound given: Serve autoscales within them
    max_replicas: int | None = None
    max_tokens: int = 256  # requests without max_tokens
    temperature: float = 0.0  # requests without temperature
    health_check_period_s: float = 2.0  # Serve's replica health checks; also the /health refresh
    server_kwargs: dict = field(default_factory=dict)  # more ServeConfig fields: api_key, max_body_bytes
    deployment_config: dict = field(default_factory=dict)  # Serve options overriding deployment_options()

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("num_replicas", "min_replicas", "max_replicas"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name), integer=True, zero=name == "min_replicas")
        lo, hi = self.bounds
        if lo > hi:
            raise ParamsError(f"min_replicas={lo} exceeds max_replicas={hi}")
        if self.num_replicas is not None and not lo <= self.num_replicas <= hi:
            raise ParamsError(f"num_replicas={self.num_replicas} (the initial count when autoscaling) must lie "
                              f"in [min_replicas, max_replicas] = [{lo}, {hi}]")
        _positive("max_tokens", self.max_tokens, integer=True)
        _positive("health_check_period_s", self.health_check_period_s)
        unknown = set(self.server_kwargs) - {"api_key", "max_body_bytes"}
        if unknown:
            raise ParamsError(f"unknown server_kwargs {sorted(unknown)}; accepted: ['api_key', 'max_body_bytes']")
        from specfold.params import SamplingParams
        SamplingParams(temperature=self.temperature)  # the API's limits (params.py), its message

    @property
    def name(self) -> str:
        return self.model_id or self.model_source

    @property
    def autoscaling(self) -> bool:
        return self.min_replicas is not None or self.max_replicas is not None

    @property
    def bounds(self) -> tuple[int, int]:
        """(min, max) replicas: the autoscaling bounds, or the fixed count twice."""
        n = self.num_replicas
        if not self.autoscaling:
            return (n or 1, n or 1)
        lo = self.min_replicas if self.min_replicas is not None else min(1, n or 1)
        hi = self.max_replicas if self.max_replicas is not None else max(lo, n or 1)
        return lo, hi

    @property
    def initial_replicas(self) -> int:
        lo, hi = self.bounds
        return self.num_replicas if self.num_replicas is not None else max(lo, min(1, hi))

    def capacity(self) -> int:
        """Requests one replica's engine holds: running plus waiting."""
        e = self.engine()
        return e.max_num_seqs + e.max_waiting

    def deployment_options(self) -> dict:
        """Ray Serve options of the engine deployment (`deployment_config` entries win).

        The engine refuses what it cannot hold (EngineFull); Serve's per-replica limit is twice the
        engine's capacity so that a refusal, not a Serve queue, tells the ingress a replica is full."""
        opts: dict = {"ray_actor_options": self.actor_options(), "max_ongoing_requests": 2 * self.capacity() + 1,
                      "health_check_period_s": self.health_check_period_s,
                      "health_check_timeout_s": max(10.0, 5 * self.health_check_period_s),
                      "graceful_shutdown_timeout_s": 5.0}
        if self.autoscaling:
            lo, hi = self.bounds
            opts["autoscaling_config"] = {"min_replicas": lo, "max_replicas": hi,
                                          "initial_replicas": self.initial_replicas,
                                          "target_ongoing_requests": self.engine().max_num_seqs}
        else:
            opts["num_replicas"] = self.initial_replicas
        opts.update(self.deployment_config)
        return opts


@dataclass
class SpecfoldProcessorConfig(EngineSpec):
    """Ray Data batch inference: `concurrency` actors, each with one engine, `batch_size` rows a call."""
    concurrency: int = 1
    batch_size: int = 16
    chat_template: bool = True  # string prompts go through the model's chat template

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("concurrency", self.concurrency, integer=True)
        _positive("batch_size", self.batch_size, integer=True)


@dataclass(frozen=True)
class ModelInfo:
    """What the ingress needs of a model without loading its weights: tokenizer and spec."""
    path: Path
    tokenizer: object
    spec: object


def model_info(model_source: str, overrides: dict | None = None) -> ModelInfo:
    """Tokenizer and ModelSpec of a checkpoint (config.json and tokenizer.json only; no weights)."""
    from specfold.api import tiny_path
    from specfold.models.loader import read_config
    from specfold.models.spec import resolve_spec
    from specfold.models.tokenizer import Tokenizer
    path = tiny_path() if model_source == "tiny" else Path(model_source)
    config = read_config(path)
    tok = Tokenizer.load(path)
    return ModelInfo(path, tok, resolve_spec(config, overrides, tok.vocab if tok else None))
