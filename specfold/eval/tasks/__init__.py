"""Registry of benchmark tasks: `get_task(name)` -> Task.

Invariant: every name in TASKS maps to a zero-argument factory of a Task whose `.name` equals the
key; an unknown name fails with the list of supported names. Task modules are imported lazily so
that importing the registry stays cheap.
"""
from __future__ import annotations

import importlib

from specfold.eval.tasks.base import DataError, Sample, Task

# name -> (module, class name)
TASKS: dict[str, tuple[str, str]] = {
    "gsm8k": ("specfold.eval.tasks.gsm8k", "GSM8K"),
    "math500": ("specfold.eval.tasks.math500", "MATH500"),
    "humaneval": ("specfold.eval.tasks.humaneval", "HumanEval"),
    "mbpp": ("specfold.eval.tasks.mbpp", "MBPP"),
    "mbpp_full": ("specfold.eval.tasks.mbpp", "MBPPFull"),
    "ifeval": ("specfold.eval.tasks.ifeval", "IFEval"),
    "tiny": ("specfold.eval.tasks.tiny", "Tiny"),
    "tiny_fresh": ("specfold.eval.tasks.tiny", "TinyFresh"),
}


def get_task(name: str) -> Task:
    """A fresh Task instance for `name` (case-insensitive, '-' and '_' alike)."""
    key = name.strip().lower().replace("-", "_")
    if key not in TASKS:
        raise DataError(f"unknown task {name!r}; supported: {', '.join(sorted(TASKS))}")
    module, cls = TASKS[key]
    return getattr(importlib.import_module(module), cls)()


__all__ = ["TASKS", "DataError", "Sample", "Task", "get_task"]
