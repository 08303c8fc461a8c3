"""Pull a Python program out of a model completion.

Rule: if the completion has fenced blocks (```python ... ```; an unterminated last fence counts,
since generation may stop at max_new_tokens), use the first Python (or untagged) block that
defines `entry_point`, else all Python/untagged blocks joined; with no fence, the completion as
is (leading indentation kept, so a bare function body stays a body).
"""
from __future__ import annotations

import re

_FENCE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_PY_TAGS = {"", "python", "py", "python3", "py3"}


def defines(code: str, name: str) -> bool:
    """Whether `code` has a top-level-looking `def name(` (or `async def`)."""
    return re.search(rf"^\s*(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.M) is not None


def extract_code(completion: str, entry_point: str | None = None) -> str:
    """The program text to execute (see module docstring)."""
    blocks = [(tag.lower(), body) for tag, body in _FENCE.findall(completion)]
    if not blocks:
        return completion
    py = [body for tag, body in blocks if tag in _PY_TAGS] or [body for _, body in blocks]
    if entry_point:
        for body in py:
            if defines(body, entry_point):
                return body
    return "\n".join(py)
