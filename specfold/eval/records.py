"""Per-sample bench records in a JSON Lines file, appended as they are made, so a run can resume.

One record = one (task, sample id, method, setting) generation and its score. Invariants:
- `record_key(rec)` = (task, id, method, setting) identifies a record; a resumed run skips every key
  already in the file and appends the rest, so the file never holds a key twice (it keeps the
  first one if a user concatenated files).
- Records are written one line at a time and flushed, so an interrupted run loses at most the line
  being written. A line that is not valid JSON, or lacks the key fields, stops the run before
  anything is computed: `CorruptRecordError`, one line naming the file and line number. The file
  is never rewritten; the user removes or fixes the line (or picks another --out).
- A record also carries the model and the decode parameters it was made with; resuming with other
  ones raises `ResumeError` instead of mixing runs in one file.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from specfold.errors import SpecfoldError

KEY_FIELDS = ("task", "id", "method", "setting")
Key = tuple[str, str, str, str]


class ResumeError(SpecfoldError):
    """The JSONL cannot be resumed by this run (made with another model or other parameters)."""


class CorruptRecordError(ResumeError):
    """A line of the records file is not a complete record."""


def record_key(rec: dict[str, Any]) -> Key:
    return tuple(str(rec[k]) for k in KEY_FIELDS)  # type: ignore[return-value]


def load_records(path: str | os.PathLike) -> dict[Key, dict[str, Any]]:
    """Records of `path` by key (empty if the file does not exist); a corrupt line raises
    CorruptRecordError naming its line number."""
    p = Path(path)
    out: dict[Key, dict[str, Any]] = {}
    if not p.exists():
        return out
    with open(p, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                if not isinstance(rec, dict):
                    raise ValueError("not a JSON object")
                missing = [k for k in KEY_FIELDS if k not in rec]
                if missing:
                    raise ValueError(f"missing fields {missing}")
            except ValueError as e:  # json.JSONDecodeError is a ValueError
                raise CorruptRecordError(
                    f"{p}:{n}: not a complete record ({e}); delete or fix that line (an interrupted run "
                    "can leave a half-written last line), or use another --out") from None
            out.setdefault(record_key(rec), rec)
    return out


def check_compatible(rec: dict[str, Any], model: str, params: dict[str, Any], path: str | os.PathLike) -> None:
    """Raise ResumeError if a stored record was made with another model or other decode parameters."""
    if rec.get("model") != model:
        why = f"model {rec.get('model')!r}, now {model!r}"
    elif rec.get("params") != params:
        old = rec.get("params") or {}
        why = "decode parameters " + ", ".join(f"{k}: {old.get(k)!r} -> {params.get(k)!r}"
                                               for k in sorted(set(old) | set(params)) if old.get(k) != params.get(k))
    else:
        return
    raise ResumeError(f"{path}: record {record_key(rec)} was made with a different {why}; "
                      f"use another --out file, or delete this one to start over")


class RecordWriter:
    """Appends records to a JSONL file, one flushed line each (None path: keeps nothing on disk)."""

    def __init__(self, path: str | os.PathLike | None):
        self.path = Path(path) if path is not None else None
        self._f = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            needs_newline = self.path.exists() and self.path.stat().st_size > 0 and not _ends_with_newline(self.path)
            self._f = open(self.path, "a", encoding="utf-8")
            if needs_newline:  # an interrupted write left a partial last line: keep it apart
                self._f.write("\n")

    def write(self, rec: dict[str, Any]) -> None:
        if self._f is not None:
            self._f.write(json.dumps(rec, ensure_ascii=False, default=_jsonable) + "\n")
            self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _jsonable(obj: Any) -> Any:
    """Tensors and numpy values in a method's counters: as lists / numbers; anything else: str."""
    return obj.tolist() if hasattr(obj, "tolist") else str(obj)


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"

