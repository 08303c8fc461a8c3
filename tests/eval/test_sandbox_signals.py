"""SIGTERM of a harness that is running sandboxed code: it dies of the signal (or, under the
CLI's handlers, unwinds and exits 143), silently and at once, and leaves no
/tmp/specfold-sandbox-* directory and no process of the run behind (bubblewrap and weak mode). The harness is a real separate Python process; this test process is its subreaper,
so nothing of it can hide by re-parenting."""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.eval.sandbox_helpers import own_tree, subreaper  # noqa: F401 (subreaper: autouse fixture)

ROOT = Path(__file__).resolve().parents[2]
HARNESS = """
import contextlib, os, sys
if sys.argv[1] == "weak":
    os.environ["SPECFOLD_SANDBOX"] = "weak"
    from specfold.eval import sandbox
    sandbox._probe_bwrap = lambda: "switched off for the test"
from specfold.eval.sandbox import Limits, run_many
from specfold.interrupts import Terminated, handling_signals
cli = sys.argv[2] == "cli"  # the CLI's handlers: SIGTERM unwinds as an exception, exit 143
try:
    with handling_signals() if cli else contextlib.nullcontext():
        print("running", flush=True)
        run_many(["import time\\ntime.sleep(120)"] * 6, Limits(timeout_s=120.0), workers=2)
except Terminated:
    sys.exit(143)
"""


def sandbox_processes(root: int) -> list[str]:
    return [c for c in own_tree(root).values() if "/tmp/.specfold/" in c or "specfold-sandbox-" in c]


@pytest.mark.parametrize("handlers", ["default", "cli"])
@pytest.mark.parametrize("mode", [pytest.param("bwrap", marks=pytest.mark.sandbox("bwrap")),
                                  pytest.param("weak", marks=pytest.mark.sandbox("weak"))])
def test_sigterm_leaves_nothing_behind(mode, handlers):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPECFOLD_SANDBOX")}
    env["PYTHONPATH"] = str(ROOT)
    p = subprocess.Popen([sys.executable, "-c", HARNESS, mode, handlers], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env, cwd=ROOT, text=True)
    try:
        assert p.stdout.readline().strip() == "running"
        deadline = time.monotonic() + 60
        while len(sandbox_processes(p.pid)) < 2 and time.monotonic() < deadline:  # both workers' programs run
            time.sleep(0.1)
        assert sandbox_processes(p.pid), "the sandboxed programs never started"
        dirs_during = glob.glob(f"/tmp/specfold-sandbox-{p.pid}-*")
        assert bool(dirs_during) == (mode == "weak")  # bwrap runs keep nothing on the host's disk
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
        seconds = time.monotonic() - t0
    finally:
        p.kill()
    assert p.returncode == (143 if handlers == "cli" else -signal.SIGTERM)
    assert seconds < 5  # the running programs are killed, the queued ones never start
    lines = [ln for ln in err.splitlines() if not ln.startswith("specfold: warning:")]
    assert lines == []  # no traceback (the weak mode's one warning line aside)
    assert glob.glob(f"/tmp/specfold-sandbox-{p.pid}-*") == []
    deadline = time.monotonic() + 10
    while sandbox_processes(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sandbox_processes(os.getpid()) == []
