"""`Engine`: continuous batching of decode requests; one `step()` = one packed model call.

    engine = Engine(llm, EngineConfig(method="spiffy"))
    rid = engine.add_request(prompt_ids, SamplingParams(max_new_tokens=64))   # EngineFull when full
    while engine.has_unfinished():
        for d in engine.step():            # RequestDelta per request that advanced
            ...d.new_token_ids, d.text_delta, d.finished, d.output

Each step: schedule (admit waiting requests while the KV pool has room, scheduler.py, kv.py) ->
every request that verifies proposes its verification, once (`program.propose`: root + the policy's drafts) -> the budget chooser picks the
drafts of all of them at once (budget.py: a fixed N, or "auto", a bandit that measures the steps)
-> `program.plan(req, pick)` for every running request, with its pick (host: the jobs it needs now)
-> the blocks of every write reserved (kv.py: preempting the most recently admitted request when the
pool is short) -> `runner.run(jobs)` for those that fit the row budget (one packed model call, one host-to-device
copy, one read back) -> `program.update(req, results)` (host: rules, drafts, bookkeeping; the
positions the rule filled and the step's time go to the chooser) -> a `RequestDelta` for every
request that finished or produced final tokens. The program is the block program (decoding/program.py) or a causal one: one interface.

Invariants:
- single-threaded: one caller drives `step()`; the server runs it in one background thread;
- a request's tokens depend only on its prompt, its SamplingParams and the engine config, never on
  its batch partners or when it joined (its program, rule order and generator are its own); the
  one exception is SpecFold at delta > 0 under auto draft budgets, where the drafts chosen for the
  whole step decide which rows fold (an approximate method; README says so);
- `abort` frees a request's cache at once; its final delta (finish_reason "abort") comes with the
  next `step()`;
- the policy and verifier are built once, here; a request chooses only SamplingParams.
"""
from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass

import torch

from specfold.decoding.methods import get_method
from specfold.decoding.program import BlockProgram
from specfold.decoding.verify.fold import FoldStats
from specfold.engine.budget import BudgetChooser
from specfold.engine.graphs import static_runner
from specfold.engine.kv import KVMemory
from specfold.engine.mirror import MirroredRunner
from specfold.engine.request import Request
from specfold.engine.runner import ModelRunner
from specfold.engine.scheduler import Scheduler
from specfold.engine.text import advance_text
from specfold.errors import EngineFull, ParamsError
from specfold.outputs import RequestOutput
from specfold.params import EngineConfig, SamplingParams
from specfold.text import check_prompt_ids


@dataclass(slots=True)
class RequestDelta:
    request_id: str
    new_token_ids: list[int]  # final tokens not reported before
    text_delta: str  # decoded incrementally, cut before a stop string
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | None
    output: RequestOutput | None = None  # when finished
    new_logprobs: list[dict[int, float]] | None = None  # per new token (SamplingParams.logprobs), else None


def build_program(model, spec, config: EngineConfig):
    """The engine's program for `config.method`: a method builder returns (policy, verifier) for the
    block program, or a program of its own (the causal methods)."""
    built = get_method(config.method)(model, spec, config)
    if isinstance(built, tuple):
        policy, verifier = built
        return BlockProgram(spec, config, policy, verifier)
    return built


