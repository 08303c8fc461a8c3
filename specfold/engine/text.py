"""Incremental text of a request: deltas of the decoded final tokens, cut before a stop string.

Invariants: the concatenated deltas of a request equal its final `RequestOutput.text`; text that
could still turn out to begin a stop string (a suffix that is a proper prefix of one) or an
incomplete UTF-8 sequence (trailing U+FFFD) is held back until it is decided; on a stop-string
match the text ends right before the match and the token ids end at the token that completed it.
"""
from __future__ import annotations

from specfold.engine.request import Request


def _holdback(text: str, stops: list[str]) -> int:
    """Characters at the end of `text` that are not decided yet."""
    n = 0
    while n < len(text) and text[len(text) - 1 - n] == "\ufffd":
        n += 1
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                n = max(n, k)
                break
    return n


def find_stop(text: str, stops: list[str], lo: int = 0) -> int | None:
    """Index of the earliest stop-string match starting at or after `lo - longest stop + 1`."""
    best = None
    for s in stops:
        i = text.find(s, max(0, lo - len(s) + 1))
        if i >= 0 and (best is None or i < best):
            best = i
    return best


def advance_text(tokenizer, req: Request, final: bool) -> tuple[str, bool]:
    """(text delta not yet reported, whether a stop string was matched). On a match, trims
    `req.output_ids` to the tokens that complete the match."""
    if tokenizer is None:
        return "", False
    stops = req.params.stop or []
    full = tokenizer.decode(req.output_ids)
    cut = find_stop(full, stops, req.text_reported) if stops else None
    if cut is not None:
        k = req.reported  # keep the fewest tokens whose text still holds the match
        while k < len(req.output_ids) and find_stop(tokenizer.decode(req.output_ids[:k]), stops) is None:
            k += 1
        del req.output_ids[k:]
        delta = full[req.text_reported: cut]
        req.text_reported = cut
        req.text = full[:cut]
        return delta, True
    safe = len(full) if final else len(full) - _holdback(full, stops)
    safe = max(safe, req.text_reported)
    delta = full[req.text_reported: safe]
    req.text_reported = safe
    req.text = full[:safe] if not final else full
    return delta, False
