"""SpecFold: a speculative draft policy (Spiffy graph or FreeDave chain, `params.drafts`) verified by
folded verification instead of the dense batched forward."""
from specfold.decoding.methods import get_method, register
from specfold.decoding.verify.fold import FoldVerifier
from specfold.errors import ParamsError
from specfold.kernels import triton_unavailable


@register("specfold")
def build(model, spec, params):
    if params.drafts not in ("spiffy", "freedave"):
        raise ParamsError(f"drafts={params.drafts!r}; accepted: 'spiffy', 'freedave'")
    if params.backend == "triton" and (why := triton_unavailable(next(model.parameters()).device)):
        raise ParamsError(why)
    policy, _dense = get_method(params.drafts)(model, spec, params)
    return policy, FoldVerifier(model, params.delta, params.backend)
