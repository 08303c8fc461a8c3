"""The pure LLaDA2 rules (specfold/decoding/rules_llada2.py) on hand-made blocks: each case is one
sentence of the official semantics (docs/LLADA2.md). The end-to-end check is test_llada2_decode.py."""
from __future__ import annotations

from specfold.decoding import rules_llada2 as R

M = 99  # mask id in these blocks


def test_schedule_and_step_cap():
    assert R.schedule(32, 32) == [1] * 32
    assert R.schedule(32, 5) == [7, 7, 6, 6, 6]  # block // steps, +1 for the first block % steps
    assert R.schedule(4, 6) == [1, 1, 1, 1, 0, 0]  # trailing zeros when steps > block
    assert sum(R.schedule(32, 7)) == 32
    assert R.steps_for(32, 20) == 20 and R.steps_for(32, 100) == 32 and R.steps_for(8, 9, minimal_topk=2) == 4


def test_llada2_threshold_is_strict_and_fallback_is_topk():
    masked = [True] * 5
    prob = [0.95, 0.99, 0.2, 0.96, 0.5]
    assert R.llada2_select(masked, prob, 2, 0.95) == [1, 3]  # 0.95 itself does not pass
    assert R.llada2_select(masked, prob, 3, 0.95) == [0, 1, 3]  # top-3, not the 2 passing + 3 more
    assert R.llada2_select(masked, prob, 0, 0.999) == []  # a zero quota commits only passing ones
    assert R.llada2_select(masked, prob, 1, 0.0) == [0, 1, 2, 3, 4]  # threshold 0 passes every mask
    assert R.llada2_select([False, True, True, False], [0.9, 0.3, 0.3, 0.9], 1, 0.95) == [1]  # tie: lower


def test_llada2_step_writes_argmax_and_ends_the_block():
    masked = [False, True, True, True]
    top, prob = [5, 6, 7, 8], [0.99, 0.97, 0.1, 0.96]
    st = R.llada2_step(masked, top, prob, 0, 2, 0.95)  # quota 2: the two passing masks
    assert st.writes == ((1, 6), (3, 8)) and not st.done
    last = R.llada2_step([False, False, True, False], top, [0.1] * 4, 1, 2, 0.95)
    assert last.writes == ((2, 7),) and last.done


def test_edit_rule_commit_edit_and_done():
    tokens = [10, 11, M, M, 14, 15]
    masked = [t == M for t in tokens]
    frozen = [True, False, False, False, False, False]  # position 0 is prompt
    top = [20, 21, 22, 23, 14, 25]
    prob = [0.99, 0.6, 0.3, 0.4, 0.99, 0.5]
    commit, edit = R.edit_select(tokens, masked, frozen, top, prob, 0.7, 0.55)
    assert commit == [3]  # no mask passes 0.7: the most probable one
    assert edit == [1]  # prompt never edited, unchanged argmax not an edit, 0.5 does not pass 0.55
    st = R.llada2_edit_step(tokens, masked, frozen, top, prob, 0.35, 0.0)
    assert st.writes == ((1, 21), (3, 23), (5, 25)) and st.edits == 2 and not st.done
    full = [10, 21, 22, 23, 14, 25]
    post = R.llada2_edit_step(full, [False] * 6, frozen, full, [0.9] * 6, 0.7, 0.5)
    assert post.writes == () and post.done  # no mask and no edit ends the block
    again = R.llada2_edit_step(full, [False] * 6, frozen, [10, 21, 22, 9, 14, 25], [0.9] * 6, 0.7, 0.5)
    assert again.writes == ((3, 9),) and not again.done


def test_post_step_limit_is_checked_before_the_forward():
    assert R.edit_wants_forward(True, 99, 0)
    assert R.edit_wants_forward(False, 0, 1) and not R.edit_wants_forward(False, 1, 1)
    assert not R.edit_wants_forward(False, 0, 0)


def test_settled_stop():
    assert R.settled_stop([3, 4, 7, 5], M, [7]) == 2
    assert R.settled_stop([3, M, 7, 5], M, [7]) is None  # a mask before the eos: not settled
    assert R.settled_stop([3, 4, 5, M], M, [7]) is None
