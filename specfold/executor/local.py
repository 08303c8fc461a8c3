"""`mp`: ranks 1..N-1 as local processes (`python -m specfold.executor.worker`, so the caller's
script is never re-imported and needs no `__main__` guard). A rank gets SIGKILL when rank 0's
process dies (Linux), and its stderr goes to a file whose last line explains an early exit.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile


def exit_reason(code: int | None) -> str:
    if code is None:
        return "is running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class LocalRanks:
    def __init__(self, size: int, addr: str, port: int):
        self.logs, self.procs = {}, {}
        for r in range(1, size):
            self.logs[r] = tempfile.TemporaryFile()
            # -W: runpy's warning that the package imported the module first would be the log's last line
            cmd = [sys.executable, "-W", "ignore::RuntimeWarning:runpy", "-m", "specfold.executor.worker", addr,
                   str(port), str(r), str(size)]
            self.procs[r] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.logs[r], stderr=self.logs[r],
                                             preexec_fn=_die_with_parent if sys.platform == "linux" else None)

    def dead(self) -> dict[int, str]:
        """Ranks whose process has ended -> how (with the last line it wrote, if any)."""
        out = {}
        for r, p in self.procs.items():
            if p.poll() is not None:
                out[r] = exit_reason(p.returncode) + self._last(r)
        return out

    def _last(self, r: int) -> str:
        f = self.logs[r]
        try:
            f.seek(0)
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
        except (OSError, ValueError):
            return ""
        return f" ({lines[-1][:300]})" if lines else ""

    def pids(self) -> dict[int, int]:
        return {r: p.pid for r, p in self.procs.items()}

    def stop(self, wait_s: float) -> None:
        for p in self.procs.values():
            try:
                p.wait(wait_s)
            except subprocess.TimeoutExpired:
                pass
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(5)
        for f in self.logs.values():
            f.close()
