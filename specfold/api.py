"""`LLM`: load a checkpoint once, then `generate(prompts, params)` like vLLM.

    llm = LLM("tiny", config=EngineConfig(method="spiffy"))      # or engine fields as keywords
    outs = llm.generate(prompts, SamplingParams(max_new_tokens=64))   # prompts as given
    outs = llm.chat([{"role": "user", "content": q}], SamplingParams(max_new_tokens=64))  # chat template

`generate` adds every prompt to an `Engine` and steps it until all are done (continuous batching:
prompts join as running ones finish). With `DecodeParams` (the all-in-one convenience) it splits
them into an `EngineConfig` and `SamplingParams` per prompt, and runs them on the engine an
earlier call built for the same settings (a few are kept), else on a new one.

Invariants: prompts are validated before any forward (non-empty list; each a non-empty string or a
list of in-vocabulary token ids; prompt + max_new_tokens within the model's context); nothing is
truncated. Each request has its own prefix cache; stats are returned per request in
`RequestOutput.stats`, never printed; outputs come back in prompt order.
"""
from __future__ import annotations

import dataclasses
import os
from collections import OrderedDict
from types import SimpleNamespace
from pathlib import Path
import warnings
from typing import Sequence

with warnings.catch_warnings():  # the core install has no numpy, which specfold never needs
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch

from specfold.decoding.methods import get_method
from specfold.decoding.program import BlockProgram
from specfold.engine.engine import Engine
from specfold.engine.mirror import Leader
from specfold.errors import CheckpointError, ParamsError
from specfold.models.loader import load_model, tiny_path  # noqa: F401 (tiny_path: re-exported)
from specfold.models.tokenizer import Tokenizer
from specfold.outputs import RequestOutput
from specfold.params import DecodeParams, EngineConfig, SamplingParams
from specfold.outputs import DecodeStats
from specfold.text import check_text

ENGINES_KEPT = 4  # engines generate() keeps for DecodeParams settings (least recently used dropped)
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "float16": torch.float16, "fp32": torch.float32, "fp64": torch.float64, "bf16": torch.bfloat16}

Prompt = str | Sequence[int]


def _dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ParamsError(f"unknown dtype {dtype!r}; accepted: {sorted(DTYPES)}") from None


def _device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ParamsError(f"unknown device {device!r}; accepted: 'cpu', 'cuda', 'cuda:N'") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise ParamsError(f"device {str(device)!r} is not available ({why}); use device 'cpu'")
    if dev.type not in ("cpu", "cuda"):
        raise ParamsError(f"device {str(device)!r} is not supported; accepted: 'cpu', 'cuda', 'cuda:N'")
    return dev


