"""Run untrusted (model-written) Python in a process the operating system contains.

`run_program(source, limits)` runs one program through `sandbox_child.py` and says whether its
tests returned. Containment (backend `bwrap`, the default; probed once, see `backend()`):
- bubblewrap: new user namespace with an unprivileged uid/gid (65534) inside, new mount
  namespace in which the whole filesystem is a read-only bind of `/` except a private,
  size-capped tmpfs `/tmp` (the program's cwd is `/tmp/work`; the interpreter's own folders are
  bound back read-only when they lie under /tmp) and a minimal `/dev`; `/proc` and
  `/sys` are empty; `_ctypes` and CPython's test extensions are hidden; new network (no interfaces), PID, IPC and UTS namespaces; no further user
  namespaces; its own session; killed when this process dies (`--die-with-parent`);
- a seccomp filter (`seccomp.py`): no new processes (fork/vfork/clone without CLONE_THREAD),
  no ptrace, unshare, setns, mount, bpf, ...;
- resource limits set in the child: address space, CPU seconds, file size (this also caps
  stdout/stderr, which go to files), open files, no core dumps, processes (kernel-enforced
  unless the outer uid is root; the seccomp filter is what stops forks there);
- a wall-clock timeout after which bwrap is SIGKILLed: its PID namespace, and every process in
  it, goes with it;
- the child's Python guard (second layer, see sandbox_child).
Without a working bwrap the sandbox refuses (`SandboxUnavailable`, one line) unless
`SPECFOLD_SANDBOX=weak` opts into the weaker fallback (unshare network/PID namespaces when they
work, else only a process group; host filesystem writable outside the Python guard; no
seccomp), announced by one warning line.

Pass signal: the parent passes a fresh random token on a pipe that the child reads and closes
before compiling the program; the child writes `PASS <token>` to a second pipe only after the
program's code returned (see sandbox_child for why the program cannot reach the token or that
code path). A run passes only if that exact line arrives: never on the exit status alone.

Invariants: model output is never executed in the calling process; nothing the program writes
reaches the host filesystem under bwrap (its temporary directory of program + outputs is
removed afterwards); no process of the run survives `run_program`.
"""
from __future__ import annotations

import json
import math
import os
import secrets
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

from specfold.errors import SpecfoldError
from specfold.eval.seccomp import build_filter

CHILD = Path(__file__).with_name("sandbox_child.py")
TAIL = 4000  # characters of stdout/stderr kept in a result
SANDBOX_UID = 65534
INSIDE_TOP = "/tmp/.specfold"  # read-only view of the run's directory (the program)


class SandboxUnavailable(SpecfoldError):
    """The OS sandbox cannot run here and the weak fallback was not requested."""


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

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@lru_cache(maxsize=1)
def _masked_modules() -> tuple[str, ...]:
    """Extension modules hidden (bound to /dev/null) in the sandbox: raw memory access (ctypes),
    CPython's test helpers and subinterpreters (whose sys._current_frames sees every thread),
    which could reach the pass token."""
    import importlib.util

    out = []
    for name in ("_ctypes", "_testcapi", "_testinternalcapi", "_ctypes_test", "_xxsubinterpreters",
                 "_xxinterpchannels", "_interpreters", "_interpchannels", "_interpqueues"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.origin and os.path.isfile(spec.origin):
            out.append(spec.origin)
    return tuple(out)


def _runtime_under_tmp() -> tuple[str, ...]:
    """The folders the child needs to start (the interpreter's prefixes, `sandbox_child.py`'s folder)
    that lie under /tmp, outermost only: the private tmpfs would hide them (e.g. a checkout and its
    venv cloned into /tmp), so they are bound back read-only on top of it."""
    need = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                          os.path.dirname(sys.executable), str(CHILD.parent))}
    under = sorted(p for p in need if p.startswith("/tmp/"))
    return tuple(p for p in under if not any(p != q and p.startswith(q + "/") for q in under))


