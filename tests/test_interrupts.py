"""Ctrl-C and SIGTERM during `specfold generate` over 1,000 prompts: never a traceback.

SIGINT ends the run with one line ("interrupted") and exit status 130, SIGTERM with "terminated" and
143, wherever it lands: parsing, loading the model, encoding and validating the prompts, adding
requests, a decode step, the progress bar, printing the outputs.

Most interrupts hit forks of one process that has already imported torch and specfold (a fork
server, tests/forkserver.py: a fresh interpreter, never pytest's own process with the threads and
locks of every test before it), each fork running `specfold.cli.main` on the same argv as the
console script would (50 random points, so the test takes a minute, not the half hour of 50 fresh
interpreters). A fork's clock starts when
`main` has installed its signal handlers (the child says so), so every interrupt lands in the
product, none in the harness's own code before it. A few fresh `python -m specfold` processes check
the real exit path (interpreter shutdown included).
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY_OK = (ROOT / "specfold" / "tiny" / "model" / "config.json").is_file()
pytestmark = pytest.mark.skipif(not TINY_OK, reason="the embedded tiny model is not trained yet")

N_FORKED = 50  # the interrupts the issue asks for: 0 tracebacks among them
PARALLEL = 2


def _prompts(tmp_path: Path) -> Path:
    f = tmp_path / "prompts.txt"
    f.write_text("".join(f"Tom has {i % 9 + 1} apples and buys {i % 7 + 1} more. How many apples?\n"
                         for i in range(1000)))
    return f


def _argv(prompts: Path) -> list[str]:
    return ["generate", "--model", "tiny", "--prompt-file", str(prompts), "--max-new-tokens", "8",
            "--threads", "1"]


class ForkServer:
    """tests/forkserver.py in its own session: forks `main(argv)` on request (its pids are this
    test's to signal); `close` kills it and every fork left."""

    def __init__(self):
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "forkserver.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, start_new_session=True)
        self.buf, self.exits = b"", {}
        self._expect("up", 300)

    def _messages(self, timeout: float) -> list[dict]:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if ready:
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            assert chunk, f"the fork server died (status {self.proc.wait()})"
            self.buf += chunk
        out = []
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            msg = json.loads(line)
            if "exit" in msg:
                self.exits[msg["exit"]] = msg["status"]
            else:
                out.append(msg)
        return out

    def _expect(self, key: str, timeout: float):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for msg in self._messages(0.05):
                if key in msg:
                    return msg[key]
        pytest.fail(f"the fork server sent no {key!r} within {timeout} s")

    def _send(self, msg: dict) -> None:
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()

    def load(self, module: str) -> None:
        self._send({"import": module})
        self._expect("imported", 300)

    def fork(self, argv: list[str], out: Path) -> int:
        """Fork `main(argv)` (stdout/stderr to out.out / out.err); returns once its handlers are up."""
        self._send({"fork": argv, "out": str(out)})
        return self._expect("pid", 300)

    def status(self, pid: int) -> int | None:
        self._messages(0)
        return self.exits.pop(pid, None)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def _decoding(err: Path) -> bool:
    """The progress bar is up in stderr file `err`: the model is loaded, the prompts encoded and validated."""
    return err.is_file() and "generate:" in err.read_text(errors="replace")


def _interrupt_all(server: ForkServer, argv: list[str], plan: list[tuple[str, float]], tmp_path: Path,
                   tag: str) -> list:
    """Fork `main(argv)` per plan entry, PARALLEL at a time, and SIGINT each `delay` s after it is
    ready ("start") or after its progress bar is up ("decode"). -> [(exit status, stderr)]."""
    results = []
    pending = list(enumerate(plan))
    running: dict[int, list] = {}  # pid -> [delay (None: sent), clock start (None: not yet), err file, started]
    while pending or running:
        while pending and len(running) < PARALLEL:
            i, (phase, d) = pending.pop(0)
            files = tmp_path / f"{tag}{i}"
            now = time.monotonic()
            running[server.fork(argv, files)] = [d, now if phase == "start" else None, files.with_suffix(".err"), now]
        now = time.monotonic()
        for pid, r in running.items():
            if r[1] is None and _decoding(r[2]):
                r[1] = now
            if r[0] is not None and r[1] is not None and now - r[1] >= r[0]:
                os.kill(pid, signal.SIGINT)
                r[0] = None
        for pid, r in list(running.items()):
            status = server.status(pid)
            if status is not None:
                del running[pid]
                results.append((status, r[2].read_text(errors="replace")))
            elif now - r[3] > 300:
                pytest.fail(f"a run did not end within 300 s of its start: {r[2].read_text()[-2000:]}")
        time.sleep(0.01)
    return results


@pytest.mark.slow
def test_ctrl_c_at_50_random_points_of_a_long_run(tmp_path):
    argv = _argv(_prompts(tmp_path))
    rng = random.Random(22)
    server = ForkServer()
    try:
        # half anywhere in the first seconds: parsing, lazy imports (torch._dynamo and triton, which
        # the model's construction pulls in), loading, encoding and validating 1,000 prompts
        results = _interrupt_all(server, argv, [("start", rng.uniform(0.0, 5.0)) for _ in range(N_FORKED // 2)],
                                 tmp_path, "s")
        # half at a random point of the first 3 s of decoding (adding requests, steps, the progress
        # bar); those lazy imports are done in the server first, so that these runs reach decoding sooner
        server.load("torch._dynamo")
        results += _interrupt_all(server, argv, [("decode", rng.uniform(0.0, 3.0))
                                                 for _ in range(N_FORKED - N_FORKED // 2)], tmp_path, "d")
    finally:
        server.close()
    bad = [err for _, err in results if "Traceback" in err or "terminate called" in err]
    assert not bad, f"{len(bad)} of {len(results)} interrupts printed a traceback:\n{bad[0][-3000:]}"
    assert [rc for rc, _ in results] == [130] * N_FORKED, [(rc, err[-500:]) for rc, err in results if rc != 130]
    assert all(err.strip().splitlines()[-1].endswith("interrupted") for _, err in results)
    assert sum("generate:" in err for _, err in results) >= N_FORKED - N_FORKED // 2  # the decode-phase half


def _spawn(argv: list[str], err: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    # a shell's background job inherits SIGINT ignored, and so would the child: give it the default
    with open(err, "w") as fh:
        return subprocess.Popen([sys.executable, "-m", "specfold", *argv], stdout=subprocess.PIPE, stderr=fh,
                                text=True, env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


@pytest.mark.slow
@pytest.mark.parametrize("sig, status, line", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_a_fresh_interpreter_ends_quietly(tmp_path, sig, status, line):
    err = tmp_path / "stderr"
    p = _spawn(_argv(_prompts(tmp_path)), err)
    deadline = time.monotonic() + 300
    while not _decoding(err) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert p.poll() is None, "the run ended before it could be interrupted"
    time.sleep(random.Random(int(sig)).uniform(0.0, 1.0))
    p.send_signal(sig)
    stdout, _ = p.communicate(timeout=120)
    stderr = err.read_text(errors="replace")
    assert "Traceback" not in stderr, stderr[-3000:]
    assert p.returncode == status, stderr[-2000:]
    assert stderr.strip().splitlines()[-1].endswith(line)
    assert stdout == ""  # outputs are printed only when every prompt is done


# ------------------------------------------------------------------ the handlers themselves
def test_sigterm_unwinds_as_terminated_and_the_old_handlers_come_back():
    from specfold.interrupts import Terminated, handling_signals
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    cleaned = []
    with pytest.raises(Terminated):
        with handling_signals():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler raises here, at the next bytecode
            finally:
                cleaned.append(True)  # finally blocks run: temp dirs and records are closed
    assert cleaned == [True]
    with pytest.raises(KeyboardInterrupt):
        with handling_signals():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_forked_child_keeps_pythons_own_behaviour():
    """A worker forked inside the block dies of SIGTERM as Python processes do (no Terminated, so
    no 'Process ...: Traceback' from multiprocessing)."""
    from specfold.interrupts import handling_signals
    with handling_signals():
        pid = os.fork()
        if pid == 0:
            try:
                time.sleep(30)
            finally:
                os._exit(0)  # reached only if SIGTERM were turned into an exception
        time.sleep(0.2)
        os.kill(pid, signal.SIGTERM)
        _, raw = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(raw) and os.WTERMSIG(raw) == signal.SIGTERM


def test_no_handlers_outside_the_main_thread():
    import threading

    from specfold.interrupts import handling_signals
    seen = []

    def run():
        with handling_signals():
            seen.append(signal.getsignal(signal.SIGTERM))
    before = signal.getsignal(signal.SIGTERM)
    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen == [before]


def _fake_extension_init(body: str):
    """`create_module()` of a fake C extension: a Python function compiled under importlib's frame name
    (what the handler checks), running `body`, then returning 'done'."""
    from importlib.machinery import ExtensionFileLoader
    src = f"def create_module(self, spec):\n    {body}\n    return 'done'\n"
    ns: dict = {}
    exec(compile(src, "<frozen importlib._bootstrap_external>", "exec"), ns)
    loader = ExtensionFileLoader("fake_ext", "/nonexistent/fake_ext.so")
    return lambda: ns["create_module"](loader, None)


def test_a_signal_inside_an_extension_initialiser_waits_until_it_is_done():
    """Python code running under a C extension's create_module (as nanobind's enum setup does) is
    not interrupted; the KeyboardInterrupt comes right after. The initialiser here is a Python
    function compiled under importlib's frame name: the handler sees the frames it would see."""
    from specfold.interrupts import handling_signals
    create_module = _fake_extension_init("import os, signal, time\n    os.kill(os.getpid(), signal.SIGINT)\n"
                                         "    t = time.monotonic()\n    while time.monotonic() - t < 0.5:\n        pass")
    results = []
    with pytest.raises(KeyboardInterrupt):
        with handling_signals():
            results.append(create_module())
            time.sleep(5)  # the deferred SIGINT lands here
    assert results == ["done"]


def test_a_signal_held_back_when_the_block_ends_is_raised_there():
    """A SIGINT deferred by an extension's initialiser that returns just as the command ends is not
    dropped: the block ends with KeyboardInterrupt (the CLI's 130), not with the command's success."""
    from specfold.interrupts import handling_signals
    create_module = _fake_extension_init("import os, signal\n    os.kill(os.getpid(), signal.SIGINT)\n"
                                         "    for _ in range(1000):\n        pass")
    results = []
    with pytest.raises(KeyboardInterrupt):
        with handling_signals():
            results.append(create_module())  # the block ends right after, before any retry
    assert results == ["done"]
    time.sleep(0.2)  # a retry of the deferred signal, had one survived the block, would raise here


def _spin_src(name: str) -> str:
    return (f"def {name}(*args):\n    import os, signal, time\n    os.kill(os.getpid(), signal.SIGINT)\n"
            "    t = time.monotonic()\n    while time.monotonic() - t < 0.3:\n        pass\n    DONE.append(True)\n")


def test_a_signal_in_importlibs_module_lock_callback_waits_until_it_is_done(capfd):
    """importlib's `_get_module_lock.<locals>.cb` (a weakref callback, run when an import's lock is
    freed) is not interrupted: Python would print "Exception ignored in: <function
    _get_module_lock.<locals>.cb ...>" and leave the lock table half updated. The callback here is
    compiled under importlib's own file name, so the handler sees the frame it would see."""
    import weakref

    from specfold.interrupts import handling_signals
    ns: dict = {"DONE": []}
    exec(compile(_spin_src("cb"), "<frozen importlib._bootstrap>", "exec"), ns)

    class Lock:
        pass
    with pytest.raises(KeyboardInterrupt):
        with handling_signals():
            lock = Lock()
            ref = weakref.ref(lock, ns["cb"])
            del lock  # the callback runs here, and the signal lands inside it
            time.sleep(5)  # the deferred SIGINT is raised here
    assert ns["DONE"] == [True] and ref() is None
    assert "Exception ignored" not in capfd.readouterr().err


def test_an_interrupt_python_cannot_propagate_is_raised_after_all(capfd):
    """KeyboardInterrupt raised inside any other weakref callback (or __del__) would be printed as
    "Exception ignored in ..." and dropped: the block's unraisable hook re-delivers it instead."""
    import weakref

    from specfold.interrupts import handling_signals
    ns: dict = {"DONE": []}
    exec(compile(_spin_src("callback"), __file__, "exec"), ns)

    class Thing:
        pass
    with pytest.raises(KeyboardInterrupt):
        with handling_signals():
            thing = Thing()
            ref = weakref.ref(thing, ns["callback"])
            del thing
            time.sleep(5)  # re-delivered here
    assert ns["DONE"] == [] and ref() is None  # interrupted inside the callback, raised after it
    assert "Exception ignored" not in capfd.readouterr().err


STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143}
LINE = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}


@pytest.mark.slow
@pytest.mark.parametrize("sig, delays", [(signal.SIGINT, (0.0, 0.05, 0.15, 0.4)), (signal.SIGTERM, (0.05, 0.3))])
def test_a_signal_during_interpreter_teardown_changes_nothing(tmp_path, sig, delays):
    """After the command has printed its outputs, `python -m specfold` tears down torch for most of a
    second; Python restores the default handlers there (a traceback from an atexit callback, or
    death by the signal: status -2/-15). A signal in that time ends the process silently, with the
    command's own status (0 here; 130 only if it landed before the command returned)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for i, delay in enumerate(delays):
        err = tmp_path / f"stderr{i}"
        with open(err, "w") as fh:
            p = subprocess.Popen([sys.executable, "-m", "specfold", "generate", "--prompt", "Tom has 3 apples.",
                                  "--max-new-tokens", "4", "--threads", "1"], stdout=subprocess.PIPE, stderr=fh,
                                 env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        out = b""
        while out.count(b"\n") < 2:  # the text and the stats line: the command is done
            chunk = os.read(p.stdout.fileno(), 4096)
            assert chunk, f"the run ended early: {err.read_text()[-2000:]}"
            out += chunk
        time.sleep(delay)
        p.send_signal(sig)
        p.communicate(timeout=120)
        stderr = err.read_text(errors="replace")
        assert "Traceback" not in stderr and "Exception ignored" not in stderr, (delay, stderr[-3000:])
        assert p.returncode in (0, STATUS[sig]), (delay, p.returncode, stderr[-2000:])
        if p.returncode:
            assert stderr.strip().splitlines()[-1].endswith(LINE[sig])

