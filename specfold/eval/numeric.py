"""Final-number extraction for GSM8K-style answers.

Rule: the number on the last `#### ...` line if there is one, else the last number anywhere in
the text. Thousands separators (commas) and a leading `$` are dropped; comparison is numeric
(exact for integers and decimals, via Fraction), so "1,000", "1000" and "1000.00" are equal.
"""
from __future__ import annotations

import re
from fractions import Fraction

_NUM = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_HASHES = re.compile(r"####\s*([^\n]*)")


def _parse(token: str) -> Fraction | None:
    token = token.replace(",", "").rstrip(".")
    if token in ("", "-"):
        return None
    try:
        return Fraction(token)
    except (ValueError, ZeroDivisionError):
        return None


def extract_number(text: str) -> Fraction | None:
    """The final number of a completion or a reference solution (None when there is none)."""
    text = text.replace("\u2212", "-")  # unicode minus
    marked = _HASHES.findall(text)
    if marked:
        nums = _NUM.findall(marked[-1])
        if nums:
            return _parse(nums[0])
    nums = _NUM.findall(text)
    return _parse(nums[-1]) if nums else None


def numbers_equal(a: Fraction | None, b: Fraction | None) -> bool:
    """Exact numeric equality; None never equals anything."""
    return a is not None and b is not None and a == b


def format_number(x: Fraction | None) -> str | None:
    """A JSON-friendly string for a parsed number ("18", "-2.5", "1/3")."""
    if x is None:
        return None
    if x.denominator == 1:
        return str(x.numerator)
    f = float(x)
    return repr(f) if Fraction(f) == x else f"{x.numerator}/{x.denominator}"
