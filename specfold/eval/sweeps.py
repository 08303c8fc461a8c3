"""Decode configurations of a bench: methods × sweep points, with vanilla as the reference.

`parse_sweep("delta=0,0.05")` / `parse_sweep("branches=2..8")` -> (field, values); `expand_runs`
turns methods, base `DecodeParams` and sweeps (a grid when several) into `Run`s, vanilla first.
Fields that only steer drafts and verification (`DRAFT_FIELDS`) do not apply to vanilla: a sweep
over them runs vanilla once (setting "default") as every point's reference; a sweep over any other
field runs vanilla at every point, and each point is compared with its own vanilla (`ref_setting`).
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Any, Sequence

from specfold.eval.summary import REFERENCE

# DecodeParams fields read only by draft policies and verifiers (vanilla has neither)
DRAFT_FIELDS = ("draft_depth", "eager", "branches", "graph", "delta", "drafts", "backend")


@dataclass(frozen=True)
class Run:
    """One decode configuration: a method with its parameters at one sweep point."""

    method: str
    setting: str  # "default" or "delta=0.05,branches=4"
    sweep: tuple[tuple[str, Any], ...]  # the overrides behind `setting`
    params: Any  # DecodeParams
    ref_setting: str  # setting of the vanilla run this one is compared with


def _setting(items: Sequence[tuple[str, Any]]) -> str:
    return ",".join(f"{k}={v}" for k, v in items) or "default"


def parse_sweep(text: str) -> tuple[str, list]:
    """`delta=0,0.05,0.1` or `branches=2..8` (inclusive integer range) -> (field, values)."""
    from specfold.params import DecodeParams

    field, sep, vals = text.partition("=")
    field = field.strip().replace("-", "_")
    names = [f.name for f in dataclasses.fields(DecodeParams)]
    if not sep or not vals.strip():
        raise ValueError(f"--sweep takes FIELD=V1,V2,... or FIELD=A..B, got {text!r}")
    if field not in names or field in ("method", "chat_template"):
        raise ValueError(f"cannot sweep {field!r}; sweepable DecodeParams fields: "
                         f"{[n for n in names if n not in ('method', 'chat_template')]}")
    if ".." in vals:
        a, _, b = vals.partition("..")
        try:
            return field, list(range(int(a), int(b) + 1))
        except ValueError:
            raise ValueError(f"--sweep {text!r}: A..B needs integers") from None
    return field, [_coerce(v.strip()) for v in vals.split(",") if v.strip()]


def _coerce(v: str) -> Any:
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(v.lower(), v)


def expand_runs(methods: Sequence[str], base, sweeps: Sequence[tuple[str, list]] = ()) -> list[Run]:
    """Runs in execution order: vanilla first, then the other methods, each over the sweep grid."""
    defaults = type(base)()
    points = [tuple(zip([f for f, _ in sweeps], combo)) for combo in itertools.product(*[v for _, v in sweeps])]
    methods = sorted(dict.fromkeys(methods), key=lambda m: m != REFERENCE)
    runs: dict[tuple[str, str], Run] = {}
    for method in methods:
        for point in points:
            ref = tuple((k, v) for k, v in point if k not in DRAFT_FIELDS)
            own = ref if method == REFERENCE else point
            params = base.replace(method=method, **dict(own))
            if method == REFERENCE:  # vanilla has no drafts: normalise their fields
                params = params.replace(**{f: getattr(defaults, f) for f in DRAFT_FIELDS})
            run = Run(method, _setting(own), own, params, _setting(ref))
            runs.setdefault((method, run.setting), run)
    return list(runs.values())
