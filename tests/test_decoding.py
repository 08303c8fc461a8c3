"""Vanilla decoding: the cached block loop equals a cache-free recomputation, stops and lengths."""
from __future__ import annotations

import pytest
import torch

from specfold import LLM, DecodeParams
from tests.reference_decode import reference_decode

PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15, 16], [20, 21, 22, 23, 24, 25]]  # len 8 = 2 blocks of 4


@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("block,sub", [(4, 2), (8, 4)])
@pytest.mark.parametrize("rule", ["static", "threshold", "sub_block", "dynamic", "llada"])
def test_cache_equals_recompute(checkpoint, shift, block, sub, rule):
    folder = checkpoint("qwen2", peaked=30.0, logits_shift=shift, seed_token=shift)
    llm = LLM(folder, dtype="float64")
    p = DecodeParams(rule=rule, block_size=block, sub_block_size=sub, tokens_per_step=2, threshold=0.5,
                     max_new_tokens=19)
    for prompt in PROMPTS:
        out = llm.generate([prompt], p)[0]
        ref = reference_decode(llm.model, llm.spec, p, prompt)
        assert out.token_ids == ref, (prompt, out.token_ids, ref)
        assert 95 not in out.token_ids


def test_prompt_exact_multiple_of_block_is_prefilled(checkpoint):
    """Upstream Fast-dLLM v2 drops a one-block prompt; we prefill whenever L >= N."""
    llm = LLM(checkpoint("qwen2", peaked=30.0, logits_shift=True, seed_token=True), dtype="float64")
    out = llm.generate([[1, 2, 3, 4]], DecodeParams(rule="static", block_size=4, max_new_tokens=8))[0]
    assert out.stats.extra["prefill_forwards"] == 1
    other = llm.generate([[7, 7, 7, 4]], DecodeParams(rule="static", block_size=4, max_new_tokens=8))[0]
    assert out.token_ids != other.token_ids  # the prompt really conditions the output


def test_nfe_accounting_static(checkpoint):
    llm = LLM(checkpoint("qwen2"), dtype="float64")
    out = llm.generate([[1, 2, 3, 4, 5]], DecodeParams(rule="static", block_size=4, tokens_per_step=1,
                                                       max_new_tokens=11, early_stop=False))[0]
    # prompt 5: prefill 4, blocks [4,8) (3 masks), [8,12) (4), [12,16) (4 allowed of 4): 11 steps, 2 commits
    assert out.stats.nfe == 1 + 11 + 2
    assert len(out.token_ids) == 11 and out.finish_reason == "length"
    assert out.stats.tokens_per_forward == pytest.approx(11 / 14)


def test_max_new_tokens_exact_and_stop_token(checkpoint):
    folder = checkpoint("qwen2", peaked=30.0)
    llm = LLM(folder, dtype="float64")
    p = DecodeParams(rule="static", max_new_tokens=7)
    free = llm.generate([[3, 1, 4, 1, 5]], p)[0]
    assert len(free.token_ids) == 7
    # make the 3rd generated token a stop token: output is cut there, the stop excluded
    stop = free.token_ids[2]
    llm2 = LLM(folder, dtype="float64", overrides={"stop_token_ids": [stop]})
    out = llm2.generate([[3, 1, 4, 1, 5]], p)[0]
    cut = free.token_ids.index(stop)
    assert out.token_ids == free.token_ids[:cut]
    assert out.finish_reason == "stop"
    assert out.stats.nfe <= free.stats.nfe


def test_early_stop_same_tokens_fewer_forwards(checkpoint):
    folder = checkpoint("qwen2", peaked=30.0)
    free = LLM(folder, dtype="float64").generate([[3, 1, 4]], DecodeParams(rule="static", max_new_tokens=12))[0]
    stop = free.token_ids[1]
    llm = LLM(folder, dtype="float64", overrides={"stop_token_ids": [stop]})
    a = llm.generate([[3, 1, 4]], DecodeParams(rule="static", max_new_tokens=12, early_stop=True))[0]
    b = llm.generate([[3, 1, 4]], DecodeParams(rule="static", max_new_tokens=12, early_stop=False))[0]
    assert a.token_ids == b.token_ids
    assert a.stats.nfe <= b.stats.nfe


@pytest.mark.parametrize("rule", ["llada", "dream", "static"])
def test_bidirectional_canvas(checkpoint, rule):
    folder = checkpoint("llama", peaked=30.0, attention="bidirectional", logits_shift=(rule == "dream"))
    llm = LLM(folder, dtype="float64")
    p = DecodeParams(rule=rule, block_size=4, steps=4 if rule != "dream" else 6, max_new_tokens=10)
    out = llm.generate([[5, 6, 7]], p)[0]
    assert len(out.token_ids) == 10 or out.finish_reason == "stop"
    # the canvas forwards are exact full recomputations: redo them by hand for the first step
    assert out.stats.extra["commit_forwards"] == 0  # no cache, no commit forwards
    again = llm.generate([[5, 6, 7]], p)[0]
    assert again.token_ids == out.token_ids


def test_temperature_is_seeded(checkpoint):
    llm = LLM(checkpoint("qwen2", peaked=3.0), dtype="float64")
    a = llm.generate([[1, 2, 3]], DecodeParams(rule="static", temperature=1.0, seed=1, max_new_tokens=8))[0]
    b = llm.generate([[1, 2, 3]], DecodeParams(rule="static", temperature=1.0, seed=1, max_new_tokens=8))[0]
    c = llm.generate([[1, 2, 3]], DecodeParams(rule="static", temperature=1.0, seed=2, max_new_tokens=8))[0]
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_nemotron_causal_prefix_and_seed(checkpoint, tmp_path):
    """after_prompt alignment: blocks start right after the prompt, each with a seed token."""
    folder = checkpoint("llama", peaked=30.0, attention="causal_prefix", alignment="after_prompt",
                        seed_token=True, block_size=4)
    llm = LLM(folder, dtype="float64")
    out = llm.generate([[5, 6, 7, 8, 9]], DecodeParams(rule="threshold", max_new_tokens=8, early_stop=False))[0]
    assert len(out.token_ids) == 8
    # the seed of the first block is the greedy causal prediction after the prompt
    from specfold.decoding.layout import causal
    pos = torch.arange(5)
    with torch.no_grad():
        lg = llm.model(torch.tensor([[5, 6, 7, 8, 9]]), pos, mask=causal(pos))[0, -1].clone()
    lg[95] = float("-inf")
    assert out.token_ids[0] == int(lg.argmax())
    assert out.stats.nfe >= 1 + 2 + 1  # prefill, >= 1 step per block, one commit between the blocks
