"""`Request`: one request as the engine holds it: what its program decodes (a `DecodeRequest`:
prompt, settings, seed, stop ids, the program's typed state, final tokens) plus what the engine
needs to schedule and stream it.

Invariants:
- the program's state is `req.state` (typed, the program's own); the engine never reads inside it;
- memory is bounded by the request's own length: the prefix cache holds the blocks of what it has
  written, the program's state one verification batch of host scores; `free()` drops all of it on
  finish/abort, `preempt()` too (the request then resumes from `context_ids`: prompt + output);
- `reported` counts the output ids already handed out in a `RequestDelta`.
"""
from __future__ import annotations

import time

from specfold.decoding.request import DecodeRequest
from specfold.params import EngineConfig, SamplingParams


class Request(DecodeRequest):
    def __init__(self, request_id: str, prompt_ids: list[int], params: SamplingParams, config: EngineConfig,
                 stop_ids: set[int], prompt: str | None = None):
        super().__init__(prompt_ids, params, config, stop_ids)
        self.id = request_id
        self.prompt = prompt
        self.arrival = time.perf_counter()
        self.finished = False
        self.reported = 0  # output ids already handed out
        self.text_reported = 0  # characters of text already handed out
        self.text = ""  # decided text so far (final text once finished)

    def finish(self, reason: str) -> None:
        if self.finish_reason is None or reason == "abort":
            self.finish_reason = reason
        self.finished = True
        self.stats.tokens = len(self.output_ids)
        self.stats.seconds = time.perf_counter() - self.arrival
        self.free()

    def free(self) -> None:
        release = getattr(self.cache, "release", None)  # a KV pool slot (static shapes) goes back
        if release is not None:
            release()
        self.cache = None
        self.state = None

    def preempt(self) -> None:
        """Free everything; the request resumes by prefilling its prompt and committed output."""
        self.free()
        self.context_ids = self.prompt_ids + self.output_ids
        self.counters.preemptions += 1

    def memory_bytes(self) -> int:
        """Bytes held in device tensors right now (the prefix cache's blocks; eager: the last batch's
        hidden states)."""
        n = 0
        if self.cache is not None:
            n += self.cache.nbytes
        last = getattr(self.state, "last_batch", None)
        if last is not None and last[1] is not None:
            n += sum(h.numel() * h.element_size() for h in last[1])
        return n
