"""Registry of decode methods. A method = a draft policy + a verifier plugged into the one loop.

Each method lives in its own module and registers a builder `(model, spec, params) -> (policy,
verifier)`; `get_method` fails with the list of supported names.
"""
from __future__ import annotations

from typing import Callable

from specfold.errors import ParamsError

_METHODS: dict[str, Callable] = {}
BUILTIN = ("vanilla", "freedave", "spiffy", "specfold")  # the modules below (names for --help, no import)


def register(name: str):
    def deco(fn: Callable) -> Callable:
        _METHODS[name] = fn
        return fn
    return deco


def _load_builtin() -> None:
    import importlib
    for mod in BUILTIN:
        try:
            importlib.import_module(f"specfold.decoding.methods.{mod}")
        except ModuleNotFoundError as e:  # a method not built yet is simply not offered
            if e.name != f"specfold.decoding.methods.{mod}":
                raise


def get_method(name: str) -> Callable:
    if not _METHODS:
        _load_builtin()
    if name not in _METHODS:
        raise ParamsError(f"unknown decode method {name!r}; supported: {sorted(_METHODS)}")
    return _METHODS[name]


def method_names() -> list[str]:
    if not _METHODS:
        _load_builtin()
    return sorted(_METHODS)
