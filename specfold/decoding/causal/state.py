"""Per-request state of a causal decode program (AR or LinearSpec), and how it counts forwards.

Invariants:
- the token at absolute position `q` is chosen from the causal logits that predict `q`: at T = 0 the
  argmax with the mask token's logit at -inf (ties to the lower id); at T > 0 Gumbel-max with noise
  keyed by (seed, q) (`readout.position_key`). Every causal program therefore picks the same token at
  the same position given the same prefix, which is what makes LinearSpec lossless against AR for a
  fixed seed, at any temperature; a committed token's log-probabilities are those of the causal
  forward that chose it (the same numbers as AR's: that forward saw the same committed prefix);
- `generated` holds the final tokens the request accepted (`DecodeRequest.emit` cuts the output);
- `req.cache.length` = number of positions whose K/V are in the prefix cache; positions
  `[cache.length, start)` are committed tokens waiting to be written (`pending`, multi-branch only).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from specfold.decoding.readout import Read, position_key


@dataclass
class CausalState:
    phase: str = "prefill"  # "prefill" | "decode" (AR) | "draft" | "verify" (LinearSpec) | "done"
    generated: list[int] = field(default_factory=list)
    start: int = 0  # absolute position of the last committed token (the next forward's first row)
    pending: list[int] = field(default_factory=list)  # committed tokens at [cache.length, start)
    round: object = None  # LinearSpec: the current round (linear_spec.Round)

    @property
    def done(self) -> bool:
        return self.phase == "done"


def commit(req, st: CausalState, tokens: list[int], mask_id: int, rows=None) -> bool:
    """Hand final tokens to the request; True (and phase "done") when its output is decided. `rows`:
    the causal read rows the tokens were chosen from (their log-probabilities, when asked for)."""
    lps = [r.logprobs for r in rows] if rows is not None and req.params.logprobs is not None else None
    if req.emit(tokens, mask_id, lps):
        st.phase = "done"
        return True
    st.generated += [int(t) for t in tokens]
    st.start = len(req.prompt_ids) + len(st.generated) - 1
    return False


def remaining(req, st: CausalState) -> int:
    return req.params.max_new_tokens - len(st.generated)


def causal_read(req, positions: list[int], confidence: str = "max_prob") -> Read:
    """The causal choice at every predicted absolute position (one row each)."""
    T = req.params.temperature
    return Read(kind=confidence, temperature=T, keys=[position_key(req.seed, q) for q in positions] if T > 0 else None,
                logprobs=req.params.logprobs)


def count(req, kind: str, rows: int) -> None:
    """Count one forward of `kind` ("prefill" | "decode" | "draft" | "verify") and its token rows."""
    st, ex = req.stats, req.stats.extra
    st.nfe += 1
    if kind == "verify":
        st.verify_forwards += 1
    ex[f"{kind}_forwards"] = ex.get(f"{kind}_forwards", 0) + 1
    ex["rows"] = ex.get("rows", 0) + rows
