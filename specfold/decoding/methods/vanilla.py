"""Vanilla decoding: the advance loop with no drafts and dense one-branch forwards."""
from specfold.decoding.plugins import DraftPolicy
from specfold.decoding.methods import register
from specfold.decoding.verify.dense import DenseVerifier


@register("vanilla")
def build(model, spec, params):
    return DraftPolicy(), DenseVerifier(model)
