"""Data generator and tokenizer of the tiny model."""
import random
from pathlib import Path

import pytest

from specfold.models.tokenizer import Tokenizer
from specfold.tiny import data as D
from specfold.tiny import tokenizer as T

MODEL_DIR = Path(D.__file__).resolve().parent / "model"


def _value(f, order):
    v = f["start"]
    for op, n, _ in order:
        v = v + n if op == "+" else v - n
    return v


def test_problems_are_well_formed():
    """Every sampled answer's equations are right, each step reads the running total, and the
    `####` line holds the true result, which `final_answer` parses."""
    rng = random.Random(0)
    for _ in range(500):
        p = D.make_problem(rng)
        f = p["facts"]
        body, final = p["answer"].split("\n#### ")
        eqs = D.equations(body)
        assert 2 <= len(eqs) <= 2 and D.well_formed(p["answer"])
        for x, op, y, z in eqs:
            assert (x + y if op == "+" else x - y) == z and 0 <= z <= D.MAX_VALUE
        assert final == str(D.result(f)) == D.final_answer(p["answer"]) == str(eqs[-1][3])
        assert f["name"] in p["question"] and f["obj"] in p["question"]
        assert all(f"{verb} {n}" in p["question"] for _, n, verb in f["changes"])


def test_enumeration_is_the_generators_distribution():
    """`enumerate_answers` lists every answer the sampler writes, probabilities summing to 1, and
    every enumerated answer is right; a sampled answer's frequency matches its probability."""
    rng = random.Random(1)
    for _ in range(20):
        f = D.sample_facts(rng)
        answers = D.enumerate_answers(f)
        assert abs(sum(answers.values()) - 1.0) < 1e-9
        assert all(D.final_answer(t) == str(D.result(f)) and D.well_formed(t) for t in answers)
        drawn = [D.answer_program(f, D.Sampler(rng)) for _ in range(300)]
        assert set(drawn) <= set(answers)
    f = {"name": "Mia", "pron": "she", "obj": "shells", "start": 7,
         "changes": [["+", 5, "finds"], ["-", 3, "sells"]]}
    answers = D.enumerate_answers(f)
    top = max(answers, key=answers.get)
    drawn = [D.answer_program(f, D.Sampler(random.Random(i))) for i in range(4000)]
    assert abs(drawn.count(top) / 4000 - answers[top]) < 0.02


def test_choice_points_exist():
    """The answer has real choice points: the strategy (story order, reverse order, net change
    first) decides the intermediate numbers; openings, step phrasings and closings vary."""
    f = {"name": "Mia", "pron": "she", "obj": "shells", "start": 7,
         "changes": [["+", 5, "finds"], ["-", 3, "sells"]]}
    answers = D.enumerate_answers(f)
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
    qs = [D.make_problem(rng)["question"] for _ in range(3000)]
    assert len({q.split(" ")[0] for q in qs}) == len(D.NAMES) >= 40 and len(D.OBJECTS) >= 30
    assert len({q.split(".")[0].split(" ")[1] for q in qs}) >= 2


def test_generator_is_seeded():
    assert D.heldout(3, 50) == D.heldout(3, 50)
    assert D.heldout(3, 50) != D.heldout(4, 50)


def test_heldout_disjoint_from_training():
    held = D.heldout(0)
    assert len(held) >= 500
    qs = {p["question"] for p in held}
    assert len(qs) == len(held)
    stream = D.TrainStream(0, qs)
    train_qs = {next(stream)["question"] for _ in range(20000)}
    assert not train_qs & qs
    # the exclusion is doing real work: an unfiltered stream from the same seed does hit held-out text
    raw = random.Random("train-0")
    raw_qs = {D.make_problem(raw)["question"] for _ in range(20000)}
    assert len(raw_qs) > 15000


@pytest.mark.skipif(not (MODEL_DIR / "heldout.jsonl").is_file(), reason="no shipped model yet")
def test_shipped_heldout_is_seed0_heldout():
    assert D.load_jsonl(MODEL_DIR / "heldout.jsonl") == D.heldout(0)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("tok")
    T.save_tokenizer(T.train_tokenizer(T.corpus([D.make_problem(rng) for _ in range(2000)])), path)
    return Tokenizer.load(path)


def test_tokenizer_round_trip_and_specials(tok):
    rng = random.Random(1)
    for _ in range(50):
        p = D.make_problem(rng)
        for text in (p["question"], p["answer"], "Odd text: 12,345 & émoji ✓\n\ttabs"):
            assert tok.decode(tok.encode(text)) == text
    ids = {s: tok.token_to_id(s) for s in T.SPECIALS}
    assert all(i is not None for i in ids.values())
    assert tok.encode("<|mask|>") == [ids["<|mask|>"]]
    assert tok.eos_token == "<|im_end|>"


def test_digits_are_one_token_each(tok):
    for text in ("1234567890", "7+15=22", " 305 apples", "#### 19"):
        pieces = [tok.decode([i]) for i in tok.encode(text)]
        digits = [p for p in pieces if any(c.isdigit() for c in p)]
        assert all(len(p) == 1 for p in digits), pieces
        assert sum(c.isdigit() for c in text) == len(digits)


def test_chat_template(tok):
    s = tok.apply_chat_template([{"role": "user", "content": "Hi 12"}])
    assert s == "<|im_start|>user\nHi 12<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(tok.encode(s), skip_special_tokens=False) == s
