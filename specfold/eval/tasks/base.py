"""Task interface shared by every benchmark, and the data-location helpers.

A task turns a benchmark file into `Sample`s (one user message each, zero-shot, to be wrapped by
the model's chat template) and scores one completion at a time.

Invariants:
- `load(data, limit)` is deterministic: same file, same order (the file's order), same ids; `limit`
  keeps the first `limit` samples.
- `score(sample, completion)` returns a JSON-serialisable dict with at least `{"correct": bool}`;
  it never raises on a malformed completion (a malformed completion is simply wrong).
- `aggregate(scores)` turns a list of score dicts into the task's headline metrics (floats in [0, 1]).
- `data` is a local file or folder. With `data=None` a task may use a packaged copy (HumanEval,
  the tiny task) or the HF `datasets` package when installed; otherwise it raises `DataError`
  telling the user to pass --data.
"""
from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from specfold.errors import SpecfoldError


class DataError(SpecfoldError):
    """Benchmark data could not be found or read (a ValueError, as every SpecfoldError)."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One benchmark item.

    id: stable identifier (unique within a task), used to resume runs and join methods.
    prompt: the user message (plain text; the engine applies the chat template).
    reference: whatever the scorer needs (final answer, tests, instruction kwargs ...).
    """

    id: str
    prompt: str
    reference: dict[str, Any] = field(default_factory=dict)


class Task(ABC):
    """A benchmark: loads samples and scores completions."""

    name: str = ""

    @abstractmethod
    def load(self, data: str | None = None, limit: int | None = None) -> list[Sample]:
        """Read the benchmark into samples (see module docstring)."""

    @abstractmethod
    def score(self, sample: Sample, completion: str) -> dict[str, Any]:
        """Score one completion; at least {"correct": bool}."""

    def records(self, data: str | None, candidates: list[str], hf: Callable,
                fallback: Path | None = None) -> list[dict[str, Any]]:
        """The benchmark's raw records: a local file (`data`, or one of `candidates` inside the folder
        `data`), else `fallback` (a packaged copy; also when the folder `data` has none of the
        candidates), else HF `datasets` through `hf(load_dataset)`."""
        if fallback is not None and data is not None and Path(data).expanduser().is_dir() \
                and not any((Path(data).expanduser() / c).is_file() for c in candidates):
            return read_records(fallback)
        path = find_file(self.name, data, candidates) or fallback
        return read_records(path) if path is not None else from_hf(self.name, hf)

    def aggregate(self, scores: list[dict[str, Any]]) -> dict[str, float]:
        """Headline metrics over many score dicts (default: accuracy = mean of `correct`)."""
        n = len(scores)
        return {"accuracy": sum(bool(s["correct"]) for s in scores) / n if n else 0.0}


def take(items: Iterable[Sample], limit: int | None) -> list[Sample]:
    """The first `limit` samples (all of them when limit is None)."""
    out = list(items)
    if limit is not None:
        if limit < 0:
            raise DataError(f"limit must be >= 0, got {limit}")
        out = out[:limit]
    return out


def find_file(task: str, data: str | None, candidates: list[str]) -> Path | None:
    """Resolve `data` to a file: the path itself, or the first of `candidates` inside a folder.

    Returns None when `data` is None (the caller may then try another source).
    """
    if data is None:
        return None
    p = Path(data).expanduser()
    if p.is_file():
        return p
    if p.is_dir():
        for c in candidates:
            if (p / c).is_file():
                return p / c
        raise DataError(f"{task}: none of {candidates} found under folder {p}")
    raise DataError(f"{task}: data path {p} does not exist")


def read_records(path: Path) -> list[dict[str, Any]]:
    """A .json array file or a .jsonl file (gzip-compressed .gz also accepted); every record a JSON
    object, else DataError naming the file (and line)."""
    text = _read_text(path)
    if path.suffix == ".json":
        try:
            recs = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(recs, list) or not all(isinstance(r, dict) for r in recs):
            raise DataError(f"{path}: expected a JSON array of records (objects)")
        return recs
    return _parse_lines(path, text)


def _read_text(path: Path) -> str:
    import gzip
    try:
        with (gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else
              open(path, encoding="utf-8")) as f:
            return f.read()
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text (expected JSON Lines or a JSON array)") from None
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{path}: cannot read ({getattr(e, 'strerror', None) or e})") from None


def _parse_lines(path: Path, text: str) -> list[dict[str, Any]]:
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{i}: not valid JSON ({e})") from None
            if not isinstance(rec, dict):
                raise DataError(f"{path}:{i}: expected a JSON object, got {type(rec).__name__}")
            out.append(rec)
    return out


def from_hf(task: str, loader: Callable[[Any], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Records from the HF `datasets` package when installed, else a DataError asking for --data.

    `loader` receives the `datasets.load_dataset` function and returns plain dict records.
    """
    try:
        from datasets import load_dataset  # type: ignore[import-not-found]
    except ImportError:
        raise DataError(
            f"{task}: no data given. Pass --data PATH (a file or a folder such as shared/data), "
            "or install the HF `datasets` package to download it."
        ) from None
    try:
        return loader(load_dataset)
    except Exception as e:  # network errors, missing configs ...
        raise DataError(f"{task}: loading from HF datasets failed ({e}); pass --data PATH") from e
