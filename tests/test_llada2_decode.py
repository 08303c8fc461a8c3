"""The cache-free reference decoder (tests/llada2_reference.py: reference forward + the pure rules of
specfold/decoding/rules_llada2.py) against diffusers' LLaDA2Pipeline + BlockRefinementScheduler
driven by specfold's model (tests/llada2_diffusers.py), token for token, under both rules.

Where diffusers differs from the official `generate` (docs/LLADA2.md), the test maps its settings:
- LLaDA2.1 commits masks with a quota of 1 per step (prob > tau_mask, else the best one) and has
  no step limit while masks remain; diffusers reuses LLaDA2.0's schedule and step limit for it, and
  ends the block, post steps included, once num_inference_steps steps had masks. With
  num_inference_steps = block + 1 (and gen_length > block, else its step cap shrinks it) the quota
  is 1 for the first `block` steps, which fill any block, so neither the quota nor the limit ever
  bites; with its default (steps = block) a block whose masks take every one of the steps gets
  no post steps at all, where the official loop runs them;
- diffusers turns editing off for editing_threshold <= 0; the official tau_edit = 0.0 edits every
  changed token (prob > 0 always holds), which diffusers gives with a tiny positive threshold;
- diffusers checks its post-step limit after the forward (`post_steps > max_post_steps`), so it
  runs one post step more than the official loop, which checks before the forward: the official
  max_post_steps = M is diffusers' M - 1 (M >= 1);
- with eos_early_stop diffusers returns as soon as an eos is committed with no mask before it,
  also under LLaDA2.1, where a later step could still edit that eos or the tokens before it; the
  official 2.1 loop only stops after a block. So 2.1 runs with eos_early_stop=False here (every block
  decoded, the output cut at the first eos: the same tokens as stopping after the eos block);
- diffusers computes probabilities in float32: the test checks that every threshold and top-k
  decision of the reference is at least 1e-6 away from a flip;
- diffusers runs one more forward per LLaDA2.0 block (once the block is full) that changes nothing:
  forwards are not compared.
"""
from __future__ import annotations

import pytest
import torch

from tests import llada2_checkpoint as C
from tests.llada2_diffusers import diffusers_decode
from tests.llada2_reference import reference_decode

BLOCK = 8
FLIP = 1e-6


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from specfold.models.loader import load_model
    folder, cfg, w = C.make(tmp_path_factory.mktemp("llada2dec") / "ckpt", seed=0, head_scale=4.0, eos_boost=2.0)
    model, spec, _ = load_model(folder, torch.float64, "cpu", overrides=C.overrides(cfg))
    return cfg, w, model, spec


def _prompt(n: int, seed: int, cfg) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg["vocab_size"] - 2, (n,), generator=g).tolist()  # no mask, no eos


def _margin(trace: list, rule: str, threshold: float, edit_threshold: float, steps: int) -> float:
    from specfold.decoding.rules_llada2 import schedule
    worst = float("inf")
    for t in trace:
        masked, prob = t["masked"], t["prob"]
        cand = sorted((prob[i] for i, m in enumerate(masked) if m), reverse=True)
        worst = min([worst] + [abs(p - threshold) for p in cand])
        k = schedule(BLOCK, steps)[t["step"]] if rule == "llada2" else 1
        if sum(p > threshold for p in cand) < k < len(cand):  # the top-k fallback decided
            worst = min(worst, cand[k - 1] - cand[k])
        if rule == "llada2_edit" and edit_threshold > 0:
            worst = min([worst] + [abs(prob[i] - edit_threshold) for i, m in enumerate(masked)
                                   if not m and not t["frozen"][i]])
    return worst


