"""Run one request of a causal program by executing each `Forward` itself (no engine needed).

`execute` is the whole model side: `model.forward` with the Forward's fields, except that a
multi-branch `kind="verify"` forward goes through `verifier` when one is given (FoldVerifier: folded
verification of the causal branch batch). The engine replaces this file with its packed model call.
"""
from __future__ import annotations

import time

import torch

from specfold.decoding.causal.state import CausalState
from specfold.engine.forward import Forward, ForwardResult


def execute(model, f: Forward, verifier=None) -> ForwardResult:
    if verifier is not None and f.kind == "verify" and f.tokens.shape[0] > 1:
        logits = verifier(f.tokens, f.parents, f.positions, f.cache, f.mask, f.logits_at)
    else:
        logits = model(f.tokens, f.positions, cache=f.cache, mask=f.mask, write_cache=f.write_cache,
                       logits_at=f.logits_at, head=f.head)
    return ForwardResult(logits)


def run(program, st: CausalState, model, verifier=None) -> CausalState:
    """Advance `st` to the end (wall time in `st.stats.seconds`)."""
    t0 = time.perf_counter()
    with torch.inference_mode():
        while not st.done:
            fwds = program.next_forwards(st)
            program.absorb(st, [execute(model, f, verifier) for f in fwds])
    st.stats.seconds = time.perf_counter() - t0
    return st
