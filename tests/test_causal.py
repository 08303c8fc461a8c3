"""AR and LinearSpec (SPEC §10) on random Nemotron-Labs-Diffusion-layout checkpoints, float64.

References: `ar` against a cache-free causal recomputation of the whole sequence per token;
`linear_spec` (τ ∈ {0, 0.5, 0.9}), multi-branch (dense and folded at δ = 0) against `ar`, token for
token, with stop tokens inside accepted rounds; forward counts against the semantics counted by hand
on a scripted model (test_causal_counts.py)."""
from __future__ import annotations

import pytest
import torch

from specfold import LLM, DecodeParams
from specfold.decoding.layout import causal
from specfold.errors import ParamsError
from tests.causal_helpers import MASK, nld_checkpoint

PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15, 16, 17], [30, 31], [40, 41, 42, 43, 44]]
MAX_NEW = 19  # not a multiple of the block: the causal modes have no whole-block rule
KINDS = {  # name -> nld_checkpoint kwargs
    "plain": dict(),
    "drafting": dict(focus=2.0, mask_like=15, mask_mix=0.7, layer_scale=0.6),  # drafts often right
    "ar_head": dict(focus=2.0, mask_like=15, mask_mix=0.7, layer_scale=0.6, ar_head=True),
}


@pytest.fixture(scope="module")
def nld(tmp_path_factory):
    made: dict = {}

    def get(kind: str, stop: int = 94) -> LLM:
        if kind not in made:
            made[kind] = nld_checkpoint(tmp_path_factory.mktemp(kind), **KINDS[kind])
        return LLM(made[kind], dtype="float64", overrides={"stop_token_ids": [stop]})
    return get


def gen(llm: LLM, prompt: list[int], method: str, **kw):
    return llm.generate([prompt], DecodeParams(method=method, max_new_tokens=kw.pop("max_new_tokens", MAX_NEW),
                                               **kw))[0]


@pytest.fixture(scope="module")
def references(nld):
    """`references(kind, prompt, method, **kw)`: `gen(nld(kind), prompt, method, **kw)`, decoded once per
    module. Greedy float64 decoding of a fixed checkpoint is deterministic, and the parametrized tests
    below meet the same decodes again and again (`ar` per kind and prompt, for every τ and branch
    count; `linear_spec` per τ, for every branch count): each is decoded once, and every test still
    asserts on it."""
    done: dict = {}

    def get(kind: str, prompt: list[int], method: str, **kw):
        key = (kind, tuple(prompt), method, tuple(sorted(kw.items())))
        if key not in done:
            done[key] = gen(nld(kind), prompt, method, **kw)
        return done[key]
    return get


def reference_ar(llm: LLM, prompt: list[int], max_new: int) -> tuple[list[int], str]:
    """Greedy causal decoding recomputing the whole sequence for every token (no cache)."""
    seq, stop = list(prompt), set(llm.spec.stop_token_ids)
    with torch.inference_mode():
        for _ in range(max_new):
            pos = torch.arange(len(seq))
            lg = llm.model(torch.tensor([seq]), pos, mask=causal(pos), head="ar")[0, -1].clone()
            lg[MASK] = float("-inf")
            t = int(lg.argmax())
            if t in stop:
                return seq[len(prompt):], "stop"
            seq.append(t)
    return seq[len(prompt):], "length"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_ar_equals_cache_free_reference(nld, references, kind):
    llm = nld(kind)
    for prompt in PROMPTS:
        out = references(kind, prompt, "ar")
        ref, finish = reference_ar(llm, prompt, MAX_NEW)
        assert out.token_ids == ref and out.finish_reason == finish
        assert len(out.token_ids) == MAX_NEW and MASK not in out.token_ids
        assert out.stats.nfe == MAX_NEW  # prefill + one forward per token after the first
        assert out.stats.extra["prefill_forwards"] == 1


