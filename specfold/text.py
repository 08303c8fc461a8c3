"""Prompt text checks shared by the CLI, the API and the server.

A prompt string must be text: no undecodable bytes (Python keeps those as lone surrogates, e.g. from
a non-UTF-8 command-line argument) and no control characters other than tab, newline and carriage
return. Anything else is refused with one line naming where it came from; nothing is dropped.
"""
from __future__ import annotations

from pathlib import Path

from specfold.errors import ParamsError

_ALLOWED_CONTROLS = "\t\n\r"


def check_text(text: str, where: str) -> str:
    """`text` unchanged, or ParamsError naming `where` and the first offending character."""
    for i, ch in enumerate(text):
        if "\ud800" <= ch <= "\udfff":
            raise ParamsError(f"{where} is not valid UTF-8 text (undecodable byte at character {i}); "
                              f"prompts must be UTF-8 text")
        if (ch < " " and ch not in _ALLOWED_CONTROLS) or ch == "\x7f":
            raise ParamsError(f"{where} holds the control character {ch!r} at character {i}; "
                              f"prompts must be text (binary data is not accepted)")
    return text


def read_text_lines(path: str | Path, what: str) -> list[str]:
    """Non-empty lines of a UTF-8 text file, each checked; `what` names the file in errors (a flag)."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ParamsError(f"{what} {str(path)!r}: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ParamsError(f"{what} {str(path)!r} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                          f"{e.start}); give a text file with one prompt per line") from None
    lines = []
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            lines.append(check_text(line, f"{what} {str(path)!r} line {n}"))
    return lines


def check_prompt_ids(ids: list[int], vocab_size: int, context: int, max_new_tokens: int) -> list[int]:
    """`ids` unchanged, or ParamsError: empty, an id outside [0, vocab_size), or prompt + max_new_tokens
    beyond the model's context (nothing is truncated)."""
    if not ids:
        raise ParamsError("prompt encodes to no tokens")
    bad = [t for t in ids if not (isinstance(t, int) and 0 <= t < vocab_size)]
    if bad:
        raise ParamsError(f"prompt token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}")
    if len(ids) + max_new_tokens > context:
        raise ParamsError(f"prompt of {len(ids)} tokens + max_new_tokens={max_new_tokens} exceeds the "
                          f"model's context of {context} positions; shorten the prompt or lower max_new_tokens")
    return ids
