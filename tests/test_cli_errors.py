"""First contact with the command line: every mistake ends in ONE line on stderr and a non-zero
exit status (2 for bad input or a missing extra, 130 for Ctrl-C), never a traceback; the core
install needs no optional extra (and no numpy) to decode; `python -m specfold` works."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from specfold.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY_OK = (ROOT / "specfold" / "tiny" / "model" / "config.json").is_file()
needs_tiny = pytest.mark.skipif(not TINY_OK, reason="the embedded tiny model is not trained yet")


def run(capsys, *argv: str) -> tuple[int, str]:
    """main(argv) -> (exit status, stderr), asserting stderr is one line and no traceback."""
    try:
        rc = main(list(argv))
    except SystemExit as e:  # argparse errors
        rc = e.code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    return rc, err.strip()


def _env(**kw) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **kw)
    return env


# ------------------------------------------------------------------ generate: prompts
def test_prompt_file_missing_or_binary_or_a_folder(capsys, tmp_path):
    rc, err = run(capsys, "generate", "--prompt-file", str(tmp_path / "nope.txt"))
    assert rc == 2 and err == f"error: --prompt-file '{tmp_path / 'nope.txt'}': No such file or directory"
    binary = tmp_path / "b.bin"
    binary.write_bytes(b"ok\n\x89PNG\x00\xff\xfe")
    rc, err = run(capsys, "generate", "--prompt-file", str(binary))
    assert rc == 2 and "is not UTF-8 text (byte 0x89 at offset 3)" in err
    binary.write_bytes(b"fine\n\x00\x01\x02\n")  # valid UTF-8 but not text
    rc, err = run(capsys, "generate", "--prompt-file", str(binary))
    assert rc == 2 and "line 2 holds the control character '\\x00'" in err
    rc, err = run(capsys, "generate", "--prompt-file", str(tmp_path))
    assert rc == 2 and "Is a directory" in err
    (tmp_path / "empty.txt").write_text("\n\n")
    rc, err = run(capsys, "generate", "--prompt-file", str(tmp_path / "empty.txt"))
    assert rc == 2 and "give --prompt TEXT" in err


def test_binary_junk_as_prompt(capsys):
    junk = os.fsdecode(b"\xff\xfe junk")  # what Python makes of non-UTF-8 bytes in argv
    rc, err = run(capsys, "generate", "--prompt", junk)
    assert rc == 2 and err.startswith("error: --prompt is not valid UTF-8 text")
    rc, err = run(capsys, "generate", "--prompt", "a\x07b")
    assert rc == 2 and "control character '\\x07' at character 1" in err


def test_binary_junk_via_the_subprocess_argv():
    p = subprocess.run([sys.executable, "-m", "specfold", "generate", "--prompt", b"\xff\xfe\x80"],
                       capture_output=True, text=True, env=_env(), timeout=120)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "error: --prompt is not valid UTF-8 text (undecodable byte at character 0); prompts must be UTF-8 text"]


@needs_tiny
def test_api_refuses_binary_prompts(tiny_llm):
    from specfold.errors import ParamsError
    with pytest.raises(ParamsError, match="control character"):
        tiny_llm.generate(["what\x00"])


# ------------------------------------------------------------------ generate: devices, backends, rules
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a CPU-only machine")
def test_device_cuda_on_cpu_only_torch(capsys):
    rc, err = run(capsys, "generate", "--prompt", "hi", "--device", "cuda")
    assert rc == 2 and err.startswith("error: device 'cuda' is not available") and "use device 'cpu'" in err
    rc, err = run(capsys, "generate", "--prompt", "hi", "--device", "banana")
    assert rc == 2 and err == "error: unknown device 'banana'; accepted: 'cpu', 'cuda', 'cuda:N'"


@needs_tiny
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_backend_triton_without_a_gpu(capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    rc, err = run(capsys, "generate", "--prompt", "hi", "--method", "specfold", "--backend", "triton",
                  "--max-new-tokens", "8")
    assert rc == 2 and err.startswith("error: backend 'triton' ")
    assert "use backend 'torch'" in err


@needs_tiny
def test_rule_dream_refused_on_a_block_causal_family(capsys, tiny_llm):
    from specfold import DecodeParams
    from specfold.errors import ParamsError
    llm = tiny_llm
    with pytest.raises(ParamsError, match=r"rule 'dream' .* bidirectional models \(Dream, LLaDA\), not "):
        llm.generate(["Tom has 3 apples."], DecodeParams(rule="dream", max_new_tokens=8))
    rc, err = run(capsys, "generate", "--prompt", "hi", "--rule", "dream")
    assert rc == 2 and "rule 'dream'" in err and "Dream, LLaDA" in err


def test_rule_dream_still_runs_on_a_bidirectional_model(checkpoint):
    from specfold import LLM, DecodeParams
    llm = LLM(checkpoint("llama", attention="bidirectional", logits_shift=True), dtype="float64")
    out = llm.generate([[1, 2, 3]], DecodeParams(rule="dream", steps=4, max_new_tokens=4))[0]
    assert len(out.token_ids) <= 4 and out.stats.nfe > 0


@pytest.mark.parametrize("argv, message", [
    (["--method", "banana"], "error: unknown decode method 'banana'; supported: ['ar', 'freedave', "
                             "'linear_spec', 'linear_spec_multi', 'linear_specfold', 'specfold', 'spiffy', 'vanilla']"),
    (["--max-new-tokens", "-3"], "specfold generate: error: argument --max-new-tokens: max_new_tokens must be "
                                 ">= 1, got -3 (see specfold generate --help)"),
    (["--max-new-tokens", "x"], "argument --max-new-tokens: expected an integer, got 'x'"),
    (["--threads", "0"], "argument --threads: expected a positive integer, got 0"),
    (["--threshold", "2"], "argument --threshold: threshold must be in [0, 1] (0 = unmask every candidate), got 2.0"),
    (["--branches", "0"], "argument --branches: branches must be in [1, 64], got 0"),
    (["--stop-token-ids", "1,x"], "argument --stop-token-ids: expected comma-separated integers, got '1,x'"),
    (["--rule", "sub_block", "--block-size", "8", "--sub-block-size", "3"],
     "error: block_size=8 is not a multiple of sub_block_size=3"),
    (["--model", "/no/such/model"], "error: checkpoint folder '/no/such/model' does not exist"),
    (["--dtype", "int8"], "argument --dtype: invalid choice: 'int8'"),
    (["--prompt-ids", "1,x"], "error: --prompt-ids takes comma-separated integers, got '1,x'"),
])
def test_generate_bad_flags(capsys, argv, message):
    rc, err = run(capsys, "generate", "--prompt", "hi", *argv)
    assert rc == 2 and message in err


@needs_tiny
def test_override_of_the_wrong_type(capsys):
    rc, err = run(capsys, "generate", "--prompt", "hi", "--override", "mask_token_id=abc")
    assert rc == 2 and err == "error: override mask_token_id='abc': expected an integer"
    rc, err = run(capsys, "generate", "--prompt", "hi", "--override", "stop_token_ids=3")
    assert rc == 2 and err == "error: override stop_token_ids=3: expected a list of integers"


def test_train_tiny_and_calibrate_bad_numbers(capsys, tmp_path):
    rc, err = run(capsys, "train-tiny", "--out", str(tmp_path / "t"), "--steps", "0")
    assert rc == 2 and "argument --steps: expected a positive integer, got 0" in err
    (tmp_path / "empty.txt").write_text("")
    rc, err = run(capsys, "calibrate", "--prompts", str(tmp_path / "empty.txt"), "--out", str(tmp_path / "g.json"))
    assert rc == 2 and err == "error: calibration needs at least one prompt"
    rc, err = run(capsys, "calibrate", "--prompts", str(tmp_path / "empty.txt"), "--out", "g.json", "--limit", "-1")
    assert rc == 2 and "argument --limit: expected a positive integer, got -1" in err


def test_unknown_command_and_demo_method(capsys):
    rc, err = run(capsys, "banana")
    assert rc == 2 and "invalid choice: 'banana'" in err
    rc, err = run(capsys, "demo", "--methods", "vanilla,banana")
    assert rc == 2 and "unknown decode method 'banana'" in err
    rc, err = run(capsys, "demo", "--n", "0")
    assert rc == 2 and "argument --n: expected a positive integer, got 0" in err


# ------------------------------------------------------------------ eval / bench / calibrate
def test_eval_unknown_task_and_bad_limits(capsys):
    rc, err = run(capsys, "eval", "--tasks", "tiny,banana")
    assert rc == 2 and err.startswith("error: unknown task 'banana'; supported: gsm8k,")
    for limit in ("-1", "0"):  # 0 would evaluate nothing: refused like -1
        rc, err = run(capsys, "eval", "--limit", limit)
        assert rc == 2 and f"argument --limit: expected a positive integer, got {limit}" in err
    rc, err = run(capsys, "eval", "--warmup", "-1")
    assert rc == 2 and "argument --warmup: expected an integer >= 0, got -1" in err


def test_bench_bad_sweeps_and_methods(capsys):
    rc, err = run(capsys, "bench", "--sweep", "delta=a,b")
    assert rc == 2 and err == "error: --sweep 'delta=a,b': 'a' is not a number"
    rc, err = run(capsys, "bench", "--sweep", "branches=1.5")
    assert rc == 2 and err == "error: --sweep 'branches=1.5': '1.5' is not an integer"
    rc, err = run(capsys, "bench", "--methods", "specfold", "--sweep", "delta=0,-1")
    assert rc == 2 and err == "error: delta must be >= 0 (0 = dense verification), got -1"
    rc, err = run(capsys, "bench", "--sweep", "bogus=1")
    assert rc == 2 and err.startswith("error: cannot sweep 'bogus'")
    rc, err = run(capsys, "bench", "--methods", "vanilla,nope")
    assert rc == 2 and err.startswith("error: unknown method(s) ['nope']")


@pytest.mark.parametrize("name, body, message", [
    ("bad.jsonl", '{"question": "1 + 1?", "answer": "#### 2"}\n{"question": \n', "bad.jsonl:2: not valid JSON"),
    ("bad.json", '[{"question": "1 + 1?",', "bad.json: not valid JSON"),
    ("list.jsonl", '[1, 2]\n', "list.jsonl:1: expected a JSON object, got list"),
    ("bin.jsonl", b"\xff\xfe\x00", "bin.jsonl: not UTF-8 text"),
])
def test_eval_malformed_data_file(capsys, tmp_path, name, body, message):
    f = tmp_path / name
    f.write_bytes(body if isinstance(body, bytes) else body.encode())
    rc, err = run(capsys, "eval", "--tasks", "tiny", "--data", str(f), "--limit", "1", "--no-progress")
    assert rc == 2 and message in err


def test_bench_plot_and_out_into_unwritable_places(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")  # a folder cannot be made under a file, even as root
    rc, err = run(capsys, "bench", "--plot", str(blocker / "plots"))
    assert rc == 2 and err == f"error: --plot '{blocker / 'plots'}' cannot be created (Not a directory)"
    rc, err = run(capsys, "bench", "--plot", str(blocker))
    assert rc == 2 and err == f"error: --plot '{blocker}' is a file, not a folder"
    rc, err = run(capsys, "bench", "--out", str(blocker / "b.jsonl"))
    assert rc == 2 and err == f"error: --out '{blocker / 'b.jsonl'}': its folder '{blocker}' is a file, not a folder"


def test_calibrate_prompts_missing_or_binary(capsys, tmp_path):
    rc, err = run(capsys, "calibrate", "--prompts", str(tmp_path / "p.jsonl"), "--out", str(tmp_path / "g.json"))
    assert rc == 2 and err == f"error: --prompts '{tmp_path / 'p.jsonl'}': No such file or directory"
    (tmp_path / "b").write_bytes(b"\xc3\x28")
    rc, err = run(capsys, "calibrate", "--prompts", str(tmp_path / "b"), "--out", str(tmp_path / "g.json"))
    assert rc == 2 and "is not UTF-8 text" in err


@pytest.mark.slow
@needs_tiny
def test_ctrl_c_exits_130_quietly_and_keeps_the_records(tmp_path):
    out = tmp_path / "runs" / "b.jsonl"
    argv = [sys.executable, "-m", "specfold", "bench", "--model", "tiny", "--tasks", "tiny", "--methods",
            "vanilla", "--rule", "static", "--limit", "40", "--warmup", "0", "--threads", "1", "--out", str(out)]
    # a shell's background job inherits SIGINT ignored, and so would the child: give it the default
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not (out.is_file() and out.stat().st_size) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert p.poll() is None, "the run ended before it could be interrupted"
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 130
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1] == "interrupted"
    assert stdout == ""  # no table of a partial run
    lines = out.read_text().splitlines()
    assert 1 <= len(lines) < 40
    assert all(json.loads(line)["method"] == "vanilla" for line in lines)  # whole records only


# ------------------------------------------------------------------ missing extras, lazy imports
@pytest.mark.parametrize("argv, extra", [
    (["serve"], "serve"), (["eval", "--tasks", "tiny"], "eval"), (["bench", "--help"], "eval")])
def test_missing_extra_is_one_line(capsys, monkeypatch, argv, extra):
    import importlib.util
    real = importlib.util.find_spec
    gone = {"serve": "uvicorn", "eval": "matplotlib"}[extra]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == gone else real(name, *a))
    rc, err = run(capsys, *argv)
    assert rc == 2 and err == (f"error: specfold {argv[0]} needs the '{extra}' extra (missing module "
                               f"'{gone}'): pip install 'specfold[{extra}]'")


def test_missing_lm_eval_extra_is_one_line(capsys, monkeypatch):
    import importlib.util
    from specfold.cli import lm_eval_main
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "lm_eval" else real(name, *a))
    assert lm_eval_main() == 2
    assert capsys.readouterr().err.strip() == ("error: specfold-lm-eval needs the 'lm-eval' extra (missing module "
                                               "'lm_eval'): pip install 'specfold[lm-eval]'")


HEAVY = ("torch", "numpy", "fastapi", "uvicorn", "matplotlib", "sympy", "lm_eval", "triton")


@pytest.mark.parametrize("argv", [["--help"], ["generate", "--help"], ["demo", "--help"], ["bench", "--help"],
                                  ["eval", "--help"], ["serve", "--help"]])
def test_help_imports_neither_torch_nor_extras(argv):
    code = ("import sys\nfrom specfold.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            f"print([m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr)")
    p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=_env(), timeout=120)
    assert p.returncode == 0 and "usage: specfold" in p.stdout
    assert p.stderr.strip().splitlines()[-1] == "[]"


def test_python_dash_m_specfold():
    p = subprocess.run([sys.executable, "-m", "specfold", "--help"], capture_output=True, text=True, env=_env(),
                       timeout=120)
    assert p.returncode == 0 and p.stdout.startswith("usage: specfold ") and "generate" in p.stdout


@pytest.mark.slow
@needs_tiny
def test_decoding_needs_no_numpy():
    """Every method, eager windows included, decodes with numpy made unimportable."""
    code = """