class LLM:
    def __init__(self, model: str | os.PathLike = "tiny", dtype: str | torch.dtype = "float32",
                 device: str = "cpu", overrides: dict | None = None, config: EngineConfig | None = None,
                 tensor_parallel_size: int = 1, enable_expert_parallel: bool = False,
                 distributed_executor_backend: str = "mp", **engine_kw):
        """`config` (or EngineConfig fields as keywords) is the engine `generate(..., SamplingParams)`
        and `engine()` use. `tensor_parallel_size` > 1 splits the model over that many ranks
        (processes: `distributed_executor_backend` "mp" local ones, "ray" Ray actors; one GPU each on
        CUDA, a share of the CPU threads each on the CPU); `enable_expert_parallel` gives each rank
        whole experts instead of a slice of every expert (vLLM's names)."""
        path = tiny_path() if str(model) == "tiny" else Path(model)
        if not path.is_dir():
            raise CheckpointError(f"checkpoint folder {str(path)!r} does not exist (expected a local "
                                  f"HuggingFace folder with config.json and *.safetensors, or 'tiny')")
        self.path = path
        device = _device(device)
        self.tokenizer = Tokenizer.load(path)
        vocab = self.tokenizer.vocab if self.tokenizer else None
        self.ranks = self.leader = None  # tensor parallelism: the other ranks, and their mirror (engine/mirror.py)
        if tensor_parallel_size != 1 or enable_expert_parallel:
            from specfold.executor import LoadArgs, start_ranks
            threads = max(1, torch.get_num_threads() // max(1, tensor_parallel_size))
            args = LoadArgs(str(path), _dtype(dtype), device.type, overrides, vocab, threads)
            self.ranks = start_ranks(args, tensor_parallel_size, bool(enable_expert_parallel),
                                     distributed_executor_backend)
            self.model, self.spec, self.config = self.ranks.model, self.ranks.spec, self.ranks.config
            self.leader = Leader(self.ranks.par.control)
        else:
            self.model, self.spec, self.config = load_model(path, _dtype(dtype), device, overrides, vocab)
        if config is not None and engine_kw:
            raise ParamsError("pass either config=EngineConfig(...) or engine fields as keywords, not both")
        if config is None:
            unknown = set(engine_kw) - {f.name for f in dataclasses.fields(EngineConfig)}
            if unknown:
                raise ParamsError(f"unknown engine setting(s) {sorted(unknown)}; accepted: "
                                  f"{[f.name for f in dataclasses.fields(EngineConfig)]}")
            config = EngineConfig(**engine_kw)
        self.engine_config = config
        self._engine: Engine | None = None
        self._engines: OrderedDict[tuple, Engine] = OrderedDict()  # generate()'s DecodeParams engines

    def close(self) -> None:
        """Stop the other tensor-parallel ranks (also done at exit); one rank: nothing to do."""
        if self.ranks is not None:
            self.ranks.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ prompts
    def encode(self, prompt: Prompt, params: SamplingParams | DecodeParams) -> list[int]:
        """A prompt -> token ids (the chat template when asked); the engine checks them once, when
        the request is added (`Engine.validate`)."""
        if isinstance(prompt, str):
            if not prompt:
                raise ParamsError("empty prompt string")
            check_text(prompt, "prompt")
            if self.tokenizer is None:
                raise CheckpointError(f"{str(self.path)!r} has no tokenizer.json: pass prompts as lists "
                                      f"of token ids")
            text = prompt
            if params.chat_template:
                text = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
            ids = self.tokenizer.encode(text)
        else:
            try:
                ids = [int(t) for t in prompt]
            except (TypeError, ValueError):
                raise ParamsError(f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}") from None
            if params.chat_template and self.tokenizer is not None:
                raise ParamsError("chat_template=True needs string prompts (token-id prompts are taken as is)")
        return ids

    # ------------------------------------------------------------------ generate
    def decoder(self, params: DecodeParams) -> "Decoder":
        """One request at a time with this method's policy and verifier (swappable: calibration)."""
        config, sampling = params.split()
        config = config.resolve(self.spec)
        policy, verifier = get_method(config.method)(self.model, self.spec, config)
        return Decoder(self, config, sampling, policy, verifier)

    def engine(self, config: EngineConfig | None = None) -> Engine:
        """A new engine on this model (`config` defaults to the LLM's)."""
        return Engine(self, config or self.engine_config)

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 params: SamplingParams | DecodeParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Decode every prompt (batched); `params` is one SamplingParams, one per prompt, or a
        DecodeParams (engine settings for this call included)."""
        return _drain(*self._prepare(prompts, params), use_tqdm)

    def _prepare(self, prompts, params) -> tuple:
        """`generate`'s work before the first forward: (engine, prompts, token ids, SamplingParams
        and EngineConfig per prompt), every prompt encoded and validated (the CLI reports here)."""
        if isinstance(prompts, str) or (isinstance(prompts, Sequence) and prompts
                                        and all(isinstance(t, int) for t in prompts)):
            prompts = [prompts]
        prompts = list(prompts)
        if not prompts:
            raise ParamsError("generate() got an empty list of prompts")
        if params is None:
            params = SamplingParams()
        if isinstance(params, DecodeParams):
            config, sp = params.split()
            engine = self._engine_for(config)
            per = [sp] * len(prompts)
        else:
            per = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
            if len(per) != len(prompts):
                raise ParamsError(f"got {len(per)} SamplingParams for {len(prompts)} prompts")
            if self._engine is None:
                self._engine = self.engine()
            engine = self._engine
        encoded = [self.encode(pr, p) for pr, p in zip(prompts, per)]
        configs = [engine.validate(ids, p) for ids, p in zip(encoded, per)]  # every prompt, before any forward
        return engine, prompts, encoded, per, configs

    def chat(self, messages: Sequence[dict] | Sequence[Sequence[dict]],
             params: SamplingParams | DecodeParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = False) -> list[RequestOutput]:
        """Decode conversations through the checkpoint's chat template (vLLM's split: `generate`
        takes prompts as given). `messages` is one conversation, a list of {"role", "content"}
        dicts, or a list of conversations; one RequestOutput per conversation, in order, whose
        `prompt` is the templated text. `params` as in `generate` (its `chat_template` is not read:
        the template is applied here, once)."""
        conversations = _conversations(messages)
        if self.tokenizer is None:
            raise ParamsError(f"chat() needs a tokenizer: {str(self.path)!r} has no tokenizer.json (pass "
                              f"token-id prompts to generate() instead)")
        from jinja2.exceptions import TemplateError
        try:
            texts = [self.tokenizer.apply_chat_template(c) for c in conversations]
        except TemplateError as e:
            raise ParamsError(f"the model's chat template refused these messages: {e}") from None
        if params is None:
            params = SamplingParams()
        if isinstance(params, (SamplingParams, DecodeParams)):
            params = dataclasses.replace(params, chat_template=False)
        elif isinstance(params, Sequence):
            params = [dataclasses.replace(p, chat_template=False) if isinstance(p, SamplingParams) else p
                      for p in params]
        return self.generate(texts, params, use_tqdm=use_tqdm)


    def _engine_for(self, config: EngineConfig) -> Engine:
        """The engine an earlier `generate` built for these settings (idle: every call drains or
        aborts its requests), else a new one; the ENGINES_KEPT most recently used are kept, so a
        caller alternating settings does not rebuild a method's program (graph, fold parameters)
        and cost model each call."""
        graph = config.graph
        stamp = os.stat(graph).st_mtime_ns if isinstance(graph, (str, os.PathLike)) and os.path.isfile(graph) else None
        key = (repr(config), stamp)
        engine = self._engines.pop(key, None)
        if engine is None or engine.has_unfinished():
            engine = Engine(self, config)
        self._engines[key] = engine
        while len(self._engines) > ENGINES_KEPT:
            self._engines.popitem(last=False)
        return engine


class Decoder:
    """One request at a time through an engine whose block program has this policy and verifier
    (calibration and tests swap `policy` / `verifier`): `run(prompt_ids) -> (ids, finish_reason, stats)`."""

    def __init__(self, llm: LLM, config: EngineConfig, sampling: SamplingParams, policy, verifier):
        self.llm, self.config, self.sampling = llm, config, sampling
        self.policy, self.verifier = policy, verifier

    def run(self, prompt: list[int]) -> tuple[list[int], str, DecodeStats]:
        program = BlockProgram(self.llm.spec, self.config, self.policy, self.verifier)
        host = SimpleNamespace(model=self.llm.model, spec=self.llm.spec, tokenizer=None,  # ids only
                               leader=self.llm.leader)  # tensor parallelism: the other ranks replay its steps
        out = Engine(host, self.config, program=program).run_one(prompt, self.sampling)
        return out.token_ids, out.finish_reason, out.stats


def _conversations(messages) -> list[list[dict]]:
    """`chat`'s argument as a list of conversations, or one ParamsError line saying what is wrong."""
    what = "chat() takes a conversation (a list of {'role': str, 'content': str} dicts) or a list of them"
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ParamsError(f"{what}, got {type(messages).__name__}")
    if not messages:
        raise ParamsError(f"{what}, got an empty list")
    single = isinstance(messages[0], dict)
    conversations = [messages] if single else list(messages)
    for i, conv in enumerate(conversations):
        where = "the conversation" if single else f"conversation {i}"
        if isinstance(conv, (str, bytes, dict)) or not isinstance(conv, Sequence):
            raise ParamsError(f"{what}; {where} is a {type(conv).__name__}")
        if not conv:
            raise ParamsError(f"{what}; {where} is empty")
        for j, m in enumerate(conv):
            if not isinstance(m, dict):
                raise ParamsError(f"{what}; message {j} of {where} is a {type(m).__name__}")
            bad = [k for k in ("role", "content") if not isinstance(m.get(k), str)]
            if bad:
                raise ParamsError(f"{what}; message {j} of {where} has no string {' or '.join(repr(k) for k in bad)}")
    return [list(c) for c in conversations]


def _drain(engine: Engine, prompts: list, encoded: list[list[int]], per: list[SamplingParams],
           configs: list[EngineConfig], use_tqdm: bool) -> list[RequestOutput]:
    """Every prompt through the engine (`Engine.run_all`), with a progress bar when asked."""
    if not use_tqdm:
        return engine.run_all(encoded, per, prompts, configs)
    from tqdm import tqdm
    with tqdm(total=len(prompts), desc="generate", unit="prompt") as bar:
        return engine.run_all(encoded, per, prompts, configs, on_finish=lambda _: bar.update(1))
