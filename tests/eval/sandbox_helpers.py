"""Helpers of the sandbox tests: this process's own tree of processes, as a subreaper sees it."""
from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="module")
def subreaper():
    """Make this test process the subreaper of what it starts (PR_SET_CHILD_SUBREAPER): a process
    that escapes its parent (setsid + double fork) is re-parented here, not to init, so it stays
    in `own_tree()`. Reset at the end of the module."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)
    yield
    libc.prctl(36, 0, 0, 0, 0)


def _stat(pid: str) -> tuple[int, str] | None:
    try:
        rest = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(rest[1]), rest[0].decode()


def own_tree(root: int | None = None) -> dict[int, str]:
    """{pid: command line} of the live (not zombie) descendants of `root` (default: this process)."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and (st := _stat(d)) is not None and st[1] not in ("Z", "X"):
            children.setdefault(st[0], []).append(int(d))
    out, todo = {}, [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            except OSError:
                continue
            out[pid] = cmd
            todo.append(pid)
    return out


def status_fields(pid: int) -> dict[str, str]:
    """/proc/PID/status as {field: value}."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        out[k] = v.strip()
    return out