def test_ar_stop_token(nld):
    free = gen(nld("plain"), PROMPTS[0], "ar")
    i = 6
    stop = free.token_ids[i]
    cut = free.token_ids.index(stop)
    out = gen(nld("plain", stop=stop), PROMPTS[0], "ar")
    assert out.token_ids == free.token_ids[:cut] and out.finish_reason == "stop"
    assert out.stats.nfe == cut + 1  # the stop token is predicted, never forwarded


def rounds_with_inner_token(out) -> list[int]:
    """Output indices of tokens that are neither first nor last of their round's accepted tokens."""
    lengths = out.stats.extra["accept_lengths"]
    idx, at = [], 1  # the prefill made token 0
    for n in lengths:
        idx += list(range(at + 1, at + n - 1))
        at += n
    return idx


@pytest.mark.slow
@pytest.mark.parametrize("tau", [0.0, 0.5, 0.9])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_linear_spec_equals_ar(references, kind, tau):
    for prompt in PROMPTS:
        ar = references(kind, prompt, "ar")
        out = references(kind, prompt, "linear_spec", threshold=tau)
        assert out.token_ids == ar.token_ids and out.finish_reason == ar.finish_reason
        ex = out.stats.extra
        assert out.stats.nfe == 1 + ex["draft_forwards"] + ex["verify_forwards"]
        assert ex["verify_forwards"] == ex["rounds"] == len(ex["accept_lengths"])
        if out.finish_reason == "length":
            assert 1 + sum(ex["accept_lengths"]) == MAX_NEW


@pytest.mark.slow
@pytest.mark.parametrize("method", ["linear_spec", "linear_spec_multi", "linear_specfold"])
def test_stop_token_inside_a_round(nld, method):
    """Stop ids chosen among tokens accepted in the middle of a round: same output as ar."""
    checked = 0
    for prompt in PROMPTS:
        free = gen(nld("drafting"), prompt, method, threshold=0.0, delta=0.0)
        for i in rounds_with_inner_token(free)[:2]:
            stop = free.token_ids[i]
            llm = nld("drafting", stop=stop)
            ar = gen(llm, prompt, "ar")
            out = gen(llm, prompt, method, threshold=0.0, delta=0.0)
            assert out.token_ids == ar.token_ids == free.token_ids[: free.token_ids.index(stop)]
            assert out.finish_reason == "stop" and out.stats.nfe <= free.stats.nfe
            checked += 1
    assert checked >= 2


@pytest.mark.parametrize("tau", [0.0, 0.5, 0.9])
@pytest.mark.parametrize("branches", [2, 4, 7])
def test_multi_branch_equals_ar_never_more_forwards(nld, references, tau, branches):
    wins = 0
    for kind in ("drafting", "ar_head"):
        llm = nld(kind)
        for prompt in PROMPTS:
            ar = references(kind, prompt, "ar")
            one = references(kind, prompt, "linear_spec", threshold=tau)
            multi = gen(llm, prompt, "linear_spec_multi", threshold=tau, branches=branches)
            assert multi.token_ids == ar.token_ids
            assert multi.stats.nfe <= one.stats.nfe
            wins += multi.stats.extra.get("alternative_wins", 0)
    assert wins > 0  # the alternatives are really accepted sometimes


@pytest.mark.parametrize("tau", [0.0, 0.9])
def test_folded_delta0_equals_dense(nld, tau):
    llm = nld("drafting")
    folded_any = 0.0
    for prompt in PROMPTS:
        dense = gen(llm, prompt, "linear_spec_multi", threshold=tau, branches=4)
        fold = gen(llm, prompt, "linear_specfold", threshold=tau, branches=4, delta=0.0)
        assert fold.token_ids == dense.token_ids
        assert fold.stats.nfe == dense.stats.nfe
        assert fold.stats.extra["accept_lengths"] == dense.stats.extra["accept_lengths"]
        folded_any = max(folded_any, fold.stats.extra["fold_ratio"])
    assert folded_any > 0  # identical causal prefixes of the branches fold even at δ = 0


