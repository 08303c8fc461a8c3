"""Engine hooks of the causal programs: the same interface as the block program (decoding/program.py).

`CausalProgram(program, verifier)` is built once per engine; each request's `CausalState` lives in
`req.state`. `start(req, new_cache)` makes the request's prefix cache; every step `plan(req, pick)
-> [Job]` (they propose nothing, so the engine's pick is always None) and `update(req, results)`;
final tokens go to the request through `req.emit` as soon as a round decides them (the engine
streams them). A fixed `draft_budget` (the request's config) caps the alternative drafts of
multi-branch LinearSpec: speed only, never tokens.

Job kinds: a multi-branch verify (B > 1, writes nothing) is `kind="verify"`, so the runner routes it
through the verifier (FoldVerifier for linear_specfold); a one-branch causal verify writes the cache
and is `kind="commit"` (a dense forward in every method).
"""
from __future__ import annotations

from specfold.decoding.causal.state import CausalState
from specfold.decoding.jobs import Job, JobResult


class CausalProgram:
    whole_blocks = False  # any max_new_tokens (the family's diffusion mode decodes whole blocks)

    def __init__(self, program, verifier=None):
        self.program, self.verifier = program, verifier

    def start(self, req, new_cache) -> None:
        req.cache = new_cache(len(req.prompt_ids) + req.params.max_new_tokens + 2 * self.program.N)
        req.state = CausalState(generated=list(req.output_ids))  # a preempted request resumes after them

    def plan(self, req, pick=None) -> list[Job]:
        st: CausalState = req.state
        return [] if st.done else self.program.plan(req, st)

    def update(self, req, results: list[JobResult]) -> None:
        for r in results:
            req.counters.add_fold(r.stats)
        self.program.update(req, req.state, results)

    def done(self, req) -> bool:
        return req.state is None or req.state.done

    def report(self, req) -> None:
        pass
