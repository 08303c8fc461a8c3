"""FreeDave (static rule) / FreeDave++ (threshold rules): chain drafts, dense verification.

With `eager=True` the dense verifier also returns the per-layer hidden states, so the program can
commit a block from the window's K/V instead of a separate commit forward."""
from specfold.decoding.drafts.freedave import FreeDave
from specfold.decoding.methods import register
from specfold.decoding.verify.dense import DenseVerifier


@register("freedave")
def build(model, spec, params):
    return FreeDave(params), DenseVerifier(model)
