"""The server under a small KV pool (issue 41): `specfold serve --kv-cache-memory` as a user starts
it, 32 concurrent OpenAI clients, every one answered with the text the library gives with memory to
spare, preemptions visible in /metrics, the pool in /health, and a request larger than the pool a
400 with one line. A real server in a subprocess, the embedded tiny model."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
import httpx  # noqa: E402

from specfold import LLM, SamplingParams  # noqa: E402
from tests.serve_helpers import wait_for_server  # noqa: E402

pytestmark = pytest.mark.slow  # a subprocess server under load

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [f"Sam has {i} apples and buys {i % 7 + 2} more. How many apples does Sam have now?" for i in range(32)]
MAX_TOKENS = 40
POOL = "600KiB"  # 12 blocks of 16 positions of the tiny model in float32: about two requests


def _free_port() -> int:
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_32_openai_clients_under_a_small_kv_pool():
    want = {p: o.text for p, o in zip(PROMPTS, LLM("tiny").generate(PROMPTS, SamplingParams(max_new_tokens=MAX_TOKENS)))}
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    argv = [sys.executable, "-m", "specfold", "serve", "--model", "tiny", "--port", str(port), "--log-level",
            "warning", "--threads", "1", "--kv-cache-memory", POOL]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_server(p, url)
        health = httpx.get(url + "/health", timeout=30).json()
        assert health["kv_blocks_total"] == 11 and health["kv_blocks_free"] == 11, health
        got: dict = {}
        errors: list = []

        def ask(prompt: str) -> None:
            try:
                client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
                r = client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS)
                got[prompt] = r.choices[0].text
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(repr(e))

        threads = [threading.Thread(target=ask, args=(q,)) for q in PROMPTS]
        for t in threads:
            t.start()
        for t in threads:
            t.join(900)
        assert not errors and got == want
        metrics = httpx.get(url + "/metrics", timeout=60).text
        assert _metric(metrics, "specfold:num_preemptions_total") > 0
        assert _metric(metrics, "specfold:kv_cache_usage_perc") == 0.0
        assert _metric(metrics, "specfold:prefix_cache_queries_total") > 0
        assert _metric(metrics, "specfold:prefix_cache_hits_total") > 0  # resumed requests find their own blocks
        assert httpx.get(url + "/health", timeout=30).json()["kv_blocks_free"] == 11
        r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 400},
                       timeout=60)
        msg = r.json()["error"]["message"]
        assert r.status_code == 400 and "\n" not in msg and "of KV cache" in msg and "the KV pool has" in msg, msg
    finally:
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=120)
    assert "Traceback" not in err, err[-2000:]
