"""The `choices` task (specfold.tiny.choices): checkable answers with real choice points."""
import random

from specfold.tiny import choices as C
from specfold.tiny import data as D


def test_problems_are_well_formed():
    """Every sampled answer's equations are right, each step reads the running total, and the
    `####` line holds the true result, which `final_answer` parses."""
    rng = random.Random(0)
    for _ in range(500):
        p = C.make_problem(rng)
        f = p["facts"]
        body, final = p["answer"].split("\n#### ")
        eqs = D.equations(body)
        assert 2 <= len(eqs) <= 2 and D.well_formed(p["answer"])
        for x, op, y, z in eqs:
            assert (x + y if op == "+" else x - y) == z and 0 <= z <= C.MAX_VALUE
        assert final == str(C.result(f)) == D.final_answer(p["answer"]) == str(eqs[-1][3])
        assert f["name"] in p["question"] and f["obj"] in p["question"]
        assert all(f"{verb} {n}" in p["question"] for _, n, verb in f["changes"])


def test_enumeration_is_the_generators_distribution():
    """`enumerate_answers` lists every answer the sampler writes, probabilities summing to 1, and
    every enumerated answer is right; a sampled answer's frequency matches its probability."""
    rng = random.Random(1)
    for _ in range(20):
        f = C.sample_facts(rng)
        answers = C.enumerate_answers(f)
        assert abs(sum(answers.values()) - 1.0) < 1e-9
        assert all(D.final_answer(t) == str(C.result(f)) and D.well_formed(t) for t in answers)
        drawn = [C.answer_program(f, C.Sampler(rng)) for _ in range(300)]
        assert set(drawn) <= set(answers)
    f = {"name": "Mia", "pron": "she", "obj": "shells", "start": 7,
         "changes": [["+", 5, "finds"], ["-", 3, "sells"]]}
    answers = C.enumerate_answers(f)
    top = max(answers, key=answers.get)
    drawn = [C.answer_program(f, C.Sampler(random.Random(i))) for i in range(4000)]
    assert abs(drawn.count(top) / 4000 - answers[top]) < 0.02


def test_choice_points_exist():
    """The answer has real choice points: the strategy (story order, reverse order, net change
    first) decides the intermediate numbers; openings, step phrasings and closings vary."""
    f = {"name": "Mia", "pron": "she", "obj": "shells", "start": 7,
         "changes": [["+", 5, "finds"], ["-", 3, "sells"]]}
    answers = C.enumerate_answers(f)
    assert len(answers) >= 100 and max(answers.values()) < 0.2
    firsts = {D.equations(t)[0] for t in answers}
    assert {(7, "+", 5, 12), (7, "-", 3, 4), (5, "-", 3, 2)} <= firsts  # story, reverse, net
    assert any(t.startswith("Mia has 7 shells.") for t in answers)
    assert any(t.startswith("At first she has 7 shells.") for t in answers)
    assert any("She sells 3 shells:" in t for t in answers)
    assert any(" 12-3=9." in t and "sells" not in t for t in answers)  # amounts not always restated
    assert any("So Mia has 9 shells now." in t for t in answers) and any(".\n#### 9" in t and
                                                                         "Mia has 9" not in t for t in answers)
    # names, objects and question phrasings come from pools, so none sits at a fixed position
    rng = random.Random(2)
    qs = [C.make_problem(rng)["question"] for _ in range(3000)]
    assert len({q.split(" ")[0] for q in qs}) == len(C.NAMES) >= 40 and len(C.OBJECTS) >= 30
    assert len({q.split(".")[0].split(" ")[1] for q in qs}) >= 2


def test_choices_heldout_disjoint_from_training_and_seeded():
    held = C.heldout(0)
    qs = {p["question"] for p in held}
    assert len(held) == len(qs) == D.HELDOUT_SIZE and C.heldout(0, 30) == held[:30]
    stream = C.train_stream(0, qs)
    assert not {next(stream)["question"] for _ in range(20000)} & qs
    # the filter does real work: excluding the unfiltered stream's own first questions removes them
    raw = random.Random("train-0")
    first = {C.make_problem(raw)["question"] for _ in range(50)}
    filtered = C.train_stream(0, first)
    assert not {next(filtered)["question"] for _ in range(200)} & first
    # and the stream resumes from its saved state
    s1 = C.train_stream(0, qs)
    [next(s1) for _ in range(7)]
    st = s1.state()
    ahead = [next(s1) for _ in range(5)]
    s2 = C.train_stream(0, qs)
    s2.set_state(st)
    assert [next(s2) for _ in range(5)] == ahead


def test_well_formed_checks_the_arithmetic():
    assert D.well_formed("Mia has 7 shells. 7+5=12. 12-3=9.\n#### 9")
    assert not D.well_formed("Mia has 7 shells. 7+5=13. 13-3=10.\n#### 10")
    assert not D.well_formed("7+5=12. 12-3=9.")
