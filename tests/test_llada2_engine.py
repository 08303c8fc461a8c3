"""`LLM(path).generate` (the engine and its block program) on random LLaDA2 checkpoints equals the
cache-free reference decoder (tests/llada2_reference.py `reference_decode`: the official loop on an
independent forward, sharing only the pure rules) token for token, under both rules, in float64.

Covered: prompts ending on a block boundary and mid-block, a prompt shorter than a block (no
prefill) and longer than one, eos inside a block, outputs ending mid-block (the last block decoded
in full past max_new_tokens), the family defaults read from config.json, one request at a time and
a batch (batch invariance). Forwards: the engine's verifications are the reference's forwards,
except that under llada2_edit a block state the block already visited (tokens oscillate) reuses its
scores instead of running the same forward again; under llada2 with early_stop a block ends once a
committed eos has no mask before it.
"""
from __future__ import annotations

import pytest
import torch

from specfold import LLM, DecodeParams
from tests import llada2_checkpoint as C
from tests.llada2_reference import reference_decode

BLOCK = 8
CASES = [  # rule, prompt length, max_new_tokens, rule settings
    ("llada2", 13, 22, dict(steps=4, threshold=0.9)),  # mid-block prompt, output ends mid-block
    ("llada2", 16, 21, dict(steps=3, threshold=0.9)),  # prompt of whole blocks: prefilled, fresh block
    ("llada2", 5, 30, dict(steps=12, threshold=0.8)),  # prompt inside the first block: no prefill
    ("llada2", 11, 19, dict(steps=16, threshold=0.95)),  # steps > block: trailing zero quotas
    ("llada2_edit", 13, 22, dict(threshold=0.5, edit_threshold=0.0, max_post_steps=4)),  # fast mode
    ("llada2_edit", 16, 21, dict(threshold=0.7, edit_threshold=0.5, max_post_steps=16)),
    ("llada2_edit", 5, 30, dict(threshold=0.7, edit_threshold=0.5, max_post_steps=16)),  # states revisited
    ("llada2_edit", 21, 11, dict(threshold=0.9, edit_threshold=0.3, max_post_steps=0)),
]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """Two checkpoints: eos rare (long outputs) and eos frequent (eos inside blocks)."""
    out = {}
    for name, boost in (("long", 1.0), ("eos", 2.0)):
        folder, cfg, w = C.make(tmp_path_factory.mktemp(f"l2e_{name}") / "ckpt", seed=0, head_scale=4.0,
                                eos_boost=boost)
        out[name] = (LLM(folder, dtype="float64", overrides=C.overrides(cfg)), cfg, w)
    return out


def _prompt(cfg, L: int, seed: int | None = None) -> list[int]:
    g = torch.Generator().manual_seed(L if seed is None else seed)
    return torch.randint(0, cfg["vocab_size"] - 2, (L,), generator=g).tolist()  # no mask, no eos


def _revisits(trace: list, prompt: list[int], mask_id: int) -> int:
    """Steps of the reference whose block state the same block had at an earlier step."""
    n, state, seen = 0, {}, {}
    for t in trace:
        s = t["start"]
        if s not in state:
            state[s] = [prompt[s + i] if s + i < len(prompt) else mask_id for i in range(BLOCK)]
            seen[s] = set()
        key = tuple(state[s])
        n += key in seen[s]
        seen[s].add(key)
        for i, tok in t["writes"]:
            state[s][i] = tok
    return n


def _reference(llm, cfg, w, prompt, rule, n, kw):
    trace: list = []
    M, eos = llm.spec.mask_token_id, llm.spec.stop_token_ids[0]
    ids, nfe = reference_decode(w, cfg, prompt, rule=rule, max_new_tokens=n, mask_id=M, eos_id=eos, block=BLOCK,
                                trace=trace, **kw)
    return ids, nfe, _revisits(trace, prompt, M), trace


@pytest.mark.slow
@pytest.mark.parametrize("which", ["long", "eos"])
@pytest.mark.parametrize("rule, L, n, kw", CASES)
def test_engine_equals_the_reference(ckpts, which, rule, L, n, kw):
    llm, cfg, w = ckpts[which]
    prompt = _prompt(cfg, L)
    ref, nfe, rev, _ = _reference(llm, cfg, w, prompt, rule, n, kw)
    base = DecodeParams(rule=rule, block_size=BLOCK, max_new_tokens=n, **kw)
    for early in (False, True):
        out = llm.generate([prompt], base.replace(early_stop=early))[0]
        assert out.token_ids == ref, (early, out.token_ids, ref)
        assert out.finish_reason == ("stop" if len(ref) < n else "length")
        if rule == "llada2_edit" or not early:  # 2.1 never stops mid-block
            assert out.stats.verify_forwards == nfe - rev, (early, out.stats.verify_forwards, nfe, rev)
        else:
            assert out.stats.verify_forwards <= nfe


