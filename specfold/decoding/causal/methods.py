"""The causal decode methods by name, and a one-request entry point over the standalone driver.

| method              | program                         | verification of the branch batch      |
|---------------------|---------------------------------|---------------------------------------|
| `ar`                | AR                              | -                                     |
| `linear_spec`       | LinearSpec, one branch          | dense (the verify writes the cache)   |
| `linear_spec_multi` | LinearSpec, `branches` drafts   | dense, one batched causal forward     |
| `linear_specfold`   | LinearSpec, `branches` drafts   | folded (SpecFold, δ = `delta`)        |

`build(name, model, spec, params) -> CausalMethod(program, verifier)` validates against the model
(one-line ParamsError) and builds the shared parts once; per-request state is made by
`program.start(...)`. The draft rule is the resolved unmask rule (the family's default unless set);
`threshold=0` drafts every mask in one forward (upstream `linear_spec_generate`'s default).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from specfold.decoding.causal import driver
from specfold.decoding.causal.ar import AR, causal_head
from specfold.decoding.causal.linear_spec import LinearSpec
from specfold.decoding.rules import make_rule
from specfold.errors import ParamsError
from specfold.models.spec import ModelSpec
from specfold.outputs import DecodeStats
from specfold.params import DecodeParams

NAMES = ("ar", "linear_spec", "linear_spec_multi", "linear_specfold")


@dataclass
class CausalMethod:
    program: AR | LinearSpec
    verifier: object = None  # FoldVerifier for linear_specfold; None = dense (model.forward)


def resolve(params: DecodeParams, spec: ModelSpec) -> DecodeParams:
    """DecodeParams.resolve without the diffusion mode's whole-block length rule (causal programs
    decode any number of tokens)."""
    return params.resolve(dataclasses.replace(spec, max_new_tokens_multiple_of_block=False))


def build(name: str, model, spec: ModelSpec, params: DecodeParams) -> CausalMethod:
    p = resolve(params, spec)
    if name == "ar":
        return CausalMethod(AR(spec, p.temperature, p.seed))
    if name not in NAMES:
        raise ParamsError(f"unknown causal method {name!r}; accepted: {list(NAMES)}")
    causal_head(spec, name)
    branches = 1 if name == "linear_spec" else p.branches
    program = LinearSpec(spec, make_rule(p), p.block_size, branches, p.confidence, p.temperature, p.seed)
    verifier = None
    if name == "linear_specfold":
        if getattr(model, "ar_head", None) is not None:
            raise ParamsError("linear_specfold verifies through the diffusion head, but this checkpoint ships "
                              "a separate causal lm_head; use method='linear_spec_multi' (dense)")
        from specfold.decoding.verify.fold import FoldVerifier
        verifier = FoldVerifier(model, p.delta, p.backend)
    return CausalMethod(program, verifier)


def generate_one(method: CausalMethod, model, prompt: list[int], max_new_tokens: int,
                 stop_ids) -> tuple[list[int], str, DecodeStats]:
    """One request through the standalone driver: (token ids, finish reason, stats)."""
    v = method.verifier
    if v is not None:
        v.reset()
    cache = model.new_cache(capacity=len(prompt) + max_new_tokens + 2 * getattr(method.program, "N", 1))
    st = method.program.start(prompt, cache, max_new_tokens, frozenset(stop_ids))
    driver.run(method.program, st, model, v)
    out = st.output()
    if v is not None:
        st.stats.extra.update(v.report())
    return out, st.finish_reason, st.stats