import sys
sys.modules["numpy"] = None  # `import numpy` now raises ImportError, as on a core install
import torch
torch.set_num_threads(1)
from specfold import LLM, DecodeParams
llm = LLM("tiny", dtype="float64")
q = "Tom has 3 apples and buys 4 more. How many apples does he have now?"
ids = {}
for kw in ({}, {"method": "freedave", "eager": True}, {"method": "spiffy"}, {"method": "specfold", "delta": 0.0}):
    p = DecodeParams(chat_template=True, rule="static", max_new_tokens=24, **kw)
    ids[kw.get("method", "vanilla")] = llm.generate([q], p)[0].token_ids
assert len(set(map(tuple, ids.values()))) == 1, ids
print("ok", len(ids["vanilla"]))
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.startswith("ok ")


# ------------------------------------------------------------------ serve and pipes
def test_serve_port_out_of_range(capsys):
    rc, err = run(capsys, "serve", "--model", "tiny", "--port", "99999")
    assert rc == 2 and err == "error: --port 99999 is not a TCP port; accepted: 0-65535 (0 = any free port)"


@pytest.mark.slow
@needs_tiny
def test_closed_stdout_pipe_exits_quietly():
    """`specfold generate ... | head -c 1`: the reader leaves early; no traceback, status 141."""
    r, w = os.pipe()
    os.close(r)  # nobody reads: the first write fails with EPIPE
    p = subprocess.run([sys.executable, "-m", "specfold", "generate", "--model", "tiny", "--prompt", "hi",
                        "--max-new-tokens", "16"], stdout=w, stderr=subprocess.PIPE, env=_env(), timeout=300)
    os.close(w)
    assert p.returncode == 141, p.stderr.decode()
    assert b"Traceback" not in p.stderr


