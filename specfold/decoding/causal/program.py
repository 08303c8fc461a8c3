"""Engine hooks of the causal programs (engine/program.py's protocol: start / next_forwards / absorb).

`CausalProgram(model, program, verifier)` is built once per engine; each request's `CausalState` lives
in `req.program_state`, with the request's prefix cache, temperature, seed and stop ids. Final tokens
go to the engine through `req.emit` as soon as a round decides them (the engine streams them);
counters go straight into `req.stats` (the state's `stats` is the request's), the prefill into
`req.counters` too (the engine writes those names last), fold statistics of a folded verify into
`req.counters.add_fold`. The draft budget the scheduler sets per step (`req.draft_budget`) caps the
alternative drafts of multi-branch LinearSpec: speed only, never tokens.

Forward kinds: a multi-branch verify (B > 1, writes nothing) is `kind="verify"`, so the engine routes
it through the verifier (FoldVerifier for linear_specfold); a one-branch causal verify writes the
cache and is `kind="commit"` (a dense forward in every method).
"""
from __future__ import annotations

from specfold.decoding.causal.state import CausalState
from specfold.engine.forward import Forward, ForwardResult


class CausalProgram:
    def __init__(self, model, program, verifier=None):
        self.model, self.program, self.verifier = model, program, verifier

    def new_state(self, prompt: list[int], max_new_tokens: int, stop_ids, temperature: float = 0.0,
                  seed: int = 0) -> CausalState:
        cap = len(prompt) + max_new_tokens + 2 * self.program.N
        return CausalState(list(prompt), int(max_new_tokens), frozenset(stop_ids), self.model.new_cache(cap),
                           temperature=float(temperature), seed=int(seed))

    # ------------------------------------------------------------------ engine protocol
    def start(self, req) -> None:
        st = self.new_state(req.prompt_ids, req.params.max_new_tokens, req.stop_ids, req.params.temperature,
                            req.seed)
        st.stats = req.stats
        req.cache, req.program_state = st.cache, st

    def next_forwards(self, req) -> list[Forward]:
        st: CausalState | None = req.program_state
        if st is None:
            return []
        new = st.generated[st.reported:]
        st.reported = len(st.generated)
        if new and req.emit(new, self.program.M):
            return []
        if st.done:
            return []
        st.budget = req.draft_budget
        return self.program.next_forwards(st)

    def absorb(self, req, results: list[ForwardResult]) -> None:
        st: CausalState = req.program_state
        if st.phase == "prefill":
            req.counters.prefill_forwards += 1
        for r in results:
            req.counters.add_fold(r.stats)
        self.program.absorb(st, results)
        if not st.done:
            req.phase = "denoise"
