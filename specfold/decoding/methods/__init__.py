"""Registry of decode methods. A method = a draft policy + a verifier plugged into the one loop.

Each method lives in its own module and registers a builder `(model, spec, params) -> (policy,
verifier)`; `get_method` fails with the list of supported names.
"""
from __future__ import annotations

from typing import Callable

from specfold.errors import ParamsError

_METHODS: dict[str, Callable] = {}
MODULES = ("vanilla", "freedave", "spiffy", "specfold", "causal")  # the modules below
# every built-in method name, for --help without importing the modules (tests check it matches the registry)
BUILTIN = ("vanilla", "freedave", "spiffy", "specfold", "ar", "linear_spec", "linear_spec_multi", "linear_specfold")


def register(name: str):
    def deco(fn: Callable) -> Callable:
        _METHODS[name] = fn
        return fn
    return deco


def _load_builtin() -> None:
    import importlib
    for mod in MODULES:
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


def method_names(spec=None) -> list[str]:
    """Registered names; with a ModelSpec, only the methods that can decode that model (a builder
    may carry `supports(spec) -> bool`; the block methods decode every family)."""
    if not _METHODS:
        _load_builtin()
    return sorted(n for n, fn in _METHODS.items() if spec is None or getattr(fn, "supports", lambda s: True)(spec))
