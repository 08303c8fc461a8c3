"""Registry and loaders: names, record counts of the real files, limits, clear data errors."""
from __future__ import annotations

import json

import pytest

from specfold.eval.tasks import TASKS, DataError, get_task


def test_every_registered_task_has_its_name():
    for name in TASKS:
        assert get_task(name).name == name


def test_unknown_task_lists_supported_names():
    with pytest.raises(ValueError, match="gsm8k.*humaneval.*mbpp"):
        get_task("nope")


@pytest.mark.parametrize("name,count", [("gsm8k", 1319), ("math500", 500),
                                        pytest.param("mbpp", 257, marks=pytest.mark.sandbox),
                                        pytest.param("mbpp_full", 500, marks=pytest.mark.sandbox),
                                        ("ifeval", 541)])
def test_real_files_load_with_expected_counts(data_dir, name, count):
    samples = get_task(name).load(str(data_dir))
    assert len(samples) == count
    assert len({s.id for s in samples}) == count
    assert all(s.prompt.strip() for s in samples)


def test_sanitized_file_has_427_records_of_which_257_test(data_dir):
    recs = json.loads((data_dir / "mbpp" / "sanitized-mbpp.json").read_text())
    assert len(recs) == 427
    assert sum(11 <= r["task_id"] <= 510 for r in recs) == 257


@pytest.mark.sandbox
def test_humaneval_from_installed_package():
    samples = get_task("humaneval").load(None)
    assert len(samples) == 164 and samples[0].id == "HumanEval/0"


def test_limit_and_file_path(data_dir):
    s = get_task("gsm8k").load(str(data_dir / "gsm8k" / "test.jsonl"), limit=3)
    assert [x.id for x in s] == ["gsm8k/0", "gsm8k/1", "gsm8k/2"]
    assert s[0].reference["answer"] == "18"


def test_missing_data_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        get_task("gsm8k").load(str(tmp_path / "missing"))
    with pytest.raises(DataError, match="gsm8k/test.jsonl"):
        get_task("gsm8k").load(str(tmp_path))


def test_no_data_without_datasets_asks_for_data(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *a, **k):
        if name == "datasets":
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(DataError, match="--data"):
        get_task("math500").load(None)


def test_tiny_task_loads_any_question_answer_jsonl(tmp_path):
    p = tmp_path / "heldout.jsonl"
    p.write_text('{"question": "What is 2+3?", "answer": "2+3=5\\n#### 5"}\n'
                 '{"question": "What is 7-9?", "answer": "#### -2"}\n')
    task = get_task("tiny")
    s = task.load(str(p))
    assert [x.prompt for x in s] == ["What is 2+3?", "What is 7-9?"]
    assert task.score(s[0], "#### 5")["correct"] and not task.score(s[0], "#### 6")["correct"]
    assert task.score(s[1], "so -2")["correct"]
    assert task.aggregate([task.score(s[0], "5"), task.score(s[1], "2")]) == {"accuracy": 0.5}


@pytest.mark.sandbox
def test_humaneval_falls_back_to_the_package_when_the_data_folder_lacks_it(tmp_path):
    (tmp_path / "gsm8k").mkdir()  # a data folder with other tasks only
    samples = get_task("humaneval").load(str(tmp_path))
    assert len(samples) == 164 and samples[0].id == "HumanEval/0"
    own = tmp_path / "HumanEval.jsonl"  # a folder that has it: its own copy wins
    own.write_text('{"task_id": "X/0", "prompt": "def f():\\n", "test": "", "entry_point": "f"}\n')
    assert [s.id for s in get_task("humaneval").load(str(tmp_path))] == ["X/0"]
