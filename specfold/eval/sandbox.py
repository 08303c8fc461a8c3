"""Run untrusted (model-written) Python in a process the operating system contains.

`run_program(source, limits)` runs one program through `sandbox_child.py` and says whether it
returned, with the values it reported (see verdict.py: the harness, not the program, compares
them with the expected ones). Containment (backend `bwrap`, the default; probed once, see `backend()`):
- bubblewrap on an empty root that holds only what the interpreter needs (sandbox_fs.py): the
  base interpreter, its standard library without site-packages, the shared libraries those load,
  `/dev/null`, `/dev/urandom`, a private size-capped tmpfs `/tmp` (the program's cwd is
  `/tmp/work`; the program and the child script are read-only files in `/tmp/.specfold`) and an
  empty `/proc`; no `/etc`, no home, no checkout, no venv; `_ctypes` and CPython's test
  extensions hidden; new network (no interfaces), PID, IPC and UTS namespaces; its own session;
  killed when this process dies (`--die-with-parent`);
- an unprivileged uid (65534) outside as well as inside: run as root, bubblewrap keeps only
  CAP_SETUID/CAP_SETGID and the child drops to 65534 for good before it reads the program; run
  as another user, a new user namespace maps 65534 inside to that user outside;
- a seccomp filter (`seccomp.py`): no new processes (fork/vfork/clone without CLONE_THREAD),
  no ptrace, unshare, setns, mount, bpf, ...;
- resource limits set in the child: address space, CPU seconds, file size (this also caps
  stdout/stderr, which go to unnamed files), open files, no core dumps, threads;
- a wall-clock timeout after which bwrap is SIGKILLed: its PID namespace, and every process in
  it, goes with it;
- the child's Python guard (second layer, see sandbox_child).
Without a working bwrap the sandbox refuses (`SandboxUnavailable`, one line) unless
`SPECFOLD_SANDBOX=weak` opts into the weaker fallback, announced by one warning line that says
scores can be forged: unshare network/PID namespaces when they work; as root, uid 65534 when the
interpreter is readable by it; in the child (via ctypes, before the program) Landlock rules that
allow reading only the interpreter's files and the run's directory and writing only its work
folder, and the same seccomp filter; the host filesystem stays mounted.

Channel: the parent passes a fresh random token on a pipe that the child reads and closes before
compiling the program; on a second pipe the child sends `R <slot> <json>` lines for the values
the program reports and, only after the program's code returned, `PASS <token>` (see
sandbox_child for why the program cannot reach the token or that code path). A run passes only
if that exact last line arrives after well-formed reports: never on the exit status alone.

Invariants: model output is never executed in the calling process; under bwrap nothing of the
run exists on the host filesystem (program and child are memfds, stdout/stderr unnamed files),
so no kill of the harness can leave a directory behind; the weak mode's run directory is removed
afterwards, and on SIGTERM of the harness (handler installed when the default one is in place);
no process of the run survives `run_program`; the child script comes from this process's memory
(read at import), never from a file a program could have rewritten.
"""
from __future__ import annotations

import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from contextlib import ExitStack
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from specfold.eval import sandbox_weak
from specfold.eval.sandbox_fs import bwrap_mounts, runtime
from specfold.eval.sandbox_proc import (CHILD, CHILD_SOURCE, GROUP, LIVE, SANDBOX_UID, Group, SandboxUnavailable,
                                        as_user, install_sigterm_cleanup, memfd, runs_in_flight, setting_up,
                                        tasks_of_uid)
from specfold.eval.sandbox_weak import Weak
from specfold.eval.seccomp import build_filter

