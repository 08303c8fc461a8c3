"""Ray Data batch inference: `specfold eval --ray` against the local run, and the Python processor
against `LLM.generate`. One local Ray cluster per test process (tests/ray_helpers.py).

References are independent of Ray: the same eval without `--ray` (one engine in this process, one
sample at a time) and `LLM.generate` on each row. Only timing fields may differ.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("sympy")  # the eval extra

from tests.ray_helpers import needs_ray, ray_cluster  # noqa: E402

pytestmark = [pytest.mark.ray, needs_ray]

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = [json.loads(line)["question"]
             for line in (ROOT / "specfold/tiny/model/heldout.jsonl").read_text().splitlines()[:6]]


def untimed(rec: dict) -> dict:
    """A record without its timing fields (wall-clock seconds and what is derived from them)."""
    rec = {k: v for k, v in rec.items() if k not in ("seconds", "tokens_per_second") and not k.endswith("_seconds")}
    rec["extra"] = {k: v for k, v in rec["extra"].items() if not k.endswith("_seconds")}
    return rec


def test_eval_ray_writes_the_records_and_scores_of_the_local_run(tmp_path, capsys):
    ray_cluster()
    from specfold.cli import main
    # prefix caching off: with it, a record's forward counts depend on which requests shared an engine
    base = ["eval", "--model", "tiny", "--tasks", "tiny", "--limit", "16", "--no-progress", "--no-enable-prefix-caching"]
    assert main(base + ["--ray", "--replicas", "2", "--out", str(tmp_path / "ray.jsonl")]) == 0
    on_ray = capsys.readouterr().out
    assert main(base + ["--out", str(tmp_path / "local.jsonl")]) == 0
    local = capsys.readouterr().out

    def records(name):
        return [json.loads(line) for line in (tmp_path / name).read_text().splitlines()]
    got, want = records("ray.jsonl"), records("local.jsonl")
    assert len(want) == 16 and [untimed(r) for r in got] == [untimed(r) for r in want]
    assert any(r["correct"] for r in want) and len({r["output"] for r in want}) > 1
    score = on_ray.split("|")[0]  # "tiny [vanilla]: accuracy A (n=16)" (speed follows the bar)
    assert score == local.split("|")[0] and "(n=16)" in score


def test_bench_ray_compares_methods_like_the_local_run(tmp_path, capsys):
    """Two methods (vanilla the reference, spiffy compared with it) in one dataset, mixed in batches.
    A fixed draft budget: with "auto" the drafts (so the forward counts in a record, not the tokens)
    follow the measured step times of each machine."""
    ray_cluster()
    from specfold.cli import main
    base = ["bench", "--model", "tiny", "--tasks", "tiny", "--limit", "4", "--methods", "vanilla,spiffy",
            "--no-progress", "--warmup", "0", "--draft-budget", "7"]
    assert main(base + ["--ray", "--replicas", "2", "--ray-batch-size", "3", "--out", str(tmp_path / "r.jsonl")]) == 0
    assert main(base + ["--out", str(tmp_path / "l.jsonl")]) == 0
    capsys.readouterr()
    got, want = ([json.loads(line) for line in (tmp_path / n).read_text().splitlines()] for n in ("r.jsonl", "l.jsonl"))
    assert len(want) == 8 and [untimed(r) for r in got] == [untimed(r) for r in want]
    assert {r["method"] for r in want} == {"vanilla", "spiffy"} and all(r["exact"] for r in want if r["method"] == "spiffy")


def test_processor_rows_equal_llm_generate():
    ray_cluster()
    import ray

    from specfold import LLM
    from specfold.params import SamplingParams
    from specfold.ray import SpecfoldProcessorConfig, build_processor
    llm = LLM("tiny")
    tok = llm.tokenizer
    rows = [{"i": i, "q": q, "ids": tok.encode(q)} for i, q in enumerate(QUESTIONS)]

    def sampling(i):
        return {"max_new_tokens": 24, "temperature": 0.8 if i % 2 else 0.0, "seed": 100 + i}

    def pre(row):  # three prompt kinds: text (chat template), chat messages, token ids
        i = row["i"]
        return {"i": i, "prompt": row["q"] if i % 3 == 0 else None,
                "messages": [{"role": "user", "content": row["q"]}] if i % 3 == 1 else None,
                "prompt_token_ids": row["ids"] if i % 3 == 2 else None, "sampling_params": sampling(i)}

    processor = build_processor(SpecfoldProcessorConfig(model_source="tiny", concurrency=2, batch_size=2),
                                preprocess=pre,
                                postprocess=lambda r: {"i": r["i"], "text": r["generated_text"],
                                                       "tokens": list(r["generated_tokens"]),
                                                       "reason": r["finish_reason"], "n": r["num_generated_tokens"]})
    out = sorted(processor(ray.data.from_items(rows)).take_all(), key=lambda r: r["i"])
    assert [r["i"] for r in out] == list(range(len(rows)))
    for r, row in zip(out, rows):
        i = row["i"]
        prompt = (row["q"] if i % 3 == 0 else
                  tok.encode(tok.apply_chat_template([{"role": "user", "content": row["q"]}])) if i % 3 == 1
                  else row["ids"])
        want = llm.generate([prompt], SamplingParams(**sampling(i), chat_template=i % 3 == 0))[0]
        assert (r["text"], r["tokens"], r["reason"], r["n"]) == (want.text, want.token_ids, want.finish_reason,
                                                                  len(want.token_ids)), i
