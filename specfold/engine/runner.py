"""The model runner: the forwards of one engine step -> their results, in as few model calls as the
verifier allows.

With a dense verifier (`packs_with_model`) every forward of the step (prefill, verify, commit) goes
into ONE `Transformer.forward_many` call. Otherwise the verify forwards with drafts go through
`verifier.verify_many` (or one `verifier(...)` per forward when it has none: see
decoding/plugins.py) and the rest through one `forward_many`. A root-only verification (one branch,
e.g. when the adaptive draft budget is 0) joins the dense call: a verifier only changes how draft
rows are computed (a folded verifier always recomputes the root), so its logits are the dense ones.
"""
from __future__ import annotations

from specfold.decoding.plugins import verify_many
from specfold.engine.forward import Forward, ForwardResult
from specfold.models.transformer import Transformer


class ModelRunner:
    def __init__(self, model: Transformer, verifier):
        self.model, self.verifier = model, verifier

    def run(self, forwards: list[Forward]) -> list[ForwardResult]:
        if not forwards:
            return []
        v = self.verifier
        if v is None or getattr(v, "packs_with_model", False) and type(v).verify_many is _dense_verify_many():
            return self.model.forward_many(forwards)
        out: list[ForwardResult | None] = [None] * len(forwards)
        ver = [i for i, f in enumerate(forwards) if f.kind == "verify" and f.tokens.shape[0] > 1]
        rest = [i for i, f in enumerate(forwards) if not (f.kind == "verify" and f.tokens.shape[0] > 1)]
        for idx, res in ((rest, self.model.forward_many([forwards[i] for i in rest]) if rest else []),
                         (ver, verify_many(v, [forwards[i] for i in ver]) if ver else [])):
            for i, r in zip(idx, res):
                out[i] = r
        return out


def _dense_verify_many():
    from specfold.decoding.verify.dense import DenseVerifier
    return DenseVerifier.verify_many
