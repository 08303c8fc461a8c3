"""Vanilla references as immutable data: what a lossless method's output is compared with, decoded
once for the session (the fixtures in conftest.py) and frozen, so that no test can change the
reference another test reads. A RequestOutput's token ids are a list, a reference's a tuple:
compare `tuple(out.token_ids) == ref.token_ids`."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Ref:
    """One request's vanilla decode: what the lossless tests read from it."""
    token_ids: tuple[int, ...]
    prompt_token_ids: tuple[int, ...]
    text: str
    finish_reason: str
    nfe: int


def freeze(outs) -> tuple[Ref, ...]:
    """RequestOutputs -> a tuple of `Ref`s (copies: the outputs themselves stay the caller's)."""
    return tuple(Ref(tuple(o.token_ids), tuple(o.prompt_token_ids), o.text, o.finish_reason, o.stats.nfe)
                 for o in outs)

