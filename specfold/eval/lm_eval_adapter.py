"""lm-evaluation-harness model "specfold": `generate_until` tasks through specfold's decoders.

Importing this module registers the model with lm-eval (`lm_eval.api.registry.register_model`).
lm-eval (0.4.x) discovers no model plugins by itself (its registry only knows its own models, and
`--include_path` adds task folders, not models), so run it through this module:

    python -m specfold.eval.lm_eval_adapter run --model specfold \
        --model_args pretrained=PATH,method=freedave,dtype=bfloat16,device=cuda --tasks gsm8k --apply_chat_template

or import it before calling `lm_eval.simple_evaluate(model="specfold", model_args=...)`.

model_args: `pretrained` (checkpoint folder or "tiny"), `dtype`, `device`, `threads`, `overrides`
(JSON object), and any `DecodeParams` field (`method`, `delta`, `branches`, `drafts`, `rule`,
`threshold`, `block_size`, `max_new_tokens` = default generation length, `chat_template=True` = wrap
each context as one user message when lm-eval's --apply_chat_template is not used ...). lm-eval's
`batch_size`/`max_batch_size` are accepted and ignored (requests are decoded one at a time).

Invariants: the context arrives already formatted (with `--apply_chat_template` lm-eval renders it
through `apply_chat_template` below), so it is encoded as is; a context that does not fit the
model's context window with `max_gen_toks` is cut from the left (as lm-eval's HF model does).
`until` stop strings truncate the text at the earliest one; `max_gen_toks` bounds new tokens.
Log-likelihood requests raise NotImplementedError: a diffusion decoder scores no log-likelihoods.
A task whose data set cannot be loaded offline ends `main` with one line naming `--include_path`
and the local data folder (exit status 2), not lm-eval's traceback.
"""
from __future__ import annotations

import dataclasses
import json
import warnings
from typing import Any

try:
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
except ImportError:  # `specfold-lm-eval` then answers with an install hint (main)
    LM, register_model = object, lambda *names: (lambda cls: cls)
    HAVE_LM_EVAL = False
else:
    HAVE_LM_EVAL = True

NO_LOGLIKELIHOOD = ("specfold is a diffusion decoder and computes no log-likelihoods; run generate_until "
                    "tasks only (e.g. gsm8k, minerva_math, humaneval, mbpp, ifeval), not multiple-choice "
                    "or perplexity tasks")


def truncate_at_stops(text: str, until: list[str]) -> str:
    """`text` up to (excluding) the earliest occurrence of any non-empty stop string."""
    cut = min((i for s in until if s and (i := text.find(s)) >= 0), default=len(text))
    return text[:cut]


