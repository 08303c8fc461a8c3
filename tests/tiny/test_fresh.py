"""Fresh problems (specfold.tiny.fresh, task tiny_fresh): deterministic, distinct, and disjoint by
question text from every split the shipped model and its graphs were made from, replayed here the way
train.py and tiny/graphs.py draw them (not through `excluded()`)."""
from __future__ import annotations

import multiprocessing
import random
from concurrent.futures import ProcessPoolExecutor

import pytest

from specfold.eval.tasks import get_task
from specfold.tiny import choices as C
from specfold.tiny import data as D
from specfold.tiny import fresh as F


def _splits_as_drawn() -> dict[str, set[str]]:
    """The questions of each split, drawn as their makers draw them (seed 0, the shipped schedule)."""
    held = {r["question"] for r in D.load_jsonl(F.HELDOUT)}
    train = D.TrainStream(0, held, C.make_problem)  # train.py: one stream over all 6400 x 32 draws
    tok_rng, tok = random.Random("tokenizer-0"), []
    while len(tok) < 20000:  # train._tokenizer: a list of 20,000 non-held-out problems
        p = C.make_problem(tok_rng)
        if p["question"] not in held:
            tok.append(p["question"])
    cal_rng, cal = random.Random("spiffy-calibration"), []
    while len(cal) < 50:  # graphs.tiny_defaults(n=50)
        q = C.make_problem(cal_rng)["question"]
        if q not in held:
            cal.append(q)
    return {"held-out": held, "training": {next(train)["question"] for _ in range(6400 * 32)},
            "tokenizer": set(tok), "calibration": set(cal)}


@pytest.mark.slow
def test_fresh_problems_are_disjoint_from_every_split_and_deterministic():
    # The replay and `excluded()` (built by the first `fresh`) are independent pure-Python draws of
    # ~20 s each: the replay runs in a fresh interpreter (spawn: no state shared with this process)
    # on another core meanwhile, the same computation as in this process.
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        drawn = pool.submit(_splits_as_drawn)
        problems = F.fresh(0, 300)
        splits = drawn.result()
    qs = [p["question"] for p in problems]
    assert len(set(qs)) == 300
    assert len(splits["held-out"]) == 500 and len(splits["training"]) > 204000
    for name, split in splits.items():
        assert not split & set(qs), name
        assert split <= F.excluded(), name
    assert F.fresh(0, 300) == problems and F.fresh(0, 40) == problems[:40]
    assert F.fresh(1, 40) != problems[:40]
    assert all(D.final_answer(p["answer"]) == str(C.result(p["facts"])) for p in problems)


def test_the_filter_drops_excluded_and_repeated_questions(monkeypatch):
    rng = random.Random("fresh-0")
    raw = [C.make_problem(rng)["question"] for _ in range(10)]
    monkeypatch.setattr(F, "excluded", lambda: frozenset(raw[:5]))
    got = [p["question"] for p in F.fresh(0, 10)]
    assert not set(got) & set(raw[:5]) and got[:5] == [q for q in raw[5:] if q not in raw[:5]][:5]


@pytest.mark.slow
def test_tiny_fresh_task_and_the_file_writer_agree(tmp_path):
    samples = get_task("tiny-fresh").load(limit=25)
    assert [s.id for s in samples] == [f"tiny_fresh/{i}" for i in range(25)]
    assert [s.prompt for s in samples] == [p["question"] for p in F.fresh(0, 25)]
    assert len(get_task("tiny_fresh").load(None)) == 200
    out = tmp_path / "fresh.jsonl"
    assert F.main(["--seed", "0", "--n", "25", "--out", str(out)]) == 0
    from_file = get_task("tiny").load(str(out))
    assert [s.prompt for s in from_file] == [s.prompt for s in samples]
    assert [s.reference for s in from_file] == [s.reference for s in samples]
