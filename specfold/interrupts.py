"""SIGINT and SIGTERM for the command line: both unwind the main thread as exceptions, never inside
a compiled extension's initialiser.

`handling_signals()` (a context manager around a command) makes SIGINT raise `KeyboardInterrupt`, as
Python does, and SIGTERM raise `Terminated`, so `finally` blocks and context managers run (temp dirs
removed, partial records closed) and the CLI can end with one line instead of being killed mid-write.

Invariants:
- An exception is never raised while a compiled extension module initialises (nanobind, pybind11:
  lazy imports such as triton's run them). Such an initialiser calls back into Python, and an
  exception thrown through it aborts the process ("terminate called after throwing ...", a C++
  traceback, status 134). A signal that lands there is re-delivered every 50 ms until the
  initialiser is done (at most `MAX_DEFER_S`, then it is raised anyway). Pure-Python imports and
  everything else are interrupted at once.
- Only the process that installed the handlers raises: a forked child (a worker) gets Python's
  own behaviour (KeyboardInterrupt on SIGINT, death on SIGTERM).
- The handlers are installed with both signals blocked, so a signal that arrives meanwhile is
  raised inside the block (never between the two installs, never lost); the previous handlers come
  back when the block ends; outside the main thread nothing is installed.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

MAX_DEFER_S = 30.0  # an initialiser that takes longer than this is interrupted all the same
RETRY_S = 0.05


class Terminated(BaseException):
    """SIGTERM, raised in the main thread (a BaseException, like KeyboardInterrupt: `except
    Exception` does not swallow it)."""


def _in_extension_init(frame) -> bool:
    """A compiled extension module is being created or executed somewhere up the stack."""
    from importlib.machinery import ExtensionFileLoader
    while frame is not None:
        code = frame.f_code
        if (code.co_name in ("create_module", "exec_module") and code.co_filename.startswith("<frozen importlib")
                and isinstance(frame.f_locals.get("self"), ExtensionFileLoader)):
            return True
        frame = frame.f_back
    return False


class _Handler:
    def __init__(self):
        self.pid = os.getpid()
        self.deferred_since: dict[int, float] = {}
        self.timers: list[threading.Timer] = []

    def __call__(self, signum, frame):
        if os.getpid() != self.pid:  # a forked child: Python's default behaviour
            if signum == signal.SIGINT:
                signal.default_int_handler(signum, frame)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        since = self.deferred_since.setdefault(signum, time.monotonic())
        if _in_extension_init(frame) and time.monotonic() - since < MAX_DEFER_S:
            t = threading.Timer(RETRY_S, os.kill, (self.pid, signum))
            t.daemon = True
            t.start()
            self.timers.append(t)
            return
        self.deferred_since.pop(signum, None)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated


@contextlib.contextmanager
def handling_signals():
    """SIGINT -> KeyboardInterrupt, SIGTERM -> Terminated, never inside an extension's initialiser."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = _Handler()
    signals = (signal.SIGINT, signal.SIGTERM)
    saved = {}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, signals)  # installed as one step: a signal now waits
    try:
        for s in signals:
            saved[s] = signal.signal(s, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # a signal that waited is raised here, in the block
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # (when the installs themselves were interrupted)
        for t in handler.timers:  # a signal still deferred when the command ended: it has nothing left to stop
            t.cancel()
        for s, old in saved.items():
            signal.signal(s, old if old is not None else signal.SIG_DFL)
