"""Code extraction from completions."""
from __future__ import annotations

from specfold.eval.code_extract import extract_code


def test_fenced_python_block():
    c = "Here:\n```python\ndef f(x):\n    return x\n```\nDone."
    assert extract_code(c, "f") == "def f(x):\n    return x\n"


def test_prefers_block_defining_entry_point():
    c = "```python\nprint(g(1))\n```\ntext\n```py\ndef g(x):\n    return 2\n```"
    assert extract_code(c, "g").startswith("def g")


def test_unterminated_fence_and_raw_body():
    assert extract_code("```python\ndef f():\n    return 1", "f") == "def f():\n    return 1"
    body = "    return x + 1\n"
    assert extract_code(body, "f") == body  # indentation of a bare body is kept


def test_joins_python_blocks_without_entry_point():
    c = "```python\nimport math\n```\n```python\nx = math.pi\n```"
    assert extract_code(c) == "import math\n\nx = math.pi\n"