def test_extras_table_names_every_package_of_each_extra():
    """specfold.extras.EXTRAS (what the one-line hints check) lists each extra's packages from pyproject."""
    import re

    from specfold.extras import EXTRAS
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name, mods in EXTRAS.items():
        pkgs = {re.split(r"[<>=!~\[ ]", req)[0].lower().replace("-", "_") for req in extras[name]}
        assert pkgs == set(mods), (name, pkgs, mods)


@pytest.mark.slow
@needs_tiny
def test_generate_scheduler_flags(capsys, monkeypatch):
    """`generate --max-num-seqs/--max-num-batched-tokens/--draft-budget` reach the engine; the
    outputs do not depend on them; a bad value is one line."""
    import specfold.api as api
    from specfold.cli import main
    seen = []
    real = api.Engine

    def spy(host, config, **kw):
        seen.append(config)
        return real(host, config, **kw)

    monkeypatch.setattr(api, "Engine", spy)
    args = ["generate", "--model", "tiny", "--prompt", "Tom has 3 apples.", "--prompt", "Mia has 5 pens.",
            "--method", "freedave", "--max-new-tokens", "16", "--json", "--threads", "1"]
    assert main(args) == 0
    plain = [json.loads(x)["token_ids"] for x in capsys.readouterr().out.splitlines()]
    assert main(args + ["--max-num-seqs", "1", "--max-num-batched-tokens", "64", "--draft-budget", "2"]) == 0
    limited = [json.loads(x)["token_ids"] for x in capsys.readouterr().out.splitlines()]
    assert limited == plain and len(plain) == 2
    c = seen[-1]
    assert (c.max_num_seqs, c.max_num_batched_tokens, c.draft_budget, c.method) == (1, 64, 2, "freedave")
    assert (seen[0].max_num_seqs, seen[0].draft_budget) == (64, "auto")
    rc, err = run(capsys, "generate", "--prompt", "x", "--max-num-seqs", "0")
    assert rc == 2 and "--max-num-seqs" in err
    for bad in ("-1", "some", "2.5"):
        rc, err = run(capsys, "generate", "--prompt", "x", "--draft-budget", bad)
        assert rc == 2 and "--draft-budget" in err and "'auto' or an integer >= 0" in err and len(err.splitlines()) == 1


