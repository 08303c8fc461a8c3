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