@pytest.mark.slow
def test_the_cases_cover_what_they_claim(ckpts):
    """eos inside a block, outputs cut at max_new_tokens mid-block, edits and revisited states occur."""
    stops, mid_cut, edits, revisits = 0, 0, 0, 0
    for which in ckpts:
        llm, cfg, w = ckpts[which]
        for rule, L, n, kw in CASES:
            ref, _, rev, trace = _reference(llm, cfg, w, _prompt(cfg, L), rule, n, kw)
            stops += len(ref) < n and (L + len(ref)) % BLOCK != 0
            mid_cut += len(ref) == n and (L + n) % BLOCK != 0
            edits += sum(t["edits"] for t in trace)
            revisits += rev
    assert stops and mid_cut and edits and revisits, (stops, mid_cut, edits, revisits)


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["llada2", "llada2_edit"])
def test_batch_equals_one_at_a_time(ckpts, rule):
    llm, cfg, w = ckpts["long"]
    kw = next(k for r, _, _, k in CASES if r == rule)
    prompts = [_prompt(cfg, L, seed) for L, seed in ((13, 1), (16, 2), (5, 3), (21, 4), (8, 5))]
    # prefix caching off: a batch after the lone runs would find their prompts' blocks cached and skip
    # prefill forwards (same tokens, fewer forwards), and this compares the work too
    base = DecodeParams(rule=rule, block_size=BLOCK, max_new_tokens=19, enable_prefix_caching=False, **kw)
    alone = [llm.generate([p], base)[0] for p in prompts]
    batch = llm.generate(prompts, base)
    for p, a, b in zip(prompts, alone, batch):
        assert a.token_ids == b.token_ids == _reference(llm, cfg, w, p, rule, 19, kw)[0]
        assert a.stats.nfe == b.stats.nfe


def test_family_defaults_from_config(tmp_path):
    """model_type llada2_moe decodes with rule llada2 (0.95, 32 steps, block 32), llada21_moe with
    llada2_edit (0.7 / 0.5 / 16); steps are capped at max_new_tokens per request; both equal the
    reference with those settings."""
    for mt, rule, kw in (("llada2_moe", "llada2", dict(steps=32, threshold=0.95)),
                         ("llada21_moe", "llada2_edit", dict(threshold=0.7, edit_threshold=0.5, max_post_steps=16))):
        folder, cfg, w = C.make(tmp_path / mt, seed=1, head_scale=4.0, eos_boost=1.0, model_type=mt)
        llm = LLM(folder, dtype="float64", overrides=C.overrides(cfg))
        c = DecodeParams(max_new_tokens=20).resolve(llm.spec)
        assert (c.rule, c.block_size, c.threshold) == (rule, 32, kw["threshold"])
        if rule == "llada2":
            assert c.steps == 20  # min(32, max_new_tokens)
        else:
            assert (c.edit_threshold, c.max_post_steps) == (0.5, 16)
        prompt = _prompt(cfg, 37)
        M, eos = llm.spec.mask_token_id, llm.spec.stop_token_ids[0]
        ref, _ = reference_decode(w, cfg, prompt, rule=rule, max_new_tokens=20, mask_id=M, eos_id=eos, block=32, **kw)
        assert llm.generate([prompt], DecodeParams(max_new_tokens=20))[0].token_ids == ref
    # a 2.1 checkpoint whose config says llada2_moe (unverified): the documented override path
    folder = tmp_path / "llada2_moe"
    cfg = C.config(model_type="llada2_moe")
    llm = LLM(folder, dtype="float64", overrides=C.overrides(cfg) | {"rule": "llada2_edit", "threshold": 0.7})
    c = DecodeParams(max_new_tokens=20).resolve(llm.spec)
    assert (c.rule, c.threshold, c.edit_threshold, c.max_post_steps) == ("llada2_edit", 0.7, 0.5, 16)


def test_rule_settings_are_checked():
    from specfold.errors import ParamsError
    with pytest.raises(ParamsError, match="edit_threshold"):
        DecodeParams(rule="llada2_edit", edit_threshold=1.5)
    with pytest.raises(ParamsError, match="max_post_steps"):
        DecodeParams(rule="llada2_edit", max_post_steps=-1)
