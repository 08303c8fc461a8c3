"""The causal decode methods by name, and a one-request entry point over the standalone driver.

| method              | program                         | verification of the branch batch      |
|---------------------|---------------------------------|---------------------------------------|
| `ar`                | AR                              | -                                     |
| `linear_spec`       | LinearSpec, one branch          | dense (the verify writes the cache)   |
| `linear_spec_multi` | LinearSpec, `branches` drafts   | dense, one batched causal forward     |
| `linear_specfold`   | LinearSpec, `branches` drafts   | folded (SpecFold, δ = `delta`)        |

`build(name, model, spec, config) -> CausalProgram` validates against the model (one-line
ParamsError) and builds the shared parts once; `config` is a resolved EngineConfig (the engine's) or
a DecodeParams (resolved here). The draft rule is the resolved unmask rule (the family's default
unless set); `threshold=0` drafts every mask in one forward (upstream `linear_spec_generate`'s
default). Temperature, seed and stop ids are per request.
"""
from __future__ import annotations

from specfold.decoding.causal import driver
from specfold.decoding.causal.ar import AR, causal_head
from specfold.decoding.causal.linear_spec import LinearSpec
from specfold.decoding.causal.program import CausalProgram
from specfold.decoding.rules import make_rule
from specfold.errors import ParamsError
from specfold.models.spec import ModelSpec
from specfold.outputs import DecodeStats
from specfold.params import DecodeParams

NAMES = ("ar", "linear_spec", "linear_spec_multi", "linear_specfold")


def supports(name: str, spec: ModelSpec) -> bool:
    """Whether method `name` can decode `spec`'s family (the checks `build` raises for)."""
    if name == "ar":
        return spec.attention == "causal_prefix" or (spec.attention == "block_causal" and spec.logits_shift)
    return spec.attention == "causal_prefix"


def build(name: str, model, spec: ModelSpec, config) -> CausalProgram:
    p = config.resolve(spec) if isinstance(config, DecodeParams) else config
    if name == "ar":
        return CausalProgram(model, AR(spec))
    if name not in NAMES:
        raise ParamsError(f"unknown causal method {name!r}; accepted: {list(NAMES)}")
    causal_head(spec, name)
    branches = 1 if name == "linear_spec" else p.branches
    program = LinearSpec(spec, make_rule(p), p.block_size, branches, p.confidence)
    verifier = None
    if name == "linear_specfold":
        if getattr(model, "ar_head", None) is not None:
            raise ParamsError("linear_specfold verifies through the diffusion head, but this checkpoint ships "
                              "a separate causal lm_head; use method='linear_spec_multi' (dense)")
        from specfold.decoding.verify.fold import FoldVerifier
        verifier = FoldVerifier(model, p.delta, p.backend)
    return CausalProgram(model, program, verifier)


def generate_one(method: CausalProgram, prompt: list[int], max_new_tokens: int, stop_ids,
                 temperature: float = 0.0, seed: int = 0) -> tuple[list[int], str, DecodeStats]:
    """One request through the standalone driver (no engine): (token ids, finish reason, stats)."""
    v = method.verifier
    if v is not None:
        v.reset()
    st = method.new_state(prompt, max_new_tokens, stop_ids, temperature, seed)
    driver.run(method.program, st, method.model, v)
    out = st.output()
    if v is not None:
        st.stats.extra.update(v.report())
    return out, st.finish_reason, st.stats