class Engine:
    def __init__(self, llm, config: EngineConfig | None = None, *, program=None):
        """`llm`: anything with `.model`, `.spec` and `.tokenizer` (an `LLM`)."""
        self.model, self.spec, self.tokenizer = llm.model, llm.spec, getattr(llm, "tokenizer", None)
        self.config = (config or EngineConfig()).resolve(self.spec)
        self.program = program if program is not None else build_program(self.model, self.spec, self.config)
        self.kv = KVMemory(self.model, self.spec, self.config, self.program)  # the paged pool (engine/kv.py)
        self.pool = self.kv.pool
        static = static_runner(self.model, self.config, self.pool)
        self.runner = ModelRunner(self.model, self.program.verifier, self.spec.mask_token_id, static)
        leader = getattr(llm, "leader", None)  # tensor parallelism: the other ranks replay the runner
        if leader is not None:
            self.runner = MirroredRunner(leader, self.runner, self.config, self.pool)
        self.scheduler = Scheduler(self.config)
        self.budget = BudgetChooser(self.config, self.program, self.model.device)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._aborted: list[RequestDelta] = []
        self._ids = itertools.count()
        self.steps = 0

    # ------------------------------------------------------------------ requests
    def validate(self, prompt_ids: list[int], params: SamplingParams) -> EngineConfig:
        check_prompt_ids(prompt_ids, self.spec.vocab_size, self.spec.max_position_embeddings, params.max_new_tokens)
        if params.stop and self.tokenizer is None:
            raise ParamsError("stop strings need a tokenizer; this checkpoint has none (use stop_token_ids)")
        cfg = self.config.for_request(self.spec, params.max_new_tokens, self.program.whole_blocks)
        self.kv.check(len(prompt_ids), params.max_new_tokens, cfg)
        return cfg

    def can_add(self) -> bool:
        return not self.scheduler.full(len(self.waiting) + len(self.running))

    def add_request(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None,
                    prompt: str | None = None, config: EngineConfig | None = None) -> str:
        """Queue a request; raises EngineFull when `max_num_seqs + max_waiting` are held, ParamsError
        for a request this model cannot decode. `config`: what `validate` returned for this prompt
        and params (then they are not checked again)."""
        if not isinstance(params, SamplingParams):
            raise ParamsError(f"params must be SamplingParams, got {type(params).__name__}")
        cfg = config if config is not None else self.validate(list(prompt_ids), params)
        if not self.can_add():
            raise EngineFull(f"the engine holds {len(self.running)} running and {len(self.waiting)} waiting requests "
                             f"(max_num_seqs={self.config.max_num_seqs}, max_waiting={self.config.max_waiting}); "
                             f"retry later")
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self.requests:
            raise ParamsError(f"request id {rid!r} is already in use")
        req = Request(rid, list(prompt_ids), params, cfg, set(self.spec.stop_token_ids), prompt)
        self.requests[rid] = req
        self.waiting.append(req)
        return rid

    def abort(self, request_id: str) -> None:
        """Free a running or waiting request; a finished or unknown id is a no-op."""
        req = self.requests.get(request_id)
        if req is None or req.finished:
            return
        del self.requests[request_id]
        if req in self.waiting:
            self.waiting.remove(req)
        self._finish(req, "abort")
        self._aborted.append(RequestDelta(req.id, [], "", True, "abort", self._output(req)))

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self._aborted)

    def num_running(self) -> int:
        return len(self.running)

    # ------------------------------------------------------------------ the step
    def step(self) -> list[RequestDelta]:
        deltas, self._aborted = self._aborted, []
        touched: list[Request] = []
        self.budget.start_step()
        with torch.inference_mode():
            self.scheduler.admit(self.waiting, self.running, lambda r: self.kv.fits(r, self.running),
                                 lambda r: self.program.start(r, lambda _=None: self.kv.new_cache(r)))
            plans = self._plan(touched)
            chosen = self.kv.reserve(self.scheduler.select(plans), self.running, self._preempt)
            jobs = [j for _, js in chosen for j in js]
            t0 = time.perf_counter()
            results = self.runner.run(jobs)
            dt = time.perf_counter() - t0
            i = filled = 0
            for req, js in chosen:
                req.counters.model_seconds += dt
                before = req.counters.filled
                self.program.update(req, results[i: i + len(js)])
                filled += req.counters.filled - before
                i += len(js)
                touched.append(req)
                if self.program.done(req):
                    self._finish(req, req.finish_reason or "length")
            self.kv.seal(self.running)
            self.budget.end_step(filled)
        self.steps += 1
        for req in dict.fromkeys(touched):
            d = self._delta(req)
            if d is not None:
                deltas.append(d)
        return deltas

    def _plan(self, touched: list[Request]) -> list[tuple[Request, list]]:
        """Every running request's jobs for this step, in two phases: the requests that verify propose
        their verification once (root + the policy's drafts, made lazily), the budget chooser picks the
        drafts of all of them at once (engine/budget.py), then each request's pick goes to
        `plan(req, pick)`. A request with no job is done."""
        propose = getattr(self.program, "propose", None) if self.budget.drafts else None
        props = [propose(req) if propose is not None else None for req in self.running]
        base = [self.program.plan(req) if p is None else [] for req, p in zip(self.running, props)]
        picks = self.budget.choose(props)
        out = []
        for req, jobs, pick in zip(list(self.running), base, picks):
            if pick is not None:
                jobs = self.program.plan(req, pick)
            if jobs:
                out.append((req, jobs))
            else:
                self._finish(req, req.finish_reason or "length")
                touched.append(req)
        return out

    def _preempt(self, req: Request) -> None:
        """Free `req`'s blocks and state; it waits at the front and resumes from prompt + output."""
        self.running.remove(req)
        req.preempt()
        self.waiting.appendleft(req)

    def _finish(self, req: Request, reason: str) -> None:
        if req in self.running:
            self.running.remove(req)
            self.kv.finished()
        req.finish(reason)

    def _delta(self, req: Request) -> RequestDelta | None:
        if not req.finished and len(req.output_ids) == req.reported:
            return None  # no final token since the last delta (most denoising steps): nothing to decode
        text, stopped = advance_text(self.tokenizer, req, req.finished)
        if stopped and not req.finished:
            self._finish(req, "stop")
            req.finish_reason = "stop"
        new = req.output_ids[req.reported:]
        lps = req.output_logprobs
        if lps is not None:
            del lps[len(req.output_ids):]  # a stop string trimmed the ids
        if not new and not text and not req.finished:
            return None
        new_lps = lps[req.reported:] if lps is not None else None
        req.reported = len(req.output_ids)
        out = None
        if req.finished:
            self.requests.pop(req.id, None)
            out = self._output(req)
        return RequestDelta(req.id, list(new), text, req.finished, req.finish_reason if req.finished else None, out,
                            new_lps)

    def _output(self, req: Request) -> RequestOutput:
        st = req.stats
        st.tokens = len(req.output_ids)
        delta = getattr(self.program.verifier, "delta", None)
        req.counters.write(st, lambda counts: FoldStats.from_counts(counts).report(delta))
        self.program.report(req)
        if self.tokenizer is not None and not req.text and req.output_ids and req.finish_reason == "abort":
            req.text = self.tokenizer.decode(req.output_ids)
        return RequestOutput(prompt=req.prompt, prompt_token_ids=req.prompt_ids, token_ids=list(req.output_ids),
                             text=req.text, finish_reason=req.finish_reason, stats=st, request_id=req.id,
                             logprobs=list(req.output_logprobs) if req.output_logprobs is not None else None)

    # ------------------------------------------------------------------ helpers
    def run_one(self, prompt_ids: list[int], params: SamplingParams) -> RequestOutput:
        """Decode one request (anything else in the engine steps alongside) -> its output."""
        return self.run_all([prompt_ids], [params])[0]

    def run_all(self, prompt_ids: list[list[int]], params: list[SamplingParams], prompts: list | None = None,
                configs: list[EngineConfig | None] | None = None, on_finish=None) -> list[RequestOutput]:
        """Add the requests as capacity allows and step until all are done -> their outputs, in order.
        `prompts`: each request's text (kept in its output), `configs`: what `validate` returned for
        each (else it runs on adding), `on_finish(output)`: called as each ends. Requests still
        unfinished when this raises (an interrupt) are aborted."""
        n = len(prompt_ids)
        ids: list[str] = []
        mine: set[str] = set()
        outs: dict[str, RequestOutput] = {}
        try:
            while len(ids) < n or len(outs) < len(ids):
                while len(ids) < n and self.can_add():
                    i = len(ids)
                    pr = prompts[i] if prompts is not None else None
                    ids.append(self.add_request(prompt_ids[i], params[i], prompt=pr if isinstance(pr, str) else None,
                                                config=configs[i] if configs is not None else None))
                    mine.add(ids[-1])
                for d in self.step():
                    if d.finished and d.request_id in mine:
                        outs[d.request_id] = d.output
                        if on_finish is not None:
                            on_finish(d.output)
                if len(ids) == n and len(outs) < n and not self.has_unfinished():
                    raise RuntimeError("internal error: a request ended without output")
        finally:
            for rid in ids:
                if rid not in outs:
                    self.abort(rid)
        return [outs[rid] for rid in ids]

    def memory_bytes(self) -> int:
        """Tensor bytes the running requests hold (caches, buffers, stored logits)."""
        return sum(r.memory_bytes() for r in self.running)
