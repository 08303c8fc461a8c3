"""The Bayes-optimal oracle decoder of the tiny task: exact posteriors, and the failure it exposes."""
import random

import numpy as np
import pytest

from specfold.models.tokenizer import Tokenizer
from specfold.tiny import choices as C

from specfold.tiny import oracle as O
from specfold.tiny import tokenizer as T


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("tok")
    T.save_tokenizer(T.train_tokenizer(T.corpus([C.make_problem(rng) for _ in range(2000)])), path)
    return Tokenizer.load(path)


def test_parallel_unmasking_of_individually_likely_tokens_can_break():
    """Three answers, each position's majority shared by two of them: at threshold 0.5 all three
    majorities are unmasked together, a combination no answer has; static never does that."""
    pad = 0
    S = np.array([[5, 5, 6, 2], [5, 6, 5, 2], [6, 5, 5, 2]])
    S = np.concatenate([S, np.full((3, 28), pad)], axis=1)
    w = np.ones(3) / 3
    stops = frozenset({2, pad})
    assert O.oracle_decode(S, w, 0, "threshold", 0.5, N=4, stops=stops)["broken"]
    for rule, thr in (("static", 0.9), ("threshold", 0.7), ("sub_block", 0.9)):
        o = O.oracle_decode(S, w, 0, rule, thr, N=4, sub=2, stops=stops)
        assert not o["broken"] and any(o["tokens"] == row[:3].tolist() for row in S)


def test_oracle_static_decodes_a_generator_answer(tok):
    """With static decoding the oracle always writes one of the generator's answers (right), and a
    threshold rule unmasks more than one token per forward."""
    held = C.heldout(0, 8)
    im_end, pad = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    for p in held:
        S, w = O.answer_matrix(p["facts"], tok.encode, im_end, pad)
        plen = len(tok.encode(tok.apply_chat_template([{"role": "user", "content": p["question"]}])))
        o = O.oracle_decode(S, w, plen, "static", stops=frozenset({im_end, pad}))
        assert not o["broken"] and tok.decode(o["tokens"]) in C.enumerate_answers(p["facts"])
    res = O.curve(held, tok, {"static": {"rule": "static"},
                              "t9": {"rule": "threshold", "threshold": 0.9}})
    assert res["static"]["accuracy"] == 1.0 and res["static"]["tokens_per_forward"] <= 1.0
    assert res["t9"]["tokens_per_forward"] > 1.5