def test_temperature_lossless_for_a_seed(nld):
    llm = nld("drafting")
    for prompt in PROMPTS[:2]:
        ar = gen(llm, prompt, "ar", temperature=1.0, seed=3)
        for method in ("linear_spec", "linear_spec_multi"):
            out = gen(llm, prompt, method, temperature=1.0, seed=3, threshold=0.5)
            assert out.token_ids == ar.token_ids
    assert gen(llm, PROMPTS[0], "ar", temperature=1.0, seed=4).token_ids != \
        gen(llm, PROMPTS[0], "ar", temperature=1.0, seed=3).token_ids


def test_ar_head_is_used_for_causal_forwards(nld):
    """With a shipped causal lm_head, AR differs from argmax decoding through the diffusion head."""
    llm = nld("ar_head")
    out = gen(llm, PROMPTS[1], "ar")
    seq = list(PROMPTS[1])
    with torch.inference_mode():
        for _ in range(MAX_NEW):
            pos = torch.arange(len(seq))
            lg = llm.model(torch.tensor([seq]), pos, mask=causal(pos), head="lm")[0, -1].clone()
            lg[MASK] = float("-inf")
            seq.append(int(lg.argmax()))
    assert out.token_ids != seq[len(PROMPTS[1]):]
    with pytest.raises(ParamsError, match="separate causal lm_head"):
        gen(llm, PROMPTS[0], "linear_specfold")


def test_ar_on_shifted_block_causal_is_vanilla_block_one(checkpoint):
    """Fast-dLLM-v2-like (block-causal, shifted head, seed token): AR = vanilla decoding, block 1."""
    llm = LLM(checkpoint("qwen2", peaked=30.0, logits_shift=True, seed_token=True), dtype="float64")
    for prompt in PROMPTS[:3]:
        ar = llm.generate([prompt], DecodeParams(method="ar", max_new_tokens=11))[0]
        van = llm.generate([prompt], DecodeParams(method="vanilla", block_size=1, max_new_tokens=11))[0]
        assert ar.token_ids == van.token_ids and ar.finish_reason == van.finish_reason
        assert ar.stats.nfe <= van.stats.nfe


def test_refused_families(checkpoint):
    sdar_like = LLM(checkpoint("qwen2"), dtype="float64")  # block-causal, no shift
    with pytest.raises(ParamsError, match="needs a causal next-token path"):
        sdar_like.generate([[1, 2]], DecodeParams(method="ar", max_new_tokens=4))
    shifted = LLM(checkpoint("qwen2", logits_shift=True, seed_token=True), dtype="float64")
    with pytest.raises(ParamsError, match="needs a causal-prefix family"):
        shifted.generate([[1, 2]], DecodeParams(method="linear_spec", max_new_tokens=4))
    bidir = LLM(checkpoint("llama", attention="bidirectional"), dtype="float64")
    with pytest.raises(ParamsError, match="needs a causal next-token path"):
        bidir.generate([[1, 2]], DecodeParams(method="linear_spec_multi", max_new_tokens=4))


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ar", "linear_spec", "linear_spec_multi", "linear_specfold"])
def test_batch_equals_alone(nld, method):
    """All prompts in one engine (packed forwards, requests at different phases) = each alone = ar."""
    llm = nld("drafting")
    p = DecodeParams(method=method, max_new_tokens=MAX_NEW, threshold=0.5, branches=4, delta=0.0)
    batch = llm.generate(PROMPTS, p)
    for prompt, out in zip(PROMPTS, batch):
        alone = llm.generate([prompt], p)[0]
        ar = gen(llm, prompt, "ar")
        assert out.token_ids == alone.token_ids == ar.token_ids
        assert out.stats.nfe == alone.stats.nfe


def test_registry_lists_causal_methods_per_model(nld, checkpoint):
    from specfold.decoding.methods import method_names
    causal = {"ar", "linear_spec", "linear_spec_multi", "linear_specfold"}
    assert causal <= set(method_names(nld("plain").spec))
    assert not causal & set(method_names(LLM(checkpoint("qwen2")).spec))  # block-causal, no shift
    assert set(method_names(LLM(checkpoint("qwen2", logits_shift=True, seed_token=True)).spec)) & causal == {"ar"}
