"""Log-probabilities (`SamplingParams(logprobs=N)`): shapes, what they mean, and that lossless methods
give vanilla's numbers.

Meaning (docs/SERVING.md): each output token carries the log-probability it had in the forward that
committed it (log-softmax of the raw logits at temperature 1, the mask token excluded), with the N
most likely tokens there. Checked against cache-free recomputations that share no code with the
engine's reads: the block-causal reference decoder (vanilla), LLaDA2's official loop (an edited
token's numbers are those of the step that wrote its final value) and a full causal forward per
token (AR). Lossless methods (FreeDave, Spiffy, SpecFold at δ = 0, eager windows, LinearSpec)
commit every token at vanilla's (AR's) state, so their numbers equal vanilla's in float64: alone
and in a staggered batch with sampled requests.
"""
from __future__ import annotations

import math

import pytest
import torch

from specfold import LLM, DecodeParams, EngineConfig, SamplingParams
from specfold.decoding.layout import causal
from specfold.errors import ParamsError
from tests.causal_helpers import nld_checkpoint
from tests.reference_decode import reference_decode
from tests.test_engine import FAMILIES, MAX_NEW, METHODS, PROMPTS

TOL = 1e-9


def _close(a: list[dict], b: list[dict], where) -> None:
    assert len(a) == len(b), where
    for i, (x, y) in enumerate(zip(a, b)):
        assert list(x) == list(y), (where, i, x, y)
        assert all(abs(x[k] - y[k]) <= TOL for k in x), (where, i, x, y)


def _check_shape(out, n: int) -> None:
    """One dict per token: the n most likely by rank, then the chosen token if not among them."""
    assert len(out.logprobs) == len(out.token_ids) > 0
    for tok, d in zip(out.token_ids, out.logprobs):
        assert tok in d and d[tok] <= 0.0
        assert len(d) in (n, n + 1) if n else len(d) == 1
        top = list(d.items())[:n]
        assert [v for _, v in top] == sorted((v for _, v in top), reverse=True)
        if len(d) == n + 1:  # the chosen one is appended only when it is not in the top n
            assert list(d)[-1] == tok and d[tok] <= top[-1][1]
        assert sum(math.exp(v) for v in d.values()) <= 1.0 + 1e-6


# ---------------------------------------------------------------------------------- the API
@pytest.fixture(scope="module")
def tiny(tiny_llm):
    return tiny_llm


def test_api_shapes_and_greedy_choice(tiny):
    q = "Ben has 4 stickers. He buys 5 more stickers. How many stickers does Ben have now?"
    plain = tiny.generate([q], SamplingParams(max_new_tokens=32, chat_template=True))[0]
    assert plain.logprobs is None
    out = tiny.generate([q], SamplingParams(max_new_tokens=32, chat_template=True, logprobs=3))[0]
    assert out.token_ids == plain.token_ids  # asking for logprobs changes no token
    _check_shape(out, 3)
    for tok, d in zip(out.token_ids, out.logprobs):  # at T = 0 the chosen token is the most likely
        assert next(iter(d)) == tok and len(d) == 3
    zero = tiny.generate([q], SamplingParams(max_new_tokens=32, chat_template=True, logprobs=0))[0]
    assert [list(d) for d in zero.logprobs] == [[t] for t in zero.token_ids]
    assert [d[t] for d, t in zip(zero.logprobs, zero.token_ids)] == [d[t] for d, t in zip(out.logprobs, out.token_ids)]


@pytest.mark.slow
def test_api_sampled_tokens_and_streamed_deltas(tiny):
    """At T > 0 the chosen token is the sampled one (its logprob at temperature 1, often not the top);
    the deltas carry the logprobs of the tokens they carry; a stop string trims both alike."""
    ids = tiny.encode("Anna has 5 shells. She loses 2 shells. How many shells does Anna have now?",
                      SamplingParams(chat_template=True))
    eng = tiny.engine(EngineConfig(method="spiffy"))
    sp = SamplingParams(max_new_tokens=48, temperature=1.5, seed=3, logprobs=2)
    rid = eng.add_request(ids, sp)
    stop_rid = eng.add_request(ids, sp.replace(stop=["shells"]))
    streamed, outs = {rid: ([], []), stop_rid: ([], [])}, {}
    while eng.has_unfinished():
        for d in eng.step():
            assert len(d.new_logprobs) == len(d.new_token_ids)
            streamed[d.request_id][0].extend(d.new_token_ids)
            streamed[d.request_id][1].extend(d.new_logprobs)
            if d.finished:
                outs[d.request_id] = d.output
    for r in (rid, stop_rid):
        o = outs[r]
        _check_shape(o, 2)
        assert streamed[r] == (o.token_ids, o.logprobs)
    assert outs[stop_rid].finish_reason == "stop" and len(outs[stop_rid].token_ids) < len(outs[rid].token_ids)
    assert any(next(iter(d)) != t for d, t in zip(outs[rid].logprobs, outs[rid].token_ids))  # really sampled


