"""Ray Data batch inference: one engine per actor of a `map_batches` actor pool.

- `build_processor(SpecfoldProcessorConfig(...), preprocess, postprocess)` -> a `Processor`, called
  on a Dataset like the processors of `ray.data.llm.build_processor`: rows with `prompt` (text),
  `messages` (chat) or `prompt_token_ids`, and an optional `sampling_params` dict (SamplingParams
  fields), gain `generated_text`, `generated_tokens`, `num_generated_tokens`, `num_input_tokens`,
  `finish_reason`, `nfe` and `time_taken_llm`; every input column is kept.
- `ordered_outputs(spec, jobs, ...)`: the RequestOutputs of `(prompt, DecodeParams)` jobs in job
  order, for `specfold eval/bench --ray`.

Invariants:
- Each actor loads its own LLM (`EngineSpec.load`: torch threads first) and decodes a whole batch
  with one engine; a request's tokens do not depend on its batch, so the outputs are those of
  a local run, apart from the timing fields (`seconds`, `*_seconds`, tokens per second).
- `ordered_outputs` yields in job order (the dataset preserves order) and streams: each output is
  handed over as soon as it and the ones before it are done.
"""
from __future__ import annotations

import math
import numbers
import pickle
from collections import defaultdict
from typing import Callable, Iterator, Sequence

from specfold.ray.config import EngineSpec, SpecfoldProcessorConfig

OUTPUT_COLUMNS = ("generated_text", "generated_tokens", "num_generated_tokens", "num_input_tokens",
                  "finish_reason", "nfe", "time_taken_llm")


def _plain(v):
    """numpy values of a batch as plain Python (arrays -> lists, scalars -> numbers)."""
    if hasattr(v, "tolist"):
        v = v.tolist()
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items() if x is not None}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def _given(v) -> bool:
    """A value in a batch column (a missing one is None, or NaN in a numeric column)."""
    return v is not None and not (isinstance(v, numbers.Real) and math.isnan(v))


class EngineUDF:
    """The map_batches class of `build_processor`: one engine per actor."""

    def __init__(self, config: SpecfoldProcessorConfig):
        self.config, self.llm = config, config.load()

    def _prompt(self, row: dict):
        from specfold.errors import ParamsError
        if _given(row.get("messages")):
            tok = self.llm.tokenizer
            return tok.encode(tok.apply_chat_template(_plain(row["messages"]))), False
        if _given(row.get("prompt_token_ids")):
            return _plain(row["prompt_token_ids"]), False
        if _given(row.get("prompt")):
            return str(row["prompt"]), self.config.chat_template
        raise ParamsError(f"a row needs 'prompt', 'messages' or 'prompt_token_ids'; got columns {sorted(row)}")

    def __call__(self, batch: dict) -> dict:
        import numpy as np

        from specfold.params import SamplingParams
        n = len(next(iter(batch.values())))
        rows = [{k: batch[k][i] for k in batch} for i in range(n)]
        prompts, params = [], []
        for row in rows:
            prompt, chat = self._prompt(row)
            sp = _plain(row["sampling_params"]) if _given(row.get("sampling_params")) else {}
            prompts.append(prompt)
            params.append(SamplingParams(**{"chat_template": chat, **sp}))
        outs = self.llm.generate(prompts, params)
        cols = {"generated_text": [o.text for o in outs], "generated_tokens": [list(o.token_ids) for o in outs],
                "num_generated_tokens": [len(o.token_ids) for o in outs],
                "num_input_tokens": [len(o.prompt_token_ids) for o in outs],
                "finish_reason": [o.finish_reason for o in outs], "nfe": [o.stats.nfe for o in outs],
                "time_taken_llm": [o.stats.seconds for o in outs]}
        out = dict(batch)
        for k, v in cols.items():
            arr = np.empty(n, dtype=object)
            arr[:] = v
            out[k] = arr
        return out


class Processor:
    """preprocess (Dataset.map) -> the engine actors (map_batches) -> postprocess (Dataset.map)."""

    def __init__(self, config: SpecfoldProcessorConfig, preprocess: Callable | None = None,
                 postprocess: Callable | None = None):
        self.config, self.preprocess, self.postprocess = config, preprocess, postprocess

    def __call__(self, ds):
        import ray
        if self.preprocess is not None:
            ds = ds.map(self.preprocess)
        ds = ds.map_batches(EngineUDF, fn_constructor_kwargs={"config": self.config},
                            compute=ray.data.ActorPoolStrategy(size=self.config.concurrency),
                            batch_size=self.config.batch_size,
                            **self.config.actor_options())
        if self.postprocess is not None:
            ds = ds.map(self.postprocess)
        return ds


def build_processor(config: SpecfoldProcessorConfig, preprocess: Callable | None = None,
                    postprocess: Callable | None = None) -> Processor:
    """A Ray Data processor of `config` (see the module docstring)."""
    return Processor(config, preprocess, postprocess)


# ---------------------------------------------------------------------------------- eval / bench
class DecodeUDF:
    """The map_batches class of `ordered_outputs`: rows are job indices; the jobs travel once per actor."""

    def __init__(self, spec: EngineSpec, prompts: list, runs: list, run_of: list[int], warmup: int):
        self.llm = spec.load()
        self.prompts, self.runs, self.run_of, self.warmup = prompts, runs, run_of, warmup
        self.warm: set[int] = set()

    def __call__(self, batch: dict) -> dict:
        import numpy as np
        jobs = [int(k) for k in batch["job"]]
        by_run: dict[int, list[int]] = defaultdict(list)
        for k in jobs:
            by_run[self.run_of[k]].append(k)
        done = {}
        for r, members in by_run.items():
            if r not in self.warm:  # untimed, like the local run's warm-up (compilation, caches)
                for _ in range(self.warmup):
                    self.llm.generate([self.prompts[members[0]]], self.runs[r])
                self.warm.add(r)
            for k, o in zip(members, self.llm.generate([self.prompts[k] for k in members], self.runs[r])):
                done[k] = pickle.dumps(o)
        out = np.empty(len(jobs), dtype=object)
        out[:] = [done[k] for k in jobs]
        return {"job": np.asarray(jobs), "output": out}


def ordered_outputs(spec: EngineSpec, jobs: Sequence[tuple[object, object]], replicas: int, warmup: int = 0,
                    batch_size: int | None = None) -> Iterator:
    """RequestOutputs of `(prompt, DecodeParams)` jobs, in job order, from `replicas` engine actors."""
    import ray
    if not jobs:
        return
    runs: list = []
    run_of = []
    for _, params in jobs:
        if params not in runs:
            runs.append(params)
        run_of.append(runs.index(params))
    size = batch_size or max(1, min(64, math.ceil(len(jobs) / (2 * replicas))))
    options = ray.data.DataContext.get_current().execution_options
    kept, options.preserve_order = options.preserve_order, True  # rows come back in job order
    try:
        ds = ray.data.from_items([{"job": k} for k in range(len(jobs))])
        ds = ds.map_batches(DecodeUDF, fn_constructor_kwargs={"spec": spec, "prompts": [p for p, _ in jobs],
                                                              "runs": runs, "run_of": run_of, "warmup": warmup},
                            compute=ray.data.ActorPoolStrategy(size=replicas), batch_size=size,
                            **spec.actor_options())
        for row in ds.iter_rows():
            yield pickle.loads(row["output"])
    finally:
        options.preserve_order = kept
