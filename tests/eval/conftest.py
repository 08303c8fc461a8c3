"""Shared fixtures for the evaluation-harness tests: where the offline benchmark data lives."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

DATA = Path(os.environ.get("SPECFOLD_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not (DATA / "gsm8k" / "test.jsonl").is_file():
        pytest.skip(f"benchmark data not found at {DATA} (set SPECFOLD_DATA)")
    return DATA


def _sandbox_skip(kind: str | None) -> str | None:
    """None when the code sandbox (of `kind`) runs here, else the one skip reason."""
    from specfold.eval import sandbox

    try:
        name = sandbox.isolation()
    except sandbox.SandboxUnavailable:
        name = None
    if name is not None and (kind is None or name == kind):
        return None
    why = sandbox._probe_bwrap() or "SPECFOLD_SANDBOX=weak is set"
    return (f"code execution needs the bubblewrap sandbox, but {why}: `make test` installs bubblewrap when run "
            "as root with apt; otherwise install it (apt-get install bubblewrap, or your system's package)")


def pytest_collection_modifyitems(config, items):
    reasons: dict = {}
    for item in items:
        mark = item.get_closest_marker("sandbox")
        if mark is None:
            continue
        kind = mark.args[0] if mark.args else None
        if kind == "weak":  # the test runs the weak mode itself (marked for `make test-fast` to leave out)
            continue
        if kind not in reasons:
            reasons[kind] = _sandbox_skip(kind)
        if reasons[kind]:
            item.add_marker(pytest.mark.skip(reason=reasons[kind]))
