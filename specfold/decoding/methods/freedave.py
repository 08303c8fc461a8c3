"""FreeDave (static rule) / FreeDave++ (threshold rules): chain drafts, dense verification.

With `eager=True` the dense verifier also returns the per-layer hidden states, so the loop can commit
a block from the window's K/V instead of a separate commit forward."""
from specfold.decoding.drafts.freedave import FreeDave
from specfold.decoding.methods import register
from specfold.decoding.verify.dense import DenseVerifier


class DenseWithHidden(DenseVerifier):
    returns_hidden = True

    def __call__(self, tokens, parents, positions, cache, mask, out_idx, return_hidden: bool = False):
        return self.model(tokens, positions, cache=cache, mask=mask, logits_at=out_idx, return_hidden=return_hidden)


@register("freedave")
def build(model, spec, params):
    return FreeDave(params), (DenseWithHidden(model) if params.eager else DenseVerifier(model))
