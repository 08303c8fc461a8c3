"""The weak mode (`SPECFOLD_SANDBOX=weak`, no bubblewrap): what it still holds, and its warning.

The mode is forced in this process by making the bubblewrap probe fail. The bypasses found
against it (sqlite3 writing a host file, ctypes re-imported after popping it from sys.modules,
`_imp.create_dynamic` of `_posixsubprocess` running `sh`, a process storm, a `/proc/self/mem`
scan for the pass token, a program rewriting the sandbox's child script) must all fail where the
child can confine itself (Landlock + seccomp); the warning line always says scores can be forged.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from specfold.eval import sandbox
from specfold.eval.sandbox import Limits, run_program
from tests.eval.sandbox_helpers import own_tree, subreaper  # noqa: F401 (subreaper: autouse fixture)

pytestmark = pytest.mark.sandbox("weak")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def weak():
    mp = pytest.MonkeyPatch()
    mp.setattr(sandbox, "_probe_bwrap", lambda: "bubblewrap is switched off for this test")
    mp.setenv("SPECFOLD_SANDBOX", "weak")
    sandbox.backend.cache_clear()
    try:
        name, mode = sandbox.backend()
        yield mode
    finally:
        sandbox.backend.cache_clear()
        mp.undo()


@pytest.fixture()
def confined(weak):
    if not (weak.landlock and weak.seccomp):
        pytest.skip(f"the weak mode cannot confine its child here ({weak.describe()})")
    return weak


def test_warning_says_scores_can_be_forged(capfd):
    mp = pytest.MonkeyPatch()
    mp.setattr(sandbox, "_probe_bwrap", lambda: "bubblewrap (bwrap) is not installed")
    mp.setenv("SPECFOLD_SANDBOX", "weak")
    sandbox.backend.cache_clear()
    try:
        capfd.readouterr()
        assert sandbox.backend()[0].startswith("weak:")
        lines = capfd.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("specfold: warning: bubblewrap (bwrap) is not installed;")
        assert "scores can be forged" in lines[0] and "install bubblewrap" in lines[0]
        assert run_program("assert 1 + 1 == 2").passed
        assert not run_program("import os\nos._exit(0)\nassert False").passed
    finally:
        sandbox.backend.cache_clear()
        mp.undo()


def test_correct_programs_still_pass(weak):
    src = ("import socket, asyncio, multiprocessing, http.client, urllib.request, logging.handlers, ssl, email.utils\n"
           "async def f():\n    await asyncio.sleep(0)\n    return 3\nassert asyncio.run(f()) == 3\n"
           "open('out.txt', 'w').write('x')\nassert open('out.txt').read() == 'x'")
    r = run_program(src, Limits(timeout_s=10.0))
    assert r.passed, r.stderr


def test_host_writes_through_the_known_bypasses_fail(confined, tmp_path):
    marks = {k: tmp_path / k for k in ("sqlite", "ctypes", "posixsubprocess", "closure", "base_fileio")}
    attacks = {
        "sqlite": f"import sqlite3\nc = sqlite3.connect({str(marks['sqlite'])!r})\nc.execute('create table t(x)')\nc.commit()",
        "ctypes": "import sys\nfor n in [n for n in sys.modules if 'ctypes' in n]:\n    sys.modules.pop(n)\n"
                  "import ctypes\nlibc = ctypes.CDLL(None)\n"
                  f"fd = libc.open({str(marks['ctypes']).encode()!r}, 0o101, 0o644)\nassert fd >= 0, fd\n"
                  f"assert libc.system(b'touch {marks['ctypes']}') == 0",
        "posixsubprocess": "import _imp, importlib.util, sys, subprocess\nsys.modules.pop('_posixsubprocess', None)\n"
                           "m = _imp.create_dynamic(importlib.util.find_spec('_posixsubprocess'))\n"
                           "subprocess._fork_exec = m.fork_exec\n"
                           f"subprocess.run(['sh', '-c', 'touch {marks['posixsubprocess']}'], check=True)",
        "closure": "real = [c.cell_contents for c in open.__closure__ if callable(c.cell_contents)]\n"
                   f"real[0]({str(marks['closure'])!r}, 'w').write('x')",
        "base_fileio": f"import io\nio.FileIO.__bases__[0]({str(marks['base_fileio'])!r}, 'w').write(b'x')",
    }
    for name, src in attacks.items():
        r = run_program(src, Limits(timeout_s=5.0))
        assert not r.passed, (name, r.stderr)
        assert not marks[name].exists(), (name, r.stderr)


def test_process_storm_starts_nothing(confined):
    tag = f"storm{uuid.uuid4().hex[:8]}"
    src = (f"# {tag}\nimport os, sys, _imp, importlib.util\nn = 0\n"
           "for _ in range(256):\n    try:\n        if os.fork() == 0:\n            import time; time.sleep(30)\n"
           "        n += 1\n    except OSError:\n        pass\nprint(n)\nassert n == 256")
    for guard in (True, False):
        r = run_program(src, Limits(timeout_s=5.0, guard=guard))
        assert not r.passed, r.stdout
        assert [c for c in own_tree().values() if "sleep" in c or tag in c] == []


@pytest.fixture(scope="module")
def humaneval0():
    from specfold.eval.tasks import get_task

    task = get_task("humaneval")
    return task, task.load(None)[0]


MEMORY_SCAN = textwrap.dedent("""
        import re, os
        if globals().get('scanned'):  # once per run (the tests call the function 7 times)
            return False
        globals()['scanned'] = True
        try:
            maps = open('/proc/self/maps').read().splitlines()
            mem = open('/proc/self/mem', 'rb')
            found = set()
            for line in maps:
                lo, hi = (int(x, 16) for x in line.split()[0].split('-'))
                if 'rw' not in line.split()[1] or hi - lo > (16 << 20):
                    continue
                try:
                    mem.seek(lo); chunk = mem.read(hi - lo)
                except OSError:
                    continue
                found.update(re.findall(rb'(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])', chunk))
            mem.close()
            os.write(1, b'memory scanned: %d candidate tokens\\n' % len(found))
            for tok in found:
                for fd in range(3, 256):
                    try:
                        os.write(fd, b'PASS ' + tok + b'\\n')
                    except OSError:
                        pass
        except OSError:
            pass
        return False""")


def scan_program(humaneval0):
    from specfold.eval.tasks.humaneval import build_program

    task, s = humaneval0
    wrong = f"```python\ndef has_close_elements(numbers, threshold):{textwrap.indent(MEMORY_SCAN, '    ')}\n```"
    return task, s, wrong, build_program(s.reference["prompt"], wrong, s.reference["test"], s.reference["entry_point"])


def test_memory_scan_for_the_token_is_no_pass(confined, humaneval0):
    task, s, wrong, _ = scan_program(humaneval0)
    assert not task.score(s, wrong)["correct"]


def test_memory_scan_without_landlock_is_still_no_pass(weak, humaneval0, monkeypatch):
    """Where the child cannot confine itself, /proc/self/mem is readable and the token can be
    found: the verdict, computed by the harness from reported values, still fails the program."""
    import dataclasses

    monkeypatch.setattr(sandbox, "backend", lambda: ("weak:test", dataclasses.replace(weak, landlock=0)))
    task, s, wrong, (program, plan) = scan_program(humaneval0)
    r = run_program(program, Limits(timeout_s=20.0))
    assert "memory scanned" in r.stdout, r.stderr  # the scan did run over the process's memory
    assert r.status != "timeout"
    assert not task.score(s, wrong)["correct"]


CHILD_REWRITE = '''
def has_close_elements(numbers, threshold):
    import io, os, posix
    path = {path!r}
    evil = "import os\\nos.write(1, b'rewritten')\\n"
    for write in (lambda: open(path, 'w').write(evil),
                  lambda: [c.cell_contents for c in open.__closure__ if callable(c.cell_contents)][0](path, 'w').write(evil),
                  lambda: io.FileIO.__bases__[0](path, 'w').write(evil.encode()),
                  lambda: posix.write(posix.open(path, posix.O_WRONLY | posix.O_TRUNC), evil.encode())):
        try:
            write()
        except Exception:
            pass
    return False
'''


def test_rewriting_the_child_script_changes_nothing(confined, tmp_path):
    """In a copy of the package (the real checkout is never at risk): a program tries to rewrite
    sandbox_child.py on disk; then a wrong program must still fail, and the file is unchanged."""
    tree = tmp_path / "checkout"
    shutil.copytree(ROOT / "specfold", tree / "specfold", ignore=shutil.ignore_patterns("__pycache__", "model", "graphs"))
    child = tree / "specfold" / "eval" / "sandbox_child.py"
    os.chmod(tmp_path, 0o755)
    before = hashlib.sha256(child.read_bytes()).hexdigest()
    script = textwrap.dedent(f"""
        import json, os
        os.environ["SPECFOLD_SANDBOX"] = "weak"
        from specfold.eval import sandbox
        sandbox._probe_bwrap = lambda: "switched off"
        from specfold.eval.tasks import get_task
        task = get_task("humaneval")
        s = task.load(None)[0]
        attack = "```python\\n" + {CHILD_REWRITE.format(path=str(child))!r} + "```"
        wrong = "```python\\ndef has_close_elements(numbers, threshold):\\n    return False\\n```"
        print(json.dumps([task.score(s, attack)["correct"], task.score(s, wrong)["correct"],
                          task.score(s, s.reference["canonical_solution"])["correct"]]))
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(tree)}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [False, False, True]
    assert hashlib.sha256(child.read_bytes()).hexdigest() == before
