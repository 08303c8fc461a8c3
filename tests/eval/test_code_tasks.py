"""HumanEval and MBPP pass@1 through the sandbox (a sample of each; all with SPECFOLD_EVAL_FULL=1)."""
from __future__ import annotations

import os

import pytest

from specfold.eval.tasks import get_task

pytestmark = pytest.mark.sandbox

FULL = os.environ.get("SPECFOLD_EVAL_FULL") == "1"
# Reference solutions that need several seconds of CPU (mbpp/123 sums amicable numbers below
# 9999, ~5 s unloaded): they can exceed the 10 s limit on a loaded CI runner, so the sampled
# test leaves them out; SPECFOLD_EVAL_FULL=1 runs everything.
SLOW = {"mbpp/123"}


def every(items, k):
    return items if FULL else items[::k]


@pytest.fixture(scope="module")
def humaneval():
    task = get_task("humaneval")
    return task, task.load(None)


def test_canonical_humaneval_solutions_pass(humaneval):
    task, samples = humaneval
    failed = [s.id for s in every(samples, 5) if not task.score(s, s.reference["canonical_solution"])["correct"]]
    assert failed == []


def test_full_function_in_a_fence_passes(humaneval):
    task, samples = humaneval
    for s in samples[:3]:
        ref = s.reference
        completion = f"Sure!\n```python\n{ref['prompt']}{ref['canonical_solution']}```\nHope it helps."
        assert task.score(s, completion)["correct"], s.id


def test_wrong_humaneval_solutions_fail(humaneval):
    task, samples = humaneval
    s = samples[0]  # has_close_elements
    wrong = f"```python\ndef {s.reference['entry_point']}(numbers, threshold):\n    return False\n```"
    r = task.score(s, wrong)
    assert not r["correct"] and r["status"] == "wrong"  # returned, but the harness found a wrong value
    assert r["error"].startswith("failed: assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True (got False)")
    assert not task.score(s, "I cannot solve this.")["correct"]
    assert not task.score(s, "")["correct"]


def test_looping_completion_times_out(humaneval):
    from specfold.eval.sandbox import Limits
    from specfold.eval.tasks.humaneval import HumanEval

    task, samples = HumanEval(Limits(timeout_s=1.0)), humaneval[1]
    r = task.score(samples[0], "    while True:\n        pass\n")
    assert not r["correct"] and r["status"] == "timeout"


@pytest.mark.parametrize("name,step", [("mbpp", 8), ("mbpp_full", 16)])
def test_mbpp_reference_solutions_pass(data_dir, name, step):
    task = get_task(name)
    samples = task.load(str(data_dir))
    failed = [s.id for s in every(samples, step) if (FULL or s.id not in SLOW)
              and not task.score(s, f"```python\n{s.reference['code']}\n```")["correct"]]
    assert failed == []


def test_mbpp_wrong_solution_fails(data_dir):
    task = get_task("mbpp")
    s = task.load(str(data_dir), limit=1)[0]
    wrong = f"```python\ndef {s.reference['entry_point']}(*args):\n    return None\n```"
    assert s.reference["entry_point"] == "remove_Occ"
    assert not task.score(s, wrong)["correct"]
