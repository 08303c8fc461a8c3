"""The common header of a result file under benchmarks/results/: what ran, where, when, at which commit.

    from provenance import header, write_result
    head = header(note="shared core")          # at the start of the run
    ...                                        # measure
    write_result(path, head, {"rows": rows})   # the header's fields first, then the payload

Fields (benchmarks/report.py reads them; it never runs a benchmark):
- `command`: the command line as run, relative to the repository root, with the variables of `ENV` and
  the CPU affinity (`taskset -c`) when they were set;
- `commit`: the full hash of HEAD of the tree the script ran from, and `tree_dirty`: whether its
  tracked files outside benchmarks/results/ had uncommitted changes (then the figures are not that
  commit's alone);
- `date`: the start, UTC, ISO 8601; `seconds`: how long the run took;
- `machine`: cpu model, cores, the cores the process may use, python, torch, platform, and `note`
  (what the run shared the machine with: "shared core", "quiet", ...);
- `load`: the 1-minute load average at the start and at the end.
Standard library only (torch's version is read only if torch is already imported or importable).
"""
from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = ("OMP_NUM_THREADS", "MALLOC_MMAP_THRESHOLD_")  # the variables that change what a benchmark measures
RESULTS = "benchmarks/results"  # result files written by earlier runs do not make a tree dirty


def _git(*args: str) -> str:
    r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else ""


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _affinity() -> list[int] | None:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def _torch_version() -> str | None:
    try:
        import torch
        return torch.__version__
    except ImportError:
        return None


def command(argv: list[str] | None = None) -> str:
    """The command line as run: env prefix, affinity, `python <script relative to the root> args`."""
    argv = sys.argv if argv is None else argv
    script = Path(argv[0]).resolve()
    try:
        script_s = str(script.relative_to(ROOT))
    except ValueError:
        script_s = argv[0]
    parts = [f"{k}={os.environ[k]}" for k in ENV if k in os.environ]
    cpus = _affinity()
    if cpus is not None and len(cpus) < (os.cpu_count() or len(cpus)):
        parts.append(f"taskset -c {','.join(map(str, cpus))}")
    parts += ["python", script_s, *(shlex.quote(a) for a in argv[1:])]
    return " ".join(parts)


def machine(note: str | None = None) -> dict:
    return {"cpu": _cpu_model(), "cores": os.cpu_count(), "affinity": _affinity(),
            "python": platform.python_version(), "torch": _torch_version(), "platform": platform.platform(),
            "note": note or ""}


def header(note: str | None = None, argv: list[str] | None = None) -> dict:
    """Call at the start of a run."""
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no", "--", ".", f":(exclude){RESULTS}"))
    return {"command": command(argv), "commit": _git("rev-parse", "HEAD") or None, "tree_dirty": dirty,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(note),
            "load": [os.getloadavg()[0] if hasattr(os, "getloadavg") else None], "_t0": time.time()}


def write_result(path: str | Path, head: dict, payload: dict) -> Path:
    """Write `head` (completed with the run's length and end load) and then `payload` as one JSON file."""
    head = dict(head)
    t0 = head.pop("_t0", None)
    if t0 is not None:
        head["seconds"] = round(time.time() - t0, 1)
    head["load"] = [*head.get("load", []), os.getloadavg()[0] if hasattr(os, "getloadavg") else None]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**head, **payload}, indent=1) + "\n")
    return path