__all__ = ["CHILD", "Limits", "RunResult", "SandboxUnavailable", "backend", "isolation", "run_many", "run_program"]
TAIL = 4000  # characters of stdout/stderr kept in a result
INSIDE_TOP = "/tmp/.specfold"  # read-only folder of the program and the child script (bwrap)
CHANNEL_CAP = 32 << 20  # bytes of reports kept; more is a failure


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-program limits. cpu_s defaults to the wall timeout rounded up, plus one."""

    timeout_s: float = 10.0
    memory_mb: int = 2048
    cpu_s: int | None = None
    file_mb: int = 16  # per file, stdout/stderr included
    tmp_mb: int = 64  # size of the private /tmp (bwrap)
    nofile: int = 256
    max_procs: int = 16  # RLIMIT_NPROC headroom (threads; processes are refused by seccomp)
    guard: bool = True  # the Python guard (tests switch it off to check the OS layer alone)

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.memory_mb <= 0 or self.file_mb <= 0 or self.tmp_mb <= 0:
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
    reports: tuple = ()  # (slot, encoded value) in the order the program reported them


    @property
    def passed(self) -> bool:
        return self.status == "passed"


def _bwrap_args(tmp_mb: int, run_id: str) -> list[str]:
    """bubblewrap's arguments up to the command (see module docstring)."""
    if os.geteuid() == 0:
        user = ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        user = ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--disable-userns"]
    size = str(tmp_mb << 20)
    return ["bwrap", *user, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv",
            "--perms", "01777", "--size", size, "--tmpfs", "/tmp",  # first: an interpreter under /tmp stays visible
            *bwrap_mounts(runtime()),
            "--perms", "0755", "--dir", "/dev", "--dev-bind", "/dev/null", "/dev/null",
            "--dev-bind", "/dev/urandom", "/dev/urandom", "--perms", "01777", "--size", size, "--tmpfs", "/dev/shm",
            "--tmpfs", "/proc", "--perms", "01777", "--dir", "/tmp/work", "--perms", "0755", "--dir", INSIDE_TOP, "--chdir", "/tmp/work",
            "--setenv", "HOME", "/tmp/work", "--setenv", "TMPDIR", "/tmp/work", "--setenv", "PATH", "/usr/bin:/bin",
            "--setenv", "LANG", "C.UTF-8", "--setenv", "SPECFOLD_RUN", run_id]


def _probe_bwrap() -> str | None:
    """None when bwrap with every option we use (seccomp included) works here, else why not."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    flt = build_filter()
    if flt is None:
        return f"no seccomp filter for this architecture ({os.uname().machine})"
    fd = memfd("seccomp", flt)
    try:
        cmd = [*_bwrap_args(1, "probe"), "--seccomp", str(fd), runtime().executable, "-I", "-S", "-c",
               "import os, json, socket"]
        p = subprocess.run(cmd, capture_output=True, timeout=30, pass_fds=(fd,), stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            msg = p.stderr.decode("utf-8", "replace").strip().splitlines()
            return f"bwrap cannot create its sandbox here ({msg[-1] if msg else p.returncode})"
        return None
    except (OSError, subprocess.SubprocessError) as e:
        return f"bwrap failed to start ({e})"
    finally:
        os.close(fd)


@lru_cache(maxsize=1)
def backend() -> tuple[str, Weak | None]:
    """("bwrap", None) or, with SPECFOLD_SANDBOX=weak and no usable bwrap, ("weak:...", Weak).

    Raises SandboxUnavailable when bwrap does not work and the weak mode was not asked for.
    """
    mode = os.environ.get("SPECFOLD_SANDBOX", "bwrap")
    if mode not in ("bwrap", "weak"):
        raise SandboxUnavailable(f"SPECFOLD_SANDBOX={mode!r}: accepted values are 'bwrap' (default) and 'weak'")
    why = _probe_bwrap()
    if why is None:
        return "bwrap", None
    if mode != "weak":
        raise SandboxUnavailable(
            f"code execution needs the OS sandbox, but {why}: install bubblewrap "
            "(apt-get install bubblewrap) or set SPECFOLD_SANDBOX=weak to accept weaker containment")
    weak = sandbox_weak.probe()
    print(f"specfold: warning: {why}; SPECFOLD_SANDBOX=weak runs code with {weak.describe()}: scores can be "
          "forged (no mount namespace, and a program can reach its own process memory), so install bubblewrap "
          "for evaluations that count", file=sys.stderr)
    return f"weak:{weak.namespaces}", weak


def isolation() -> str:
    """Name of the containment `run_program` uses here (raises SandboxUnavailable, see backend)."""
    return backend()[0]


def _tail(f) -> str:
    try:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - TAIL))
        return f.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return ""


class _Channel(threading.Thread):
    """Reads the result pipe while the child runs (reports can exceed a pipe's buffer); owns `fd`."""

    def __init__(self, fd: int) -> None:
        super().__init__(daemon=True)
        self.fd, self.data, self.overflow = fd, bytearray(), False

    def run(self) -> None:
        try:
            while True:
                b = os.read(self.fd, 1 << 16)
                if not b:
                    break
                if len(self.data) + len(b) > CHANNEL_CAP:
                    self.overflow = True
                    break
                self.data += b
        except OSError:
            pass
        finally:
            os.close(self.fd)

    def parse(self, token: bytes) -> tuple[bool, tuple | None]:
        """(the pass line arrived, the reports as (slot, text), or None when the channel is malformed)."""
        lines = bytes(self.data).split(b"\n")
        if self.overflow or lines.pop() != b"":
            return False, None
        passed = bool(lines) and lines[-1] == b"PASS " + token
        reports = []
        for line in lines[:-1] if passed else lines:
            head, _, rest = line.partition(b" ")
            slot, _, text = rest.partition(b" ")
            if head != b"R" or not slot.isdigit() or not text:
                return passed, None
            reports.append((int(slot), text.decode("utf-8", "replace")))
        return passed, tuple(reports)


def _kill_namespace(info: bytes, run_id: str, wait_s: float = 5.0) -> None:
    """SIGKILL the sandbox's PID-namespace init (bwrap's `child-pid`) and wait until it is dead.

    Killing the init kills every process of the namespace; the kernel does this asynchronously,
    and the init itself dies last, so once it is a zombie or gone nothing of the run is left.
    The pid is pinned with a pidfd and checked to be this run's bwrap (its command line names
    the run's id) before it is signalled, so a reused pid is never touched."""
    import json

    try:
        pid = int(json.loads(info.decode() or "{}").get("child-pid", 0))
    except (ValueError, AttributeError):
        pid = 0
    if pid <= 1:
        return
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if run_id.encode() not in f.read():
                return
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
            if state in (b"Z", b"X"):
                return
            time.sleep(0.002)
    except (OSError, IndexError):
        return
    finally:
        os.close(pidfd)


def _read_info(fd: int) -> bytes:
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 4096)
    except OSError:
        return b""


