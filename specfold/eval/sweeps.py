"""Decode configurations of a bench: methods × sweep points, with vanilla as the reference.

`parse_sweep("delta=0,0.05")` / `parse_sweep("branches=2..8")` -> (field, values); `expand_runs`
turns methods, base `DecodeParams` and sweeps (a grid when several) into `Run`s, vanilla first.
Fields that only steer drafts and verification (`DRAFT_FIELDS`) apply only to the methods that read
them (`METHOD_FIELDS`: delta only to specfold, draft_depth to freedave and specfold, ...): a method
that does not read a swept field runs once for all its values (vanilla, with none, once in all as
every point's reference). A sweep over any other field runs every method, vanilla included, at
every point, and each point is compared with its own vanilla (`ref_setting`). Values are parsed as
the field's type ("delta=a" is refused, not passed on as a string).
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Any, Sequence

from specfold.errors import ParamsError
from specfold.eval.summary import REFERENCE
from specfold.params import EngineConfig, draft_fields

# the fields read only by draft policies and verifiers (vanilla has neither): params.py marks them
DRAFT_FIELDS = draft_fields(EngineConfig)
# the draft fields each built-in method reads (a method not listed: all of them)
METHOD_FIELDS: dict[str, tuple[str, ...]] = {
    REFERENCE: (),
    "freedave": ("draft_depth", "eager", "draft_budget"),
    "spiffy": ("branches", "graph", "graph_depth", "eager", "draft_budget"),
    "specfold": DRAFT_FIELDS,
}


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
    """`delta=0,0.05,0.1` or `branches=2..8` (inclusive integer range) -> (field, values), each value
    of the field's type; ParamsError (one line) for anything else."""
    from specfold.params import DecodeParams

    field, sep, vals = text.partition("=")
    field = field.strip().replace("-", "_")
    types = {f.name: str(f.type) for f in dataclasses.fields(DecodeParams)}
    if not sep or not vals.strip():
        raise ParamsError(f"--sweep takes FIELD=V1,V2,... or FIELD=A..B, got {text!r}")
    if field not in types or field in ("method", "chat_template"):
        raise ParamsError(f"cannot sweep {field!r}; sweepable DecodeParams fields: "
                          f"{[n for n in types if n not in ('method', 'chat_template')]}")
    if ".." in vals:
        a, _, b = vals.partition("..")
        try:
            return field, list(range(int(a), int(b) + 1))
        except ValueError:
            raise ParamsError(f"--sweep {text!r}: A..B needs integers") from None
    values = [_coerce(v.strip(), types[field], f"--sweep {text!r}") for v in vals.split(",") if v.strip()]
    if not values:
        raise ParamsError(f"--sweep {text!r}: no values")
    return field, values


def _coerce(v: str, type_: str, where: str) -> Any:
    """`v` as a value of the field type named `type_` ("float | None", "int", "bool", "str", ...)."""
    if "None" in type_ and v.lower() == "none":
        return None
    if "bool" in type_:
        if v.lower() in ("true", "false"):
            return v.lower() == "true"
        raise ParamsError(f"{where}: {v!r} is not true/false")
    casts = (int, float) if "float" in type_ else (int,) if "int" in type_ else ()
    for cast in casts:  # "0" stays 0 for a float field, so the setting reads as typed ("delta=0")
        try:
            return cast(v)
        except ValueError:
            pass
    if casts and "str" not in type_:  # "int | str" (draft_budget): a word stays a word ("auto")
        raise ParamsError(f"{where}: {v!r} is not {'a number' if float in casts else 'an integer'}")
    return v


def uses(method: str, field: str) -> bool:
    """Whether `method` reads DecodeParams `field` (every non-draft field is read by every method)."""
    return field not in DRAFT_FIELDS or field in METHOD_FIELDS.get(method, DRAFT_FIELDS)


def expand_runs(methods: Sequence[str], base, sweeps: Sequence[tuple[str, list]] = ()) -> list[Run]:
    """Runs in execution order: vanilla first, then the other methods, each over the sweep grid
    restricted to the fields it reads (so a method runs once per distinct setting of its own)."""
    defaults = type(base)()
    points = [tuple(zip([f for f, _ in sweeps], combo)) for combo in itertools.product(*[v for _, v in sweeps])]
    methods = sorted(dict.fromkeys(methods), key=lambda m: m != REFERENCE)
    runs: dict[tuple[str, str], Run] = {}
    for method in methods:
        for point in points:
            ref = tuple((k, v) for k, v in point if k not in DRAFT_FIELDS)
            own = tuple((k, v) for k, v in point if uses(method, k))
            params = base.replace(method=method, **dict(own))
            if method == REFERENCE:  # vanilla has no drafts: normalise their fields
                params = params.replace(**{f: getattr(defaults, f) for f in DRAFT_FIELDS})
            run = Run(method, _setting(own), own, params, _setting(ref))
            runs.setdefault((method, run.setting), run)
    return list(runs.values())
