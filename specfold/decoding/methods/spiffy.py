"""Spiffy: a calibrated draft graph of `branches` nodes, dense verification."""
from specfold.decoding.drafts.spiffy import make_policy
from specfold.decoding.methods import register
from specfold.decoding.verify.dense import DenseVerifier


@register("spiffy")
def build(model, spec, params):
    return make_policy(spec, params), DenseVerifier(model)
