"""SIGINT and SIGTERM for the command line: both unwind the main thread as exceptions, never where
an exception cannot propagate, and never kill the process by the default action.

`handling_signals()` (a context manager around a command) makes SIGINT raise `KeyboardInterrupt`, as
Python does, and SIGTERM raise `Terminated`, so `finally` blocks and context managers run (temp dirs
removed, partial records closed) and the CLI can end with one line instead of being killed mid-write.
`exit_quietly()` covers the rest of a program's life, before and after that block (interpreter
teardown included).

Invariants:
- An exception is never raised while a compiled extension module initialises (nanobind, pybind11:
  lazy imports such as triton's run them). Such an initialiser calls back into Python, and an
  exception thrown through it aborts the process ("terminate called after throwing ...", a C++
  traceback, status 134). Nor is it raised in importlib's own bookkeeping (module locks and their
  weakref callback, which are not safe against an exception between two statements). A signal
  that lands there is re-delivered every 50 ms until that code is done (at most `MAX_DEFER_S`, then
  it is raised anyway). Pure-Python module bodies and everything else are interrupted at once.
- An interrupt that still lands where Python cannot propagate it (a weakref callback, `__del__`:
  Python would print "Exception ignored in ..." and drop it) is caught by the block's
  `sys.unraisablehook`, printed nowhere, and re-delivered 50 ms later.
- A signal is never lost: one still deferred when the block ends, or one that arrives while the
  block restores the previous handlers, is raised as the block ends (unless the block is already
  ending with an exception).
- Only the process that installed the handlers raises: a forked child (a worker) gets Python's
  own behaviour (KeyboardInterrupt on SIGINT, death on SIGTERM).
- The handlers are installed with both signals blocked, so a signal that arrives meanwhile is
  raised inside the block (never between the two installs, never lost); the previous handlers and
  unraisable hook come back when the block ends; outside the main thread nothing is installed.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time

MAX_DEFER_S = 30.0  # code that holds a signal longer than this is interrupted all the same
RETRY_S = 0.05
SIGNALS = (signal.SIGINT, signal.SIGTERM)
STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + the signal, as shells report it
LINE = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}


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


def _in_import_bookkeeping(frame) -> bool:
    """The running frame is importlib's own (module locks, the lock's weakref callback `cb`); the
    module being imported runs in frames of its own, which stay interruptible."""
    return frame is not None and frame.f_code.co_filename == "<frozen importlib._bootstrap>"


def _as_python_would(signum: int, frame) -> None:
    """A forked child: KeyboardInterrupt on SIGINT, the default action on SIGTERM."""
    if signum == signal.SIGINT:
        signal.default_int_handler(signum, frame)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


class _Handler:
    def __init__(self):
        self.pid = os.getpid()
        self.deferred_since: dict[int, float] = {}  # signals received and not yet raised
        self.timers: list[threading.Timer] = []
        self.closing = False  # the block is ending: a signal is only recorded, raised at its end

    def _defer(self, signum: int) -> None:
        self.deferred_since.setdefault(signum, time.monotonic())
        if not self.closing:
            t = threading.Timer(RETRY_S, os.kill, (self.pid, signum))
            t.daemon = True
            t.start()
            self.timers = [x for x in self.timers if x.is_alive()] + [t]

    def __call__(self, signum, frame):
        if os.getpid() != self.pid:
            _as_python_would(signum, frame)
            return
        since = self.deferred_since.get(signum, time.monotonic())
        held = _in_import_bookkeeping(frame) or _in_extension_init(frame)
        if self.closing or (held and time.monotonic() - since < MAX_DEFER_S):
            self._defer(signum)
            return
        self.deferred_since.pop(signum, None)
        for t in self.timers:  # retries of this signal still waiting: it is raised now, once
            if t.args[1] == signum:
                t.cancel()
        raise KeyboardInterrupt if signum == signal.SIGINT else Terminated

    def unraisable_hook(self, previous):
        """sys.unraisablehook for the block: an interrupt Python could not propagate is re-delivered."""
        def hook(u):
            if os.getpid() == self.pid and issubclass(u.exc_type, KeyboardInterrupt):
                self._defer(signal.SIGINT)
            elif os.getpid() == self.pid and issubclass(u.exc_type, Terminated):
                self._defer(signal.SIGTERM)
            else:
                previous(u)
        return hook


@contextlib.contextmanager
def handling_signals():
    """SIGINT -> KeyboardInterrupt, SIGTERM -> Terminated, never inside an extension's initialiser
    or importlib's bookkeeping, never dropped."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = _Handler()
    saved = {}
    hook = sys.unraisablehook
    ended = False
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)  # installed as one step: a signal now waits
    try:
        for s in SIGNALS:
            saved[s] = signal.signal(s, handler)
        sys.unraisablehook = handler.unraisable_hook(hook)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # a signal that waited is raised here, in the block
        yield
        ended = True
    finally:
        handler.closing = True  # first: from here a signal is recorded, never raised mid-restore
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # (when the installs themselves were interrupted)
        for t in handler.timers:  # a retry already sending its signal is waited for: the handler records it
            t.cancel()
            t.join(1.0)
        sys.unraisablehook = hook
        for s, old in saved.items():
            signal.signal(s, old if old is not None else signal.SIG_DFL)
    if ended and handler.deferred_since:  # a signal the block held back: it ends the command all the same
        raise KeyboardInterrupt if signal.SIGINT in handler.deferred_since else Terminated


class _ProgramExit:
    """The handler of a program's SIGINT and SIGTERM outside `handling_signals`."""

    def __init__(self):
        self.pid = os.getpid()
        self.status: int | None = None  # the command's exit status, once it has one

    def __call__(self, signum, frame):
        if os.getpid() != self.pid:
            _as_python_would(signum, frame)
            return
        with contextlib.suppress(Exception):
            if self.status is None:
                print(LINE[signum], file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(self.status if self.status is not None else STATUS[signum])

    @staticmethod
    def ignore_signals() -> None:
        for s in SIGNALS:
            signal.signal(s, signal.SIG_IGN)


def exit_quietly() -> _ProgramExit:
    """For a program's entry point, called first (main thread): from here to the process's exit a
    SIGINT or SIGTERM outside `handling_signals` neither prints a traceback nor kills the process
    by the default action. Until the returned object's `.status` is set it ends the process at once
    with 130/143 and one line ("interrupted"/"terminated"); once set (the command is over: its
    output is written, the interpreter tears down), with that status and silently. The last exit
    handler (registered here, before any library registers its own) ignores both signals for the
    interpreter's final teardown, where Python itself would restore the default action."""
    ending = _ProgramExit()
    for s in SIGNALS:
        signal.signal(s, ending)
    atexit.register(_ProgramExit.ignore_signals)
    return ending
