"""Run untrusted (model-written) Python in a separate, contained process, EvalPlus-style.

`run_program(source, limits)` writes the program to a fresh temporary directory and runs
`sandbox_child.py` on it in a new process. Layers, outermost first:
- OS isolation when the kernel allows it (probed once, see `isolation()`): `unshare` with a new
  network namespace (no interfaces but a down loopback: no network at all) and a new PID namespace
  whose init is the program (when it dies, every process it started dies with it); as non-root a
  user namespace is created for that. Set SPECFOLD_SANDBOX_NAMESPACES=0 to skip this layer.
- its own session / process group, killed with SIGKILL when the program ends or times out;
- a wall-clock timeout, and resource limits set in the child (address space, CPU seconds, file
  size, open files, processes when not root);
- a minimal environment (HOME and TMPDIR point into the temporary directory) and `python -I`;
- the child's Python guard (see sandbox_child): no sockets, no fork/exec/kill, no ctypes, writes
  and deletions only inside the temporary directory.

Invariants: model output is never executed in the calling process; the temporary directory is
removed afterwards; a result is `passed` only when the program exited 0 within the time limit.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

CHILD = Path(__file__).with_name("sandbox_child.py")
TAIL = 4000  # characters of stdout/stderr kept in a result


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-program limits. cpu_s defaults to the wall timeout rounded up, plus one."""

    timeout_s: float = 10.0
    memory_mb: int = 2048
    cpu_s: int | None = None
    file_mb: int = 16
    nofile: int = 256
    max_procs: int = 16  # extra processes allowed (RLIMIT_NPROC; not enforceable for root)

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.memory_mb <= 0 or self.file_mb <= 0:
            raise ValueError(f"sandbox limits must be positive: {self}")


@dataclass(frozen=True, slots=True)
class RunResult:
    """Outcome of one sandboxed run. status: passed | failed | timeout."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    isolation: str

    @property
    def passed(self) -> bool:
        return self.status == "passed"


_CANDIDATES = (
    ("userns+netns+pidns", ["unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child"]),
    ("netns+pidns", ["unshare", "--net", "--pid", "--fork", "--kill-child"]),
)


@lru_cache(maxsize=1)
def isolation() -> tuple[str, tuple[str, ...]]:
    """(name, command prefix) of the strongest namespace isolation that works here, or ("none", ())."""
    if os.environ.get("SPECFOLD_SANDBOX_NAMESPACES", "1") == "0" or shutil.which("unshare") is None:
        return "none", ()
    for name, prefix in _CANDIDATES:
        try:
            r = subprocess.run([*prefix, sys.executable, "-I", "-c", "pass"], capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            continue
        if r.returncode == 0:
            return name, tuple(prefix)
    return "none", ()


def _tasks_of_current_user() -> int:
    """Number of tasks (threads) owned by this uid, for a relative RLIMIT_NPROC."""
    uid, n = os.getuid(), 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.stat(f"/proc/{d}").st_uid == uid:
                    n += len(os.listdir(f"/proc/{d}/task"))
            except OSError:
                pass
    return n


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - TAIL))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def run_program(source: str, limits: Limits = Limits()) -> RunResult:
    """Run `source` as a Python program in the sandbox (see module docstring)."""
    iso_name, prefix = isolation()
    cfg = {
        "memory_mb": limits.memory_mb,
        "cpu_s": limits.cpu_s if limits.cpu_s is not None else math.ceil(limits.timeout_s) + 1,
        "file_mb": limits.file_mb,
        "nofile": limits.nofile,
        "nproc": 0 if os.getuid() == 0 else _tasks_of_current_user() + limits.max_procs,
    }
    top = Path(tempfile.mkdtemp(prefix="specfold-sandbox-"))
    work = top / "work"
    work.mkdir()
    prog = top / "program.py"
    prog.write_text(source, encoding="utf-8")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(work), "TMPDIR": str(work), "LANG": "C.UTF-8",
           "PYTHONIOENCODING": "utf-8", "PYTHONHASHSEED": "0"}
    cmd = [*prefix, sys.executable, "-I", "-B", str(CHILD), str(prog), json.dumps(cfg)]
    t0 = time.perf_counter()
    status, rc = "failed", None
    try:
        with open(top / "stdout", "wb") as out, open(top / "stderr", "wb") as err:
            proc = subprocess.Popen(cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=err, start_new_session=True)
            try:
                rc = proc.wait(timeout=limits.timeout_s)
                status = "passed" if rc == 0 else "failed"
            except subprocess.TimeoutExpired:
                status = "timeout"
            finally:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                proc.wait()
        seconds = time.perf_counter() - t0
        return RunResult(status, rc, _tail(top / "stdout"), _tail(top / "stderr"), seconds, iso_name)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def run_many(sources: list[str], limits: Limits = Limits(), workers: int = 1) -> list[RunResult]:
    """`run_program` over many programs, `workers` at a time (results in input order)."""
    if workers <= 1:
        return [run_program(s, limits) for s in sources]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda s: run_program(s, limits), sources))
