"""Processes of the code sandbox: the child script, memfds, another uid, and the runs' lifecycle.

`CHILD_SOURCE` is what every run executes: `sandbox_child.py` as this process read it at import,
never re-read from disk (a program that rewrote the file changes nothing here). `LIVE` holds each
running run's process group; `setting_up()` brackets a run's set-up (from before its directory
exists until its process is in `LIVE`). `install_sigterm_cleanup()` (main thread, only over the
default handler) makes SIGTERM refuse new runs, wait for set-ups in flight, kill every run, remove
the weak mode's directories (`/tmp/specfold-sandbox-<pid>-*`) and then die of the signal, as
without the handler. `Group` is one `run_many`'s runs: stopped, it kills them, and a run that
registers afterwards kills itself.
"""
from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from specfold.errors import SpecfoldError

CHILD = Path(__file__).with_name("sandbox_child.py")
CHILD_SOURCE = CHILD.read_bytes()
SANDBOX_UID = 65534


class SandboxUnavailable(SpecfoldError):
    """The OS sandbox cannot run here and the weak fallback was not requested."""


def memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, 0)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def as_user(uid: int | None) -> dict:
    return {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}


def tasks_of_uid(uid: int) -> int:
    """Number of tasks (threads) owned by `uid`, for a relative RLIMIT_NPROC."""
    n = 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.stat(f"/proc/{d}").st_uid == uid:
                    n += len(os.listdir(f"/proc/{d}/task"))
            except OSError:
                pass
    return n


class Group:
    """The process groups of one run_many's runs; once stopped, a run registering kills itself."""

    def __init__(self) -> None:
        self.pids: set[int] = set()
        self.stopped = False

    def add(self, pid: int) -> None:
        self.pids.add(pid)
        if self.stopped:  # run_many gave up after this run's set-up began: do not let it run
            killpg(pid)

    def stop(self) -> None:
        self.stopped = True
        for pid in list(self.pids):
            killpg(pid)


def killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


GROUP = threading.local()  # the Group of the run_many whose worker thread this is




LIVE: dict[str, int] = {}  # run id -> its process group (the weak mode's directories are found by name)
_STARTS = {"n": 0, "main": False, "pending": 0, "stop": False}  # runs being set up; a deferred signal
_STARTS_LOCK = threading.Lock()


def _processes_of(run_ids: list[str]) -> list[int]:
    """Pids whose command line names one of `run_ids` (a bwrap run's outer process and its
    PID-namespace init, which is a fork of it)."""
    keys = [r.encode() for r in run_ids]
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if any(k in cmd for k in keys):
                pids.append(int(d))
    return pids


def _terminate(signum: int) -> None:
    """Kill every run and die of `signum`. The namespace inits are killed by pid too: this process
    dies next, before any worker could reap a run's namespace, and an init that had not yet armed
    bwrap's parent-death signal when its outer process died would otherwise live on."""
    runs = list(LIVE.items())
    for _, pgid in runs:
        killpg(pgid)
    for pid in _processes_of([run_id for run_id, _ in runs]):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for top in Path(tempfile.gettempdir()).glob(f"specfold-sandbox-{os.getpid()}-*"):
        shutil.rmtree(top, ignore_errors=True)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)  # die of the signal, as without the handler (no traceback)


def _on_sigterm(signum, frame) -> None:  # noqa: ANN001
    """Refuse new runs, let the runs being set up (directory made, process not yet registered)
    finish that, kill every run's processes, remove the weak mode's directories, then die of the
    signal. When it interrupted the main thread's own set-up, that set-up finishes first."""
    _STARTS["stop"] = True
    if _STARTS["main"]:
        _STARTS["pending"] = signum
        return
    deadline = time.monotonic() + 2.0
    while _STARTS["n"] and time.monotonic() < deadline:
        time.sleep(0.005)
    _terminate(signum)


def runs_in_flight() -> int:
    """Runs of this process being set up or running."""
    return len(LIVE) + _STARTS["n"]


def install_sigterm_cleanup() -> None:
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


@contextmanager
def setting_up():
    """Marks a run's set-up, from before its directory exists until its process is in LIVE."""
    main = threading.current_thread() is threading.main_thread()
    with _STARTS_LOCK:
        if _STARTS["stop"]:
            raise SandboxUnavailable("the harness is terminating (SIGTERM): no new sandboxed run")
        _STARTS["n"] += 1
    if main:
        _STARTS["main"] = True
    try:
        yield
    finally:
        with _STARTS_LOCK:
            _STARTS["n"] -= 1
        if main:
            _STARTS["main"] = False
            if _STARTS["pending"]:
                _terminate(_STARTS["pending"])
