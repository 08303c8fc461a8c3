"""Per-request programs: how a decode method plugs into the engine.

A program is built once per engine (it holds the method's shared parts: rule, draft policy,
verifier) and drives every request; all per-request state lives on the `Request`. The engine calls,
for each running request:

    program.start(req)                      once, when the request is admitted
    fws = program.next_forwards(req)        the Forward(s) the request needs now; [] = it is done
    ... the engine runs the forwards of all requests in one packed call ...
    program.absorb(req, results)            the ForwardResults, in the order of `fws`

`next_forwards` does the request's host work (rules, drafts, bookkeeping) until it needs the model
again; it appends final tokens with `req.emit(tokens, mask_id)` as soon as they are decided (a
completed block), so the engine can stream them. When it returns [] the request is finished and
`req.finish_reason` is "stop" (a stop token) or "length" (or None: the engine then uses "length").
A program may read `req.draft_budget` (the scheduler's cap on draft branches; None = no cap) and
must stay lossless for any value of it.

Forwards with `kind == "verify"` go through `program.verifier.verify_many` (packed with the other
forwards into one model call when the verifier is dense, `verifier.packs_with_model`); all others go
to `model.forward_many`. A program without a verifier sets `verifier = None`.

`GeneratorProgram` turns a Python generator per request into these hooks: `run(req)` yields a list
of Forwards and receives their results (`results = yield [fw]`); its frame is stored in
`req.program_state`, so it is per-request state that is closed when the request is freed.
"""
from __future__ import annotations

from typing import Generator, Protocol, runtime_checkable

from specfold.engine.forward import Forward, ForwardResult
from specfold.engine.request import Request


@runtime_checkable
class Program(Protocol):
    verifier: object

    def start(self, req: Request) -> None: ...

    def next_forwards(self, req: Request) -> list[Forward]: ...

    def absorb(self, req: Request, results: list[ForwardResult]) -> None: ...


class GeneratorProgram:
    """Base for programs written as one generator per request (see the module docstring)."""
    verifier = None

    def run(self, req: Request) -> Generator[list[Forward], list[ForwardResult], None]:
        raise NotImplementedError

    def start(self, req: Request) -> None:
        req.program_state = self.run(req)
        req.inbox = None

    def next_forwards(self, req: Request) -> list[Forward]:
        gen = req.program_state
        if gen is None:
            return []
        inbox, req.inbox = req.inbox, None
        try:
            fws = gen.send(inbox)
        except StopIteration:
            req.program_state = None
            return []
        if not fws:
            raise RuntimeError("a program yielded no forwards (return from the generator to finish)")
        return list(fws)

    def absorb(self, req: Request, results: list[ForwardResult]) -> None:
        req.inbox = results