# ------------------------------------------------------------------ tensor parallelism flags
PARALLEL_COMMANDS = {"generate": ["--prompt", "hi"], "serve": [], "eval": ["--tasks", "tiny", "--limit", "1"],
                     "bench": ["--tasks", "tiny", "--methods", "vanilla", "--limit", "1"]}


@pytest.mark.parametrize("command", list(PARALLEL_COMMANDS))
@pytest.mark.parametrize("argv, message", [
    (["-tp", "0"], "argument --tensor-parallel-size/-tp: expected a positive integer, got 0"),
    (["--tensor-parallel-size", "two"], "argument --tensor-parallel-size/-tp: expected a positive integer, got 'two'"),
    (["--distributed-executor-backend", "threads"],
     "argument --distributed-executor-backend: invalid choice: 'threads' (choose from 'mp', 'ray')"),
])
def test_parallel_flags_bad_values(capsys, command, argv, message):
    rc, err = run(capsys, command, *PARALLEL_COMMANDS[command], *argv)
    assert rc == 2 and err == f"specfold {command}: error: {message} (see specfold {command} --help)"


@needs_tiny
@pytest.mark.parametrize("command", list(PARALLEL_COMMANDS))
def test_parallel_flags_reach_the_model_of_every_command(capsys, command, tmp_path):
    """Sizes the tiny model cannot split are refused by `LLM` itself, so each command passed them on;
    one line before any rank starts (a command that dropped them would decode, or serve, instead)."""
    argv = [command, "--model", "tiny", *PARALLEL_COMMANDS[command], "--threads", "1"]
    if command == "serve":
        argv += ["--host", "256.0.0.1"]  # were the flags dropped, the server would fail to bind, not hang
    if command in ("eval", "bench"):
        argv += ["--no-progress", "--warmup", "0", "--out", str(tmp_path / "records.jsonl")]
    rc, err = run(capsys, *argv, "-tp", "3")
    assert rc == 2 and err == ("error: tensor_parallel_size=3 does not divide num_attention_heads=4, "
                               "num_key_value_heads=2, intermediate_size=512 of this checkpoint; sizes that divide "
                               "every sharded dimension: 1, 2")
    rc, err = run(capsys, *argv, "--tensor-parallel-size", "2", "--enable-expert-parallel")
    assert rc == 2 and err == "error: enable_expert_parallel needs a mixture-of-experts checkpoint; this one has no experts"
    assert not (tmp_path / "records.jsonl").exists()


def test_ray_executor_backend_without_the_ray_extra_is_one_line(capsys, monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    rc, err = run(capsys, "generate", "--prompt", "hi", "-tp", "2", "--distributed-executor-backend", "ray")
    assert rc == 2 and err == ("error: --distributed-executor-backend ray needs the 'ray' extra (missing module "
                               "'ray'): pip install 'specfold[ray]'")
