"""Unmask rules on hand-made scores: ties, clamping, strictness, sub-block order, schedules."""
from __future__ import annotations

import torch

from specfold import DecodeParams
from specfold.decoding.readout import score
from specfold.decoding.rules import Scored, make_rule

M = 9  # mask id in these tests


def scored(conf, tokens=None, positions=None):
    n = len(conf)
    return Scored(list(range(n)) if positions is None else list(positions),
                  [100 + i for i in range(n)] if tokens is None else list(tokens), [float(c) for c in conf])


def params(**kw):
    base = dict(block_size=8, sub_block_size=4, tokens_per_step=1, threshold=0.5, threshold_ge=False,
                confidence="max_prob", steps=4)
    base.update(kw)
    return DecodeParams(**base)


def chosen(rule, s, step=0, n0=8):
    return sorted(s.positions[i] for i in rule.select(s, step, n0))


def test_static_ties_go_to_lower_position():
    r = make_rule(params(rule="static", tokens_per_step=2))
    assert chosen(r, scored([0.3, 0.7, 0.7, 0.7])) == [1, 2]


def test_static_clamps_to_remaining_masks():
    r = make_rule(params(rule="static", tokens_per_step=4))
    assert chosen(r, scored([0.1, 0.2])) == [0, 1]


def test_threshold_strict_and_ge():
    s = scored([0.5, 0.6, 0.2, 0.5])
    assert chosen(make_rule(params(rule="threshold")), s) == [1]
    assert chosen(make_rule(params(rule="threshold", threshold_ge=True)), s) == [0, 1, 3]


def test_threshold_always_unmasks_the_most_confident():
    assert chosen(make_rule(params(rule="threshold", threshold=0.9)), scored([0.1, 0.3, 0.3])) == [1]


def test_sub_block_region_is_first_sub_block_with_masks():
    r = make_rule(params(rule="sub_block"))
    def on(flags):
        return [i for i, f in enumerate(flags) if f]
    masked = [False] * 4 + [False, True, False, True]
    assert on(r.region(masked, 0)) == [5, 7]
    masked = [False, False, True, False] + [True] * 4
    assert on(r.region(masked, 0)) == [2]
    # region follows the block origin (bidirectional canvases start blocks anywhere)
    masked = [False] * 3 + [True] * 9
    assert on(r.region(masked, 3)) == [3, 4, 5, 6]


def test_dynamic_falls_back_to_static():
    r = make_rule(params(rule="dynamic", tokens_per_step=2))
    assert chosen(r, scored([0.9, 0.8, 0.1])) == [0, 1]
    assert chosen(r, scored([0.9, 0.2, 0.3])) == [0, 2]


def test_llada_schedule_counts():
    r = make_rule(params(rule="llada", steps=4))
    s = scored([0.1 * i for i in range(10)])
    # 10 masks over 4 steps: 3, 3, 2, then everything left at the last step
    assert [len(chosen(r, s, step, 10)) for step in range(3)] == [3, 3, 2]
    assert len(chosen(r, scored([0.1, 0.2]), 3, 10)) == 2


def test_dream_schedule_may_unmask_nothing():
    r = make_rule(params(rule="dream", steps=10))
    t = torch.linspace(1, 1e-3, 11, dtype=torch.float32)
    n = 3
    expect = int(n * (1 - t[1] / t[0]))
    assert len(chosen(r, scored([0.3, 0.2, 0.1]), 0)) == expect == 0
    assert len(chosen(r, scored([0.3, 0.2, 0.1]), 9)) == 3


def test_score_never_produces_mask_token_and_kinds():
    logits = torch.tensor([[0.0, 1.0, 5.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 9.0]])
    s = score(logits, [0], M, "max_prob")
    assert s.tokens == [2]
    p = torch.softmax(logits[0, :9].double(), -1)
    assert abs(s.conf[0] - p.max().item()) < 1e-6
    m = score(logits, [0], M, "margin")
    top = p.topk(2).values
    assert abs(m.conf[0] - (top[0] - top[1]).item()) < 1e-6
    e = score(logits, [0], M, "neg_entropy")
    assert abs(e.conf[0] - (p * p.log()).sum().item()) < 1e-6
