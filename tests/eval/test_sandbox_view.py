"""What the bubblewrap sandbox shows a program: only the interpreter and its standard library.

Host files (/etc/shadow, /root, the user's home, this checkout, the benchmark data, installed
packages) must be refused or absent, with the Python guard and without it; the program runs as
an unprivileged uid outside as well as inside (read from the host's /proc); correct programs
that import the standard library's networking and concurrency modules pass.
"""
from __future__ import annotations

import json
import os
import site
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from specfold.eval.sandbox import SANDBOX_UID, Limits, run_program
from specfold.eval.sandbox_fs import runtime
from tests.eval.sandbox_helpers import own_tree, status_fields, subreaper  # noqa: F401 (subreaper: autouse)

pytestmark = pytest.mark.sandbox("bwrap")
ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import json, os, sys
got = {"read": [], "listed": {}}
for p in READS:
    try:
        with open(p, "rb") as f:
            f.read(16)
        got["read"].append(p)
    except OSError:
        pass
for d in LISTS:
    try:
        got["listed"][d] = sorted(os.listdir(d))
    except OSError:
        pass
try:
    sys.path[:0] = SITE
    import numpy
    got["numpy"] = numpy.__file__
except ImportError:
    pass
print(json.dumps(got))
"""


@pytest.fixture()
def markers():
    """Fresh files in the user's home and in this checkout (removed afterwards)."""
    name = f"specfold-hostile-{uuid.uuid4().hex}"
    paths = [Path.home() / name, ROOT / name]
    for p in paths:
        p.write_text("secret")
    yield paths
    for p in paths:
        p.unlink(missing_ok=True)


def test_host_files_are_refused_or_absent(markers, data_dir):
    import numpy

    home, checkout = markers
    reads = ["/etc/shadow", "/etc/passwd", "/etc/hostname", str(home), str(checkout), str(ROOT / "pyproject.toml"),
             str(data_dir / "mbpp" / "sanitized-mbpp.json"), numpy.__file__, str(ROOT / ".venv" / "pyvenv.cfg"),
             "/proc/self/mem", "/proc/1/environ", "/sys/kernel/notes"]
    lists = ["/", "/root", str(Path.home()), str(ROOT), str(ROOT.parent), "/etc", "/home", "/proc", "/sys"]
    src = f"READS = {reads!r}\nLISTS = {lists!r}\nSITE = {site.getsitepackages()!r}\n" + PROBE
    rt = runtime()
    needed = {p for q in (rt.executable, *rt.dirs, *rt.files) for p in Path(q).parents} | {Path(rt.executable)}
    for guard in (True, False):
        r = run_program(src, Limits(timeout_s=10.0, guard=guard))
        assert r.passed, r.stderr
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert got["read"] == [], guard
        assert "numpy" not in got, guard
        for d, names in got["listed"].items():
            # a folder the sandbox shows holds only the path to what the interpreter needs (or the
            # sandbox's own /tmp, /dev, /proc); never a host entry such as the markers
            assert home.name not in names and checkout.name not in names, (guard, d, names)
            shown = {n for n in names if not (d == "/" and n in ("tmp", "dev", "proc"))}
            assert all(Path(d) / n in needed or any(Path(d) / n == Path(x) for x in rt.files) or
                       os.path.realpath(Path(d) / n) in (rt.executable, *rt.dirs)
                       for n in shown), (guard, d, names)
        assert got["listed"].get("/proc", []) == [] and got["listed"].get("/etc") is None


def _outer_status(tag: str, seconds: float) -> dict:
    """Run a program that sleeps; read its process's status from the host's /proc meanwhile."""
    found: dict = {}
    t = threading.Thread(target=lambda: found.setdefault("r", run_program(
        f"# {tag}\nimport time\ntime.sleep({seconds})", Limits(timeout_s=seconds + 10))))
    t.start()
    deadline = time.monotonic() + seconds + 5
    while time.monotonic() < deadline and "status" not in found:
        for pid, cmd in own_tree().items():
            if "/tmp/.specfold/child.py" in cmd and not cmd.startswith("bwrap"):
                try:
                    st = status_fields(pid)
                except OSError:
                    continue
                if st.get("Uid", "").split()[0] != "0":  # after the child dropped root
                    found["status"] = st
        time.sleep(0.05)
    t.join()
    return found


def test_program_runs_as_an_unprivileged_uid_outside():
    found = _outer_status(f"uid{uuid.uuid4().hex[:8]}", 3.0)
    assert found["r"].passed
    st = found["status"]
    want = str(SANDBOX_UID) if os.geteuid() == 0 else str(os.getuid())
    assert st["Uid"].split() == [want] * 4 and st["Gid"].split()[0] != "0"
    assert st["Groups"] == "" and int(st["CapEff"], 16) == 0 and int(st["CapPrm"], 16) == 0
    assert st["NoNewPrivs"] == "1" and st["Seccomp"] == "2"


CORRECT = """
import asyncio, email.utils, http.client, logging.handlers, multiprocessing, socket, ssl, urllib.request
import concurrent.futures, queue, selectors, threading

async def main():
    q = asyncio.Queue()
    await q.put(await asyncio.sleep(0, result=41))
    return await q.get() + 1

assert asyncio.run(main()) == 42
a, b = socket.socketpair()
a.sendall(b"ping"); assert b.recv(4) == b"ping"
ctx = ssl.create_default_context(); assert ctx.verify_mode == ssl.CERT_REQUIRED
conn = http.client.HTTPConnection("example.com", timeout=1)  # built, never connected
assert email.utils.parseaddr("A <a@b.c>") == ("A", "a@b.c")
logging.getLogger("t").addHandler(logging.handlers.MemoryHandler(10))
with concurrent.futures.ThreadPoolExecutor(2) as ex:
    assert list(ex.map(abs, [-1, -2])) == [1, 2]
assert multiprocessing.current_process().name == "MainProcess"
assert urllib.request.Request("http://example.com").get_method() == "GET"
"""


def test_correct_programs_using_the_standard_library_pass():
    r = run_program(textwrap.dedent(CORRECT), Limits(timeout_s=20.0))
    assert r.passed, r.stderr


def test_correct_humaneval_solution_importing_socket_and_asyncio_passes():
    from specfold.eval.tasks import get_task

    task = get_task("humaneval")
    s = task.load(None)[0]
    sol = ("```python\nimport asyncio, socket\nfrom typing import List\n\n"
           "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
           "    async def check():\n"
           "        return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n"
           "    socket.socketpair()[0].close()\n"
           "    return asyncio.run(check())\n```")
    r = task.score(s, sol)
    assert r["correct"], r
