"""What a sandboxed program sees of the host filesystem: the interpreter and its standard library.

`runtime()` lists, once per process, the host paths the child interpreter needs: the base
interpreter binary (never a venv's), its standard library and `lib-dynload` folder, and the
shared libraries those load (the dynamic loader's own answer, `ldd`), plus `libgcc_s` (glibc
loads it for thread exit). `bwrap_mounts(rt)` turns them into bubblewrap arguments that rebuild
exactly those paths on an empty root: every real path read-only at its own place, every symlink
met on the way (`/lib64 -> usr/lib64`) recreated as a symlink, every folder in between created
0755 and empty.

Invariants: nothing else of the host is mounted (no `/etc`, `/home`, `/root` contents, no
checkout, no venv); `site-packages`/`dist-packages` folders inside the standard library are
covered by empty tmpfs mounts, so no installed package (NumPy included) is importable or
readable; extension modules that reach raw memory or other threads (`masked`) are replaced by
`/dev/null`; a folder is never created inside a read-only bind.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from functools import lru_cache

MASKED = ("_ctypes", "_testcapi", "_testinternalcapi", "_ctypes_test", "_xxsubinterpreters",
          "_xxinterpchannels", "_interpreters", "_interpchannels", "_interpqueues", "_testmultiphase",
          "_testsinglephase", "_testbuffer", "_testimportmultiple", "_testclinic")
SKIP_LIBS_OF = ("_tkinter", "_curses", "_curses_panel", "readline")  # GUI/terminal: never importable here
SITE_NAMES = ("site-packages", "dist-packages")


@dataclass(frozen=True)
class Runtime:
    executable: str                # real path of the base interpreter
    dirs: tuple[str, ...]          # standard library folders (real paths), bound whole
    files: tuple[str, ...]         # shared libraries and the dynamic loader, as the loader names them
    hidden: tuple[str, ...]        # folders inside `dirs` covered by an empty tmpfs (site-packages)
    masked: tuple[str, ...]        # extension-module files replaced by /dev/null


def _base_executable() -> str:
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _stdlib_dirs() -> list[str]:
    out = [os.path.realpath(sysconfig.get_path("stdlib"))]
    out += [os.path.realpath(p) for p in sys.path if p.endswith("lib-dynload") and os.path.isdir(p)]
    return list(dict.fromkeys(out))


def _masked_files() -> list[str]:
    out = []
    for name in MASKED:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.origin and os.path.isfile(spec.origin):
            out.append(os.path.realpath(spec.origin))
    return out


def _ldd(paths: list[str]) -> list[str]:
    """Libraries the dynamic loader resolves for `paths` (absolute paths as it names them)."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return []
    try:
        out = subprocess.run([ldd, *paths], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    libs = []
    for line in out.splitlines():
        words = line.strip().split()
        if "=>" in words and len(words) > words.index("=>") + 1:
            cand = words[words.index("=>") + 1]
        elif words and words[0].startswith("/") and not line.rstrip().endswith(":"):
            cand = words[0]  # the dynamic loader itself
        else:
            continue
        if cand.startswith("/") and os.path.exists(cand):
            libs.append(cand)
    return libs


@lru_cache(maxsize=1)
def runtime() -> Runtime:
    """The host paths the sandboxed interpreter needs (computed once; see module docstring)."""
    exe, dirs, masked = _base_executable(), _stdlib_dirs(), _masked_files()
    exts = [p for d in dirs for p in glob.glob(os.path.join(d, "*.so"))
            if os.path.realpath(p) not in masked and not os.path.basename(p).startswith(SKIP_LIBS_OF)]
    libs = _ldd([exe, *exts])
    hidden = [os.path.join(d, n) for d in dirs for n in SITE_NAMES if os.path.isdir(os.path.join(d, n))]
    libc = [p for p in libs if os.path.basename(p).startswith("libc.so")]
    if libc:
        gcc = os.path.join(os.path.dirname(os.path.realpath(libc[0])), "libgcc_s.so.1")
        libs += [gcc] if os.path.exists(gcc) else []
    if not libs:  # no ldd: the usual library folders whole, their Python packages hidden
        libs = [d for d in ("/lib", "/lib64", "/usr/lib", "/usr/lib64") if os.path.isdir(d)]
        hidden += [os.path.realpath(p) for p in glob.glob("/usr/lib/python3*/*-packages")]
    return Runtime(exe, tuple(dirs), tuple(dict.fromkeys(libs)), tuple(dict.fromkeys(hidden)), tuple(masked))


def _walk(path: str, links: dict[str, str], dirs: set[str]) -> str:
    """Resolve `path` component by component: record each symlink (location -> target) and each
    real folder passed through; return the real path."""
    parts, cur, hops = [p for p in path.split("/") if p], "/", 0
    while parts:
        comp = parts.pop(0)
        nxt = os.path.join(cur, comp)
        if os.path.islink(nxt):
            hops += 1
            if hops > 40:
                raise OSError(f"too many symlinks resolving {path}")
            target = os.readlink(nxt)
            links[nxt] = target
            parts = [p for p in os.path.normpath(os.path.join(cur, target)).split("/") if p] + parts
            cur = "/"
            continue
        if parts:
            dirs.add(nxt)
        cur = nxt
    return cur


def _depth(p: str) -> int:
    return p.rstrip("/").count("/")


def _under(p: str, roots: list[str]) -> bool:
    return any(p != r and p.startswith(r.rstrip("/") + "/") for r in roots)


def bwrap_mounts(rt: Runtime) -> list[str]:
    """bubblewrap arguments that show the sandbox `rt`'s paths and nothing else (see module docstring)."""
    links: dict[str, str] = {}
    dirs: set[str] = set()
    binds = [_walk(p, links, dirs) for p in (rt.executable, *rt.dirs, *rt.files)]
    bound_dirs = [b for b in binds if os.path.isdir(b)]
    binds = sorted({b for b in binds if not _under(b, bound_dirs)}, key=_depth)
    dirs = {d for d in dirs if d not in binds and not _under(d, bound_dirs)}
    links = {k: v for k, v in links.items() if not _under(k, bound_dirs) and k not in binds}
    ops: list[tuple[int, int, list[str]]] = []
    ops += [(_depth(d), 0, ["--perms", "0755", "--dir", d]) for d in dirs]
    ops += [(_depth(b), 1, ["--ro-bind", b, b]) for b in binds]
    ops += [(_depth(h), 2, ["--perms", "0755", "--tmpfs", h]) for h in rt.hidden if os.path.isdir(h)]
    ops += [(_depth(m), 2, ["--ro-bind", "/dev/null", m]) for m in rt.masked]
    ops += [(_depth(k), 3, ["--symlink", v, k]) for k, v in links.items()]
    return [a for _, _, args in sorted(ops, key=lambda o: (o[0], o[1])) for a in args]

