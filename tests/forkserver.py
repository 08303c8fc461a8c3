"""A fork server for tests/test_interrupts.py: a fresh interpreter that imports torch and specfold
once, then forks `specfold.cli.main(argv)` on request, so that each interrupted run starts in
milliseconds from a clean process (never from pytest's, which holds the threads, locks and thread
pools of every test before it).

Protocol, one JSON object per line. In (stdin): {"import": module} -> {"imported": module};
{"fork": argv, "out": path} -> {"pid": pid}, sent once the child's signal handlers are installed
(its stdout/stderr go to path.out / path.err). Out (stdout), whenever a child ends:
{"exit": pid, "status": exit status as os.waitstatus_to_exitcode gives it}.
Run as `python tests/forkserver.py` with the repository on PYTHONPATH.
"""
from __future__ import annotations

import importlib
import json
import os
import select
import signal
import sys
import threading
import time
import traceback


def _announce_handlers(ready_w: int) -> None:
    """In the child: a thread that writes to `ready_w` once the product's signal handlers are
    installed (`specfold.cli.main` installs them first thing), so that no interrupt lands in the
    harness's own code before them (that would be the harness's traceback, not the product's)."""
    from specfold.interrupts import _Handler

    def watch():
        while not isinstance(signal.getsignal(signal.SIGINT), _Handler):
            time.sleep(0.001)
        os.write(ready_w, b"1")
        os.close(ready_w)
    threading.Thread(target=watch, daemon=True).start()


def _child(argv: list[str], out: str, ready_w: int) -> None:
    """Run `main(argv)` as the console script would (an escaping exception prints its traceback
    and exits 1); never returns."""
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, suffix in ((1, ".out"), (2, ".err")):
            os.dup2(os.open(out + suffix, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False)
        from specfold.cli import main
        _announce_handlers(ready_w)
        rc = main(argv)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    except BaseException:
        try:
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(1)


def _fork(argv: list[str], out: str) -> int:
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        _child(argv, out, ready_w)
    os.close(ready_w)
    os.read(ready_r, 1)  # empty if the child died before its handlers were up: its exit says why
    os.close(ready_r)
    return pid


def _say(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def _reap() -> None:
    while True:
        try:
            pid, raw = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _say({"exit": pid, "status": os.waitstatus_to_exitcode(raw)})


def serve() -> None:
    import torch  # noqa: F401 (imported once here; the forks share it)

    import specfold.api  # noqa: F401
    import specfold.cli  # noqa: F401
    _say({"up": True})
    buf = b""
    while True:
        ready, _, _ = select.select([0], [], [], 0.01)
        if ready:
            chunk = os.read(0, 65536)
            if not chunk:
                return  # the test closed its end
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                if "import" in req:
                    importlib.import_module(req["import"])
                    _say({"imported": req["import"]})
                else:
                    _say({"pid": _fork(req["fork"], req["out"])})
        _reap()


if __name__ == "__main__":
    serve()
