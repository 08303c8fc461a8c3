"""Import an older revision's `specfold` package alongside the current one (for before/after runs).

`load(rev)` extracts `specfold/` of git revision `rev` into a temporary folder as package
`specfold_base` (its `specfold` imports rewritten), puts it on sys.path and returns its name, so a
benchmark can time the old and the new code on the same model objects in one process.
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path


def load(rev: str) -> str:
    root = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                               check=True).stdout.strip())
    tmp = Path(tempfile.mkdtemp(prefix="specfold_base_"))
    tar = subprocess.run(["git", "-C", str(root), "archive", rev, "specfold"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=tar, check=True)
    (tmp / "specfold").rename(tmp / "specfold_base")
    for py in (tmp / "specfold_base").rglob("*.py"):
        src = re.sub(r"\bspecfold\.", "specfold_base.", py.read_text())
        py.write_text(re.sub(r"from specfold import", "from specfold_base import", src))
    sys.path.insert(0, str(tmp))
    return "specfold_base"
