"""GSM8K final-number extraction and scoring."""
from __future__ import annotations

from fractions import Fraction

import pytest

from specfold.eval.numeric import extract_number
from specfold.eval.tasks import get_task
from specfold.eval.tasks.base import Sample


@pytest.mark.parametrize("text,value", [
    ("so she makes 9*2 = 18 dollars.\n#### 18", 18),
    ("#### 1,000", 1000),
    ("The answer is $1,234.50.", Fraction("1234.5")),
    ("first 3 then 4 then 5", 5),
    ("#### 42\nextra text 7", 42),
    ("#### -3", -3),
    ("loss of \u22127", -7),
    ("It took 10.0 hours.", 10),
    ("#### $70,000", 70000),
])
def test_extraction(text, value):
    assert extract_number(text) == value


def test_no_number():
    assert extract_number("no digits here") is None


def test_score_right_and_wrong():
    task = get_task("gsm8k")
    s = Sample("x", "q", {"answer": "18", "solution": "16-3-4=9\n9*2=18\n#### 18"})
    assert task.score(s, "She earns 9 * 2 = 18.\n#### 18")["correct"]
    assert task.score(s, "The answer is 18.00")["correct"]
    assert not task.score(s, "#### 17")["correct"]
    assert task.score(s, "#### 18 dollars, not 20")["correct"]  # first number on the #### line
    assert not task.score(s, "I do not know")["correct"]


def test_reference_solutions_score_correct(data_dir):
    task = get_task("gsm8k")
    samples = task.load(str(data_dir))
    assert all(task.score(s, s.reference["solution"])["correct"] for s in samples)
    assert sum(task.score(s, "#### 0")["correct"] for s in samples) < 5
