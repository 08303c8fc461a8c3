"""Data generator and tokenizer of the tiny model."""
import random
from pathlib import Path

import pytest

from specfold.models.tokenizer import Tokenizer
from specfold.tiny import data as D
from specfold.tiny import tokenizer as T

MODEL_DIR = Path(D.__file__).resolve().parent / "model"


def test_problems_are_well_formed():
    rng = random.Random(0)
    for _ in range(500):
        p = D.make_problem(rng)
        body, final = p["answer"].split("\n#### ")
        steps = [s for s in body.split(" ") if "=" in s]
        assert len(steps) == 2
        prev = None
        for s in steps:
            expr, res = s.rstrip(".").split("=")
            assert eval(expr) == int(res) >= 0  # noqa: S307 - our own generated digits
            if prev is not None:
                assert expr.startswith(prev)
            prev = res
        assert final == prev == D.final_answer(p["answer"])


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
    """The shipped model's held-out set is the `choices` task's seed-0 set (its training task)."""
    from specfold.tiny import choices as C
    assert D.load_jsonl(MODEL_DIR / "heldout.jsonl") == C.heldout(0)


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