@pytest.mark.parametrize("bad", [-1, 21, True, 2.0, "3"])
def test_api_bad_values(bad):
    with pytest.raises(ParamsError, match=r"logprobs must be an integer in \[0, 20\]"):
        SamplingParams(logprobs=bad)


# ---------------------------------------------------------------------------------- meaning
@pytest.mark.parametrize("family", ["bc", "bc_shift"])
@pytest.mark.parametrize("rule", ["static", "threshold"])
def test_vanilla_numbers_are_the_committing_forwards(checkpoint, family, rule):
    """Against the cache-free block-causal reference: every token's logprob is the log-softmax, at
    the step that wrote it, of the whole sequence recomputed (the seed token: of the forward that
    predicted it)."""
    llm = LLM(checkpoint("qwen2", peaked=3.0, block_size=4, **FAMILIES[family]), dtype="float64")
    p = DecodeParams(rule=rule, block_size=4, tokens_per_step=2, threshold=0.3, max_new_tokens=13, logprobs=2)
    for prompt in PROMPTS[:3]:
        out = llm.generate([prompt], p)[0]
        want: dict = {}
        ref = reference_decode(llm.model, llm.spec, p, prompt, logprobs=want)
        assert out.token_ids == ref
        got = [d[t] for d, t in zip(out.logprobs, out.token_ids)]
        assert max(abs(g - want[len(prompt) + i]) for i, g in enumerate(got)) <= TOL


# ---------------------------------------------------------------------------------- lossless = vanilla
def _run(llm, config: EngineConfig, temps: list[float], stagger: int, only: int | None = None):
    """The requests of PROMPTS through one engine (or only request `only`, alone)."""
    eng = llm.engine(config)
    order = [only] if only is not None else list(range(len(PROMPTS)))
    outs, rids, step, k = {}, {}, 0, 0
    while k < len(order) or eng.has_unfinished():
        while k < len(order) and step >= k * stagger:
            i = order[k]
            sp = SamplingParams(max_new_tokens=MAX_NEW[i], temperature=temps[i], seed=i, logprobs=3)
            rids[eng.add_request(PROMPTS[i], sp)] = i
            k += 1
        for d in eng.step():
            if d.finished:
                outs[rids[d.request_id]] = d.output
        step += 1
    return outs


LOSSLESS = ["freedave", "freedave_eager", "spiffy", "specfold", "specfold_chain", "specfold_eager"]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bc", "bc_shift", "bi"])
def test_lossless_methods_give_vanillas_logprobs(checkpoint, family):
    llm = LLM(checkpoint("qwen2", peaked=30.0, block_size=8, sub_block_size=4, **FAMILIES[family]), dtype="float64")
    temps = [0.0, 0.9, 0.0, 1.2, 0.0]
    base = EngineConfig(rule="threshold", threshold=0.6, draft_budget=64)
    van = _run(llm, base, temps, stagger=0)
    for i in van:
        _check_shape(van[i], 3)
    reused = 0
    for name in LOSSLESS:
        if METHODS[name].get("eager") and FAMILIES[family]["attention"] != "block_causal":
            continue
        cfg = base.replace(**{k: v for k, v in METHODS[name].items()})
        batch = _run(llm, cfg, temps, stagger=1)
        for i, v in van.items():
            alone = _run(llm, cfg, temps, stagger=0, only=i)[i]
            for got in (alone, batch[i]):
                assert got.token_ids == v.token_ids, (name, i)
                _close(got.logprobs, v.logprobs, (name, i))
            reused += batch[i].stats.extra["reused_states"]
    assert reused > 0  # the drafts were accepted: the numbers came from draft branches' rows