def _bwrap_args(top: Path, tmp_mb: int) -> list[str]:
    masks = [a for path in _masked_modules() for a in ("--ro-bind", "/dev/null", path)]
    runtime = [a for path in _runtime_under_tmp() for a in ("--ro-bind", path, path)]
    return ["bwrap", "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
            "--disable-userns", "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session",
            "--ro-bind", "/", "/", "--dev", "/dev", "--tmpfs", "/proc", "--tmpfs", "/sys",
            "--size", str(tmp_mb << 20), "--tmpfs", "/tmp", "--dir", "/tmp/work",
            "--ro-bind", str(top), INSIDE_TOP, "--chdir", "/tmp/work",
            *runtime, "--setenv", "HOME", "/tmp/work", "--setenv", "TMPDIR", "/tmp/work", *masks]


def _probe_bwrap() -> str | None:
    """None when bwrap with every option we use (seccomp included) works here, else why not."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    flt = build_filter()
    if flt is None:
        return f"no seccomp filter for this architecture ({os.uname().machine})"
    top = Path(tempfile.mkdtemp(prefix="specfold-probe-"))
    try:
        r, w = os.pipe()
        os.write(w, flt)
        os.close(w)
        cmd = [*_bwrap_args(top, 1), "--seccomp", str(r), sys.executable, "-I", "-S", "-c", "pass"]
        try:
            p = subprocess.run(cmd, capture_output=True, timeout=20, pass_fds=(r,))
        finally:
            os.close(r)
        if p.returncode != 0:
            msg = p.stderr.decode("utf-8", "replace").strip().splitlines()
            return f"bwrap cannot create its namespaces here ({msg[-1] if msg else p.returncode})"
        return None
    except (OSError, subprocess.SubprocessError) as e:
        return f"bwrap failed to start ({e})"
    finally:
        shutil.rmtree(top, ignore_errors=True)


_WEAK_CANDIDATES = (
    ("weak:userns+netns+pidns", ["unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child"]),
    ("weak:netns+pidns", ["unshare", "--net", "--pid", "--fork", "--kill-child"]),
)


def _weak_prefix() -> tuple[str, tuple[str, ...]]:
    if shutil.which("unshare") is not None:
        for name, prefix in _WEAK_CANDIDATES:
            try:
                r = subprocess.run([*prefix, sys.executable, "-I", "-c", "pass"], capture_output=True, timeout=10)
            except (OSError, subprocess.SubprocessError):
                continue
            if r.returncode == 0:
                return name, tuple(prefix)
    return "weak:none", ()


@lru_cache(maxsize=1)
def backend() -> tuple[str, tuple[str, ...]]:
    """("bwrap", ()) or, with SPECFOLD_SANDBOX=weak and no usable bwrap, (weak name, prefix).

    Raises SandboxUnavailable when bwrap does not work and the weak mode was not asked for.
    """
    mode = os.environ.get("SPECFOLD_SANDBOX", "bwrap")
    if mode not in ("bwrap", "weak"):
        raise SandboxUnavailable(f"SPECFOLD_SANDBOX={mode!r}: accepted values are 'bwrap' (default) and 'weak'")
    why = _probe_bwrap()
    if why is None:
        return "bwrap", ()
    if mode != "weak":
        raise SandboxUnavailable(
            f"code execution needs the OS sandbox, but {why}: install bubblewrap "
            "(apt-get install bubblewrap) or set SPECFOLD_SANDBOX=weak to accept weaker containment")
    name, prefix = _weak_prefix()
    print(f"specfold: warning: {why}; SPECFOLD_SANDBOX=weak runs code with {name.split(':')[1]} only: "
          "the filesystem is writable outside the Python guard, no seccomp, no unprivileged uid",
          file=sys.stderr)
    return name, prefix


def isolation() -> str:
    """Name of the containment `run_program` uses here (raises SandboxUnavailable, see backend)."""
    return backend()[0]


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


def _read_all(fd: int, cap: int = 4096) -> bytes:
    """What the child wrote on the result pipe (non-blocking; at most `cap` bytes)."""
    os.set_blocking(fd, False)
    chunks, total = [], 0
    while total < cap:
        try:
            b = os.read(fd, cap - total)
        except BlockingIOError:
            break
        if not b:
            break
        chunks.append(b)
        total += len(b)
    return b"".join(chunks)


@lru_cache(maxsize=1)
def _site_dirs() -> list[str]:
    """This interpreter's site-packages folders: the child (started with -S, which skips the
    slow .pth processing) appends them to sys.path, so installed packages stay importable."""
    import site

    return [p for p in site.getsitepackages() if os.path.isdir(p)]


def _kill_namespace(info_fd: int, top: Path, wait_s: float = 5.0) -> None:
    """SIGKILL the sandbox's PID-namespace init (bwrap's `child-pid`) and wait until it is dead.

    Killing the init kills every process of the namespace; the kernel does this asynchronously,
    and the init itself dies last, so once it is a zombie or gone nothing of the run is left.
    The pid is pinned with a pidfd and checked to be this run's bwrap (its command line names
    the run's directory) before it is signalled, so a reused pid is never touched."""
    try:
        pid = int(json.loads(_read_all(info_fd).decode() or "{}").get("child-pid", 0))
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
            if str(top).encode() not in f.read():
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