def _nproc(uid: int, limits: Limits) -> int:
    """RLIMIT_NPROC for a run as `uid` (0: none, root ignores it): the uid's tasks now, the run's
    headroom, and room for the runs of this process being started or running at the same time."""
    return 0 if uid == 0 else tasks_of_uid(uid) + limits.max_procs + 4 * runs_in_flight()


def _config(limits: Limits, fds: dict, extra: dict) -> list[str]:
    cfg = {
        "memory_mb": limits.memory_mb,
        "cpu_s": limits.cpu_s if limits.cpu_s is not None else math.ceil(limits.timeout_s) + 1,
        "file_mb": limits.file_mb,
        "nofile": limits.nofile,
        "token_fd": fds["token_fd"],
        "result_fd": fds["result_fd"],
        "guard": int(limits.guard),
        **extra,
    }
    return [f"{k}={v}" for k, v in cfg.items()]


def _bwrap_command(run_id: str, source: bytes, limits: Limits, fds: dict, keep: list[int]) -> list[str]:
    prog, child = memfd("program", source), memfd("child", CHILD_SOURCE)
    flt = memfd("seccomp", build_filter())
    keep += [prog, child, flt]
    root = os.geteuid() == 0
    extra = {"drop_uid": SANDBOX_UID if root else -1, "nproc": _nproc(SANDBOX_UID if root else os.getuid(), limits)}
    return [*_bwrap_args(limits.tmp_mb, run_id), "--perms", "0444", "--ro-bind-data", str(prog), f"{INSIDE_TOP}/program.py",
            "--perms", "0444", "--ro-bind-data", str(child), f"{INSIDE_TOP}/child.py", "--seccomp", str(flt),
            "--info-fd", str(fds["info_fd"]), runtime().executable, "-I", "-S", "-B", f"{INSIDE_TOP}/child.py",
            f"{INSIDE_TOP}/program.py", *_config(limits, fds, extra)]