# ---------------------------------------------------------------------------------- causal programs
@pytest.fixture(scope="module")
def nld(tmp_path_factory):
    folder = nld_checkpoint(tmp_path_factory.mktemp("nld_lp"), focus=2.0, mask_like=15, mask_mix=0.7,
                            layer_scale=0.6)
    return LLM(folder, dtype="float64", overrides={"stop_token_ids": [94]})


def _teacher_forced(llm, prompt: list[int], out: list[int]) -> list[float]:
    """AR's numbers recomputed: one causal forward over prompt + output, log-softmax at each
    position before a token (mask excluded)."""
    seq = prompt + out
    pos = torch.arange(len(seq))
    with torch.inference_mode():
        lg = llm.model(torch.tensor([seq]), pos, mask=causal(pos), head="ar")[0].double().clone()
        lg[:, llm.spec.mask_token_id] = float("-inf")
        lp = torch.log_softmax(lg, -1)
    return [float(lp[len(prompt) + i - 1, t]) for i, t in enumerate(out)]


CAUSAL = {"linear_spec": dict(method="linear_spec", rule="threshold", threshold=0.0),
          "linear_spec_multi": dict(method="linear_spec_multi", rule="threshold", threshold=0.0, branches=3),
          "linear_specfold": dict(method="linear_specfold", rule="threshold", threshold=0.0, branches=3, delta=0.0)}


def test_causal_programs_give_ars_logprobs(nld):
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13], [40, 41]]
    temps, n = [0.0, 0.0, 1.0], 14
    ar = _many(nld, EngineConfig(method="ar"), prompts, temps, n)
    for p, o in zip(prompts, ar):
        _check_shape(o, 2)
        want = _teacher_forced(nld, p, o.token_ids)
        assert max(abs(d[t] - w) for d, t, w in zip(o.logprobs, o.token_ids, want)) <= TOL
    accepted = 0
    for name, kw in CAUSAL.items():
        got = _many(nld, EngineConfig(**kw), prompts, temps, n)
        for o, a in zip(got, ar):
            assert o.token_ids == a.token_ids, name
            _close(o.logprobs, a.logprobs, name)
            accepted += o.stats.extra["accepted_drafts"]
    assert accepted > 0


def _many(llm, cfg: EngineConfig, prompts, temps, n):
    sps = [SamplingParams(max_new_tokens=n, temperature=t, seed=i, logprobs=2) for i, t in enumerate(temps)]
    return llm.engine(cfg).run_all(list(prompts), sps)


# ---------------------------------------------------------------------------------- LLaDA2.1's edits
def test_llada2_edit_numbers_come_from_the_final_write(tmp_path):
    """Under llada2_edit a written token may be rewritten; its numbers are those of the step that wrote
    its final value (the official loop recomputed), and a lossless method gives the same."""
    from tests import llada2_checkpoint as C
    from tests.llada2_reference import reference_decode as official
    folder, cfg, w = C.make(tmp_path / "ckpt", seed=0, head_scale=4.0, eos_boost=1.0)
    llm = LLM(folder, dtype="float64", overrides=C.overrides(cfg))
    V, M, eos = cfg["vocab_size"], llm.spec.mask_token_id, llm.spec.stop_token_ids[0]
    rule = dict(rule="llada2_edit", threshold=0.7, edit_threshold=0.5, max_post_steps=16)
    edits = 0
    for L in (13, 5):
        prompt = torch.randint(0, V - 2, (L,), generator=torch.Generator().manual_seed(L)).tolist()
        want, trace = {}, []
        ids, _ = official(w, cfg, prompt, max_new_tokens=22, mask_id=M, eos_id=eos, block=8, trace=trace,
                          logprobs=want, **rule)
        edits += sum(t["edits"] for t in trace)
        base = DecodeParams(block_size=8, max_new_tokens=22, draft_budget=64, logprobs=2, **rule)
        van = llm.generate([prompt], base)[0]
        assert van.token_ids == ids
        got = [d[t] for d, t in zip(van.logprobs, van.token_ids)]
        assert max(abs(g - want[L + i]) for i, g in enumerate(got)) <= TOL
        spec = llm.generate([prompt], base.replace(method="freedave", draft_depth=4))[0]
        assert spec.token_ids == van.token_ids
        _close(spec.logprobs, van.logprobs, L)
    assert edits > 0  # some written tokens were rewritten
