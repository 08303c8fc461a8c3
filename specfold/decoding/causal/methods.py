"""The causal decode methods by name.

| method              | program                         | verification of the branch batch      |
|---------------------|---------------------------------|---------------------------------------|
| `ar`                | AR                              | -                                     |
| `linear_spec`       | LinearSpec, one branch          | dense (the verify writes the cache)   |
| `linear_spec_multi` | LinearSpec, `branches` drafts   | dense, one batched causal forward     |
| `linear_specfold`   | LinearSpec, `branches` drafts   | folded (SpecFold, δ = `delta`)        |

`build(name, model, spec, config) -> CausalProgram` validates against the model (one-line
ParamsError) and builds the shared parts once; `config` is the engine's resolved EngineConfig. The draft rule is the resolved unmask rule (the family's default
unless set); `threshold=0` drafts every mask in one forward (upstream `linear_spec_generate`'s
default). Temperature, seed and stop ids are per request.
"""
from __future__ import annotations

from specfold.decoding.causal.ar import AR, causal_head
from specfold.decoding.causal.linear_spec import LinearSpec
from specfold.decoding.causal.program import CausalProgram
from specfold.decoding.rules import make_rule
from specfold.errors import ParamsError
from specfold.models.spec import ModelSpec
from specfold.params import EngineConfig

NAMES = ("ar", "linear_spec", "linear_spec_multi", "linear_specfold")


def supports(name: str, spec: ModelSpec) -> bool:
    """Whether method `name` can decode `spec`'s family (the checks `build` raises for)."""
    if name == "ar":
        return spec.attention == "causal_prefix" or (spec.attention == "block_causal" and spec.logits_shift)
    return spec.attention == "causal_prefix"


def build(name: str, model, spec: ModelSpec, config: EngineConfig) -> CausalProgram:
    p = config
    if name == "ar":
        return CausalProgram(AR(spec))
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
    return CausalProgram(program, verifier)