def run_program(source: str, limits: Limits = Limits()) -> RunResult:
    """Run `source` as a Python program in the sandbox (see module docstring)."""
    name, weak = backend()
    install_sigterm_cleanup()
    run_id = f"specfold-run-{secrets.token_hex(8)}"
    setup = ExitStack()
    setup.enter_context(setting_up())
    top, keep, info_r, res_r, channel, out, err = None, [], None, None, None, None, None
    try:
        if weak is not None:
            top = Path(tempfile.mkdtemp(prefix=f"specfold-sandbox-{os.getpid()}-"))
        token = secrets.token_hex(16).encode()
        tok_r, tok_w = os.pipe()
        res_r, res_w = os.pipe()
        os.write(tok_w, token + b"\n")
        os.close(tok_w)
        info_r, info_w = os.pipe() if weak is None else (None, None)
        fds = {"token_fd": tok_r, "result_fd": res_w, "info_fd": info_w}
        keep += [tok_r, res_w] + ([info_w] if info_w is not None else [])
        channel = _Channel(res_r)
        rc, timed_out, t0 = None, False, time.perf_counter()
        out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        if weak is None:
            cmd, cwd, env, user = _bwrap_command(run_id, source.encode("utf-8"), limits, fds, keep), "/", {}, None
        else:
            (top / "work").mkdir()
            head, extra = sandbox_weak.command(weak, top, source.encode("utf-8"), _nproc(
                weak.user if weak.user is not None else os.getuid(), limits), keep)
            cmd = [*head, *_config(limits, fds, extra)]
            cwd, user = str(top / "work"), weak.user
            env = {"PATH": "/usr/bin:/bin", "HOME": cwd, "TMPDIR": cwd, "LANG": "C.UTF-8", "SPECFOLD_RUN": run_id}
        channel.start()
        try:
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    start_new_session=True, pass_fds=tuple(keep), **as_user(user))
            LIVE[run_id] = proc.pid
            if getattr(GROUP, "group", None) is not None:
                GROUP.group.add(proc.pid)
        finally:
            for fd in keep:
                os.close(fd)
            keep.clear()
            setup.close()
        try:
            rc = proc.wait(timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
            if info_r is not None:
                _kill_namespace(_read_info(info_r), run_id)
        seconds = time.perf_counter() - t0
        channel.join(timeout=5.0)
        passed, reports = channel.parse(token)
        ok = passed and reports is not None
        status = "passed" if ok else ("timeout" if timed_out else "failed")
        return RunResult(status, rc, _tail(out), _tail(err), seconds, name, reports or ())
    finally:
        setup.close()
        LIVE.pop(run_id, None)
        for fd in keep:
            os.close(fd)
        if res_r is not None and (channel is None or channel.ident is None):
            os.close(res_r)  # the channel thread, once started, closes it
        if info_r is not None:
            os.close(info_r)
        for f in (out, err):
            if f is not None:
                f.close()
        if top is not None:
            shutil.rmtree(top, ignore_errors=True)


def _run_in_group(group: Group, source: str, limits: Limits) -> RunResult:
    GROUP.group = group
    try:
        return run_program(source, limits)
    finally:
        GROUP.group = None


def _results(futures: list[Future], poll_s: float = 0.1) -> list:
    """The futures' results in order; the first exception raises as soon as it is known. The wait
    is bounded: a signal the kernel delivers to a worker thread does not wake the main thread from
    an unbounded lock wait, so its handler (SIGTERM's cleanup, KeyboardInterrupt) would wait until
    every program ended; here it runs within `poll_s`."""
    pending = set(futures)
    while pending:
        done, pending = wait(pending, timeout=poll_s, return_when=FIRST_EXCEPTION)
        for f in done:
            f.result()
    return [f.result() for f in futures]


def run_many(sources: list[str], limits: Limits = Limits(), workers: int = 1) -> list[RunResult]:
    """`run_program` over many programs, `workers` at a time (results in input order). An
    exception in the caller's thread while it waits (KeyboardInterrupt, the CLI's SIGTERM)
    cancels the programs not yet started and kills the running ones before it propagates."""
    install_sigterm_cleanup()
    if workers <= 1:
        return [run_program(s, limits) for s in sources]
    group = Group()
    pool = ThreadPoolExecutor(max_workers=workers)
    try:
        futures = [pool.submit(_run_in_group, group, s, limits) for s in sources]
        return _results(futures)
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        group.stop()
        raise
    finally:
        pool.shutdown(wait=True)
