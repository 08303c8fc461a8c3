"""IFEval instruction following: strict and loose verdicts for one response.

`follows(response, instruction_ids, kwargs_list)` -> (strict, loose) lists of bools, one per
instruction. Strict: the response itself (an empty or blank response follows nothing). Loose: the
instruction counts as followed if any of 8 variants passes: the response with/without its first
line, last line, or both, each with and without every `*` removed (the official loose rule).
"""
from __future__ import annotations

from typing import Any

from specfold.eval.instructions.checkers import CHECKERS


def _variants(response: str) -> list[str]:
    lines = response.split("\n")
    cut = [response, "\n".join(lines[1:]).strip(), "\n".join(lines[:-1]).strip(), "\n".join(lines[1:-1]).strip()]
    return cut + [c.replace("*", "") for c in cut]


def check_one(instruction_id: str, response: str, kwargs: dict[str, Any]) -> bool:
    """Whether `response` follows one instruction (strict); unknown ids raise KeyError."""
    if instruction_id not in CHECKERS:
        raise KeyError(f"unknown IFEval instruction {instruction_id!r}; supported: {sorted(CHECKERS)}")
    args = {k: v for k, v in kwargs.items() if v is not None}
    return bool(response.strip()) and CHECKERS[instruction_id](response, **args)


def follows(response: str, instruction_ids: list[str], kwargs_list: list[dict[str, Any]]) -> tuple[list[bool], list[bool]]:
    """Per-instruction strict and loose verdicts."""
    variants = _variants(response)
    strict = [check_one(i, response, kw) for i, kw in zip(instruction_ids, kwargs_list)]
    loose = [any(check_one(i, v, kw) for v in variants) for i, kw in zip(instruction_ids, kwargs_list)]
    return strict, loose


__all__ = ["CHECKERS", "check_one", "follows"]
