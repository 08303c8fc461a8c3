"""The weak mode of the code sandbox (`SPECFOLD_SANDBOX=weak`, only when bubblewrap does not work).

`probe()` finds out once what this machine allows: `unshare` namespaces (network, PID, and a user
namespace when possible), a uid (as root: SANDBOX_UID if that uid can start the interpreter), and
which layers the child can set up on itself before it reads the program (`sandbox_child.confine`:
Landlock, seccomp). `command()` builds one run: program and child script written into the run's
directory, the child's Landlock rules (read: the interpreter's files and that directory; write:
its `work` folder). The host filesystem stays mounted (no mount namespace) and a program can
reach its own process memory, so scores can be forged: the warning says so.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from specfold.eval.sandbox_fs import runtime
from specfold.eval.sandbox_proc import CHILD_SOURCE, SANDBOX_UID, as_user, memfd
from specfold.eval.seccomp import build_filter

_WEAK_CANDIDATES = (
    ("userns+netns+pidns", ["unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child"]),
    ("netns+pidns", ["unshare", "--net", "--pid", "--fork", "--kill-child"]),
)


@dataclass(frozen=True)
class Weak:
    """How the weak mode runs here: namespaces (unshare prefix), uid, child-side layers."""

    namespaces: str
    prefix: tuple[str, ...]
    user: int | None            # run the child as this uid (root only, when it can read the interpreter)
    landlock: int               # Landlock ABI the child confines itself with (0: none)
    seccomp: bool

    def describe(self) -> str:
        parts = [f"namespaces {self.namespaces}" if self.prefix else "no namespaces",
                 f"uid {self.user}" if self.user is not None else f"uid {os.geteuid()}",
                 f"Landlock ABI {self.landlock} (reads only the interpreter and the program, writes only its work folder)"
                 if self.landlock else "no Landlock (the host filesystem is readable, and writable outside the Python guard)",
                 "seccomp (no new processes)" if self.seccomp else "no seccomp (processes capped only by RLIMIT_NPROC)"]
        return ", ".join(parts)


def weak_user() -> int | None:
    """As root: SANDBOX_UID if it can start the interpreter and import the standard library."""
    if os.geteuid() != 0:
        return None
    try:
        r = subprocess.run([runtime().executable, "-I", "-S", "-c", "import json, socket, asyncio, decimal"],
                           capture_output=True, timeout=30, cwd="/", **as_user(SANDBOX_UID))
    except (OSError, subprocess.SubprocessError):
        return None
    return SANDBOX_UID if r.returncode == 0 else None


def probe() -> Weak:
    user = weak_user()
    name, prefix = "none", ()
    if shutil.which("unshare") is not None:
        for cand, pre in _WEAK_CANDIDATES:
            try:
                r = subprocess.run([*pre, runtime().executable, "-I", "-c", "pass"], capture_output=True,
                                   timeout=10, cwd="/", **as_user(user))
            except (OSError, subprocess.SubprocessError):
                continue
            if r.returncode == 0:
                name, prefix = cand, tuple(pre)
                break
    landlock, seccomp = 0, False
    flt = build_filter()
    fd = memfd("seccomp", flt) if flt else -1
    try:
        cfg = [f"seccomp_fd={fd}", "read_paths=", "write_paths="]
        r = subprocess.run([*prefix, runtime().executable, "-I", "-S", "-B", "-c", CHILD_SOURCE, "--probe", *cfg],
                           capture_output=True, text=True, timeout=30, cwd="/", pass_fds=(fd,) if fd >= 0 else (),
                           **as_user(user))
        words = dict(w.split("=", 1) for w in r.stdout.split() if "=" in w)
        landlock, seccomp = int(words.get("landlock", 0)), words.get("seccomp") == "1"
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    finally:
        if fd >= 0:
            os.close(fd)
    return Weak(name, prefix, user, landlock, seccomp)


def command(weak: Weak, top: Path, source: bytes, nproc: int, keep: list[int]) -> tuple[list[str], dict]:
    """(argv up to the child's configuration, the weak-mode part of that configuration) for one
    run in `top` (which holds an empty `work` folder). Descriptors to pass are appended to `keep`."""
    (top / "program.py").write_bytes(source)
    (top / "child.py").write_bytes(CHILD_SOURCE)
    work = top / "work"
    if weak.user is not None:
        os.chmod(top, 0o755)
        os.chown(work, weak.user, weak.user)
    rt = runtime()
    reads = [rt.executable, *rt.dirs, *sorted({os.path.realpath(f) for f in rt.files}), str(top)]
    extra = {"nproc": nproc, "confine": 1, "landlock": weak.landlock, "read_paths": os.pathsep.join(reads),
             "write_paths": str(work)}
    if weak.seccomp:
        extra["seccomp_fd"] = memfd("seccomp", build_filter())
        keep.append(extra["seccomp_fd"])
    return [*weak.prefix, rt.executable, "-I", "-S", "-B", str(top / "child.py"), str(top / "program.py")], extra