def _command(name: str, prefix: tuple[str, ...], top: Path, limits: Limits, fds: dict) -> tuple[list[str], str]:
    """(argv, the program's path as the child sees it)."""
    if name == "bwrap":
        inner = INSIDE_TOP
        head = [*_bwrap_args(top, limits.tmp_mb), "--seccomp", str(fds["seccomp_fd"]),
                "--info-fd", str(fds["info_fd"])]
    else:
        inner, head = str(top), list(prefix)
    cfg = {
        "memory_mb": limits.memory_mb,
        "cpu_s": limits.cpu_s if limits.cpu_s is not None else math.ceil(limits.timeout_s) + 1,
        "file_mb": limits.file_mb,
        "nofile": limits.nofile,
        "nproc": 0 if os.getuid() == 0 else _tasks_of_current_user() + limits.max_procs,
        "token_fd": fds["token_fd"],
        "result_fd": fds["result_fd"],
        "guard": int(limits.guard),
        "site": os.pathsep.join(_site_dirs()),
    }
    return [*head, sys.executable, "-I", "-S", "-B", str(CHILD), f"{inner}/program.py", *(f"{k}={v}" for k, v in cfg.items())], inner


def run_program(source: str, limits: Limits = Limits()) -> RunResult:
    """Run `source` as a Python program in the sandbox (see module docstring)."""
    name, prefix = backend()
    top = Path(tempfile.mkdtemp(prefix="specfold-sandbox-"))
    (top / "program.py").write_text(source, encoding="utf-8")
    work = top / "work"
    work.mkdir()
    token = secrets.token_hex(16).encode()
    tok_r, tok_w = os.pipe()
    res_r, res_w = os.pipe()
    os.write(tok_w, token + b"\n")
    os.close(tok_w)
    fds = {"token_fd": tok_r, "result_fd": res_w}
    passed = [tok_r, res_w]
    info_r = None
    if name == "bwrap":
        sc_r, sc_w = os.pipe()
        os.write(sc_w, build_filter())
        os.close(sc_w)
        info_r, info_w = os.pipe()
        fds["seccomp_fd"], fds["info_fd"] = sc_r, info_w
        passed += [sc_r, info_w]
    cmd, _ = _command(name, prefix, top, limits, fds)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(work), "TMPDIR": str(work), "LANG": "C.UTF-8",
           "PYTHONIOENCODING": "utf-8", "PYTHONHASHSEED": "0"}
    t0 = time.perf_counter()
    rc, timed_out = None, False
    try:
        with open(top / "stdout", "wb") as out, open(top / "stderr", "wb") as err:
            try:
                proc = subprocess.Popen(cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=err, start_new_session=True, pass_fds=tuple(passed))
            finally:
                for fd in passed:
                    os.close(fd)
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
                    _kill_namespace(info_r, top)
        seconds = time.perf_counter() - t0
        got = _read_all(res_r)
        status = "passed" if got == b"PASS " + token + b"\n" else ("timeout" if timed_out else "failed")
        return RunResult(status, rc, _tail(top / "stdout"), _tail(top / "stderr"), seconds, name)
    finally:
        os.close(res_r)
        if info_r is not None:
            os.close(info_r)
        shutil.rmtree(top, ignore_errors=True)


def run_many(sources: list[str], limits: Limits = Limits(), workers: int = 1) -> list[RunResult]:
    """`run_program` over many programs, `workers` at a time (results in input order)."""
    if workers <= 1:
        return [run_program(s, limits) for s in sources]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda s: run_program(s, limits), sources))
