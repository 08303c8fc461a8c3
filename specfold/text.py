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