CASES_20 = [  # (prompt length, max_new_tokens, steps, threshold)
    (13, 27, 4, 0.95),   # prompt longer than a block, ending mid-block; output ends on a boundary
    (16, 20, 3, 0.9),    # prompt on a boundary; output ends mid-block (last block decoded in full)
    (5, 30, 12, 0.8),    # prompt inside the first block; steps > block (trailing zero quotas)
    (13, 19, 8, 0.0),    # threshold 0 commits every mask at once
]
CASES_21 = [  # (prompt length, max_new_tokens, tau_mask, tau_edit, max_post_steps)
    (13, 27, 0.5, 0.0, 3),    # fast mode: tokens oscillate until the post-step limit
    (16, 20, 0.7, 0.5, 16),   # quality mode
    (5, 30, 0.9, 0.3, 1),
]


@pytest.mark.slow
@pytest.mark.parametrize("L, n, steps, tau", CASES_20)
@pytest.mark.parametrize("seed", [1, 2])
def test_llada2_matches_diffusers(ckpt, L, n, steps, tau, seed):
    cfg, w, model, spec = ckpt
    M, eos = spec.mask_token_id, spec.stop_token_ids[0]
    prompt = _prompt(L, seed, cfg)
    trace: list = []
    ours, _ = reference_decode(w, cfg, prompt, rule="llada2", max_new_tokens=n, mask_id=M, eos_id=eos,
                               block=BLOCK, steps=steps, threshold=tau, trace=trace)
    assert _margin(trace, "llada2", tau, 0.0, min(steps, n)) > FLIP
    theirs, _ = diffusers_decode(model, prompt, mask_id=M, eos_id=eos, block=BLOCK, gen_length=n, steps=steps,
                                 threshold=tau, editing_threshold=None, max_post_steps=0, eos_early_stop=True)
    assert ours == theirs
    from specfold.decoding.rules_llada2 import schedule
    quota = schedule(BLOCK, min(steps, n))
    for t in trace:
        passing = sum(p > tau for p, m in zip(t["prob"], t["masked"]) if m)
        _COVER["threshold" if passing >= max(quota[t["step"]], 1) else "fallback"] = True
    _COVER["cut"] = _COVER.get("cut", False) or len(ours) < n


@pytest.mark.slow
@pytest.mark.parametrize("L, n, tau, tau_edit, post", CASES_21)
@pytest.mark.parametrize("seed", [1, 2])
def test_llada2_edit_matches_diffusers(ckpt, L, n, tau, tau_edit, post, seed):
    cfg, w, model, spec = ckpt
    M, eos = spec.mask_token_id, spec.stop_token_ids[0]
    prompt = _prompt(L, seed, cfg)
    trace: list = []
    ours, _ = reference_decode(w, cfg, prompt, rule="llada2_edit", max_new_tokens=n, mask_id=M, eos_id=eos,
                               block=BLOCK, threshold=tau, edit_threshold=tau_edit, max_post_steps=post,
                               trace=trace)
    assert _margin(trace, "llada2_edit", tau, tau_edit, BLOCK) > FLIP
    theirs, _ = diffusers_decode(model, prompt, mask_id=M, eos_id=eos, block=BLOCK, gen_length=n, steps=BLOCK + 1,
                                 threshold=tau, editing_threshold=tau_edit or 1e-30, max_post_steps=post - 1,
                                 eos_early_stop=False)
    assert ours == theirs
    _COVER["edits"] = _COVER.get("edits", 0) + sum(t["edits"] for t in trace)
    _COVER["edit at the post limit"] = _COVER.get("edit at the post limit", False) or any(
        t["post"] == post and t["edits"] for t in trace)
    _COVER["cut"] = _COVER.get("cut", False) or len(ours) < n
    _COVER["full"] = _COVER.get("full", False) or len(ours) == n


_COVER: dict = {}


def test_the_cases_exercise_every_branch():
    """The comparisons above (run first, same module) cover the threshold and the top-k fallback of
    2.0, edits of 2.1 and edits still made at its post-step limit, and outputs cut by an eos inside
    a block as well as outputs that run to max_new_tokens."""
    if "edits" not in _COVER or "cut" not in _COVER:
        pytest.skip("needs the comparisons of this module to have run")
    assert _COVER.get("threshold") and _COVER.get("fallback")
    assert _COVER["edits"] > 0 and _COVER["edit at the post limit"]
    assert _COVER["cut"] and _COVER.get("full")