@register_model("specfold")
class SpecfoldLM(LM):
    def __init__(self, pretrained: str = "tiny", dtype: str = "float32", device: str = "cpu",
                 threads: int | None = None, overrides: str | dict | None = None,
                 batch_size: Any = None, max_batch_size: Any = None, **decode: Any):
        super().__init__()
        import torch

        from specfold.api import LLM
        from specfold.params import DecodeParams

        fields = {f.name for f in dataclasses.fields(DecodeParams)}
        unknown = sorted(set(decode) - fields)
        if unknown:
            raise ValueError(f"unknown specfold model_args {unknown}; accepted: pretrained, dtype, device, "
                             f"threads, overrides and the DecodeParams fields {sorted(fields)}")
        if threads:
            torch.set_num_threads(int(threads))
        if str(device).startswith("cuda") and not torch.cuda.is_available():  # lm-eval's default --device
            warnings.warn(f"device {device!r} requested but CUDA is not available; using the CPU")
            device = "cpu"
        if isinstance(overrides, str):
            overrides = json.loads(overrides)
        self.llm = LLM(str(pretrained), dtype=dtype, device=device, overrides=overrides)
        if self.llm.tokenizer is None:
            raise ValueError(f"{pretrained}: lm-eval sends text, but this checkpoint has no tokenizer.json")
        # chat_template=True wraps each context as one user message (without lm-eval's
        # --apply_chat_template); by default lm-eval formats the context itself
        self.wrap_chat = bool(decode.pop("chat_template", False))
        decode.setdefault("seed", 0)  # sampled runs repeat, as lm-eval's own seeds are fixed (the API draws one)
        self.params = DecodeParams(**decode)
        self.pretrained = str(pretrained)
        self._device = device

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> "SpecfoldLM":
        """`--model_args` win over what lm-eval adds from its own flags (`--device`, whose default is
        cuda:0, and the batch sizes): `device=cpu` in model_args is not a clash."""
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k not in arg_dict}
        return cls(**arg_dict, **extra)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> "SpecfoldLM":
        from lm_eval import utils
        return cls.create_from_arg_obj(utils.simple_parse_args_string(arg_string), additional_config)

    # ------------------------------------------------------------------ generation
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        from tqdm import tqdm

        results = []
        for req in tqdm(requests, desc=f"specfold[{self.params.method}]", disable=disable_tqdm or len(requests) < 2):
            context, gen_kwargs = req.args
            text = self.generate_one(context, dict(gen_kwargs or {}))
            results.append(text)
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
        return results

    def generate_one(self, context: str, gen_kwargs: dict[str, Any]) -> str:
        until = gen_kwargs.pop("until", None) or []
        if isinstance(until, str):
            until = [until]
        max_new = int(gen_kwargs.pop("max_gen_toks", self.params.max_new_tokens))
        temperature = float(gen_kwargs.pop("temperature", self.params.temperature))
        if not gen_kwargs.pop("do_sample", temperature > 0):
            temperature = 0.0
        params = self.params.replace(max_new_tokens=max_new, temperature=temperature)
        if self.wrap_chat:
            context = self.apply_chat_template([{"role": "user", "content": context}])
        ids = self.llm.tokenizer.encode(context)
        room = self.llm.spec.max_position_embeddings - max_new
        if len(ids) > room:
            warnings.warn(f"context of {len(ids)} tokens cut to its last {room} to fit max_gen_toks={max_new}")
            ids = ids[-room:]
        out = self.llm.generate([ids], params)[0]
        return truncate_at_stops(out.text, until)

    # ------------------------------------------------------------------ chat template
    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.llm.tokenizer.apply_chat_template(chat_history, add_generation_prompt=add_generation_prompt)

    @property
    def tokenizer_name(self) -> str:
        return self.pretrained.replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self.llm.tokenizer.chat_template if chat_template else None

    # ------------------------------------------------------------------ not supported
    def loglikelihood(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError(NO_LOGLIKELIHOOD)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError(NO_LOGLIKELIHOOD)


_OFFLINE_ERRORS = ("DatasetNotFoundError", "LocalEntryNotFoundError", "OfflineModeIsEnabled", "EntryNotFoundError",
                   "RepositoryNotFoundError")


def offline_data_error(exc: BaseException) -> str | None:
    """Why a data set could not be had offline, when `exc` (or what caused it) says so; else None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        name = type(exc).__name__
        if name in _OFFLINE_ERRORS or (isinstance(exc, ConnectionError) and "Hub" in str(exc)):
            return str(exc).strip().splitlines()[0] if str(exc).strip() else name
        exc = exc.__cause__ or exc.__context__
    return None


def local_data_dir() -> str:
    """Where the benchmark files of this checkout live (SPECFOLD_DATA, else ../shared/data)."""
    import os
    from pathlib import Path

    return os.environ.get("SPECFOLD_DATA") or str(Path(__file__).resolve().parents[3] / "shared" / "data")


def offline_line(why: str) -> str:
    data = local_data_dir()
    return (f"specfold-lm-eval: a task's data set is not available offline ({why}); run a task that reads the "
            f"local data instead, with --include_path DIR holding its YAML (dataset_path: json, data_files: "
            f"{data}/gsm8k/test.jsonl or another file of {data}; docs/EVAL.md shows one), or fill the HF cache on "
            "a machine with network and set HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1")


def main() -> None:
    """lm-eval's command line with the "specfold" model registered. A data set that cannot be
    loaded offline ends with one line (how to use the local data) and exit status 2."""
    import sys

    if not HAVE_LM_EVAL:
        print("specfold-lm-eval: lm-eval is not installed; install it with: pip install 'specfold[lm-eval]'",
              file=sys.stderr)
        raise SystemExit(2)
    from lm_eval.__main__ import cli_evaluate
    try:
        cli_evaluate()
    except Exception as e:  # noqa: BLE001 - only the offline-data case is turned into one line
        why = offline_data_error(e)
        if why is None:
            raise
        print(offline_line(why), file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
