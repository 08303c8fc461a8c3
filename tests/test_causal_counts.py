"""Forward counts of AR and LinearSpec against SPEC §10 counted by hand, on a scripted model.

The scripted model knows the answer: the token at absolute position q is f(q) = 10 + q. A causal
row at position q predicts f(q + 1) (p = 0.99) whatever its tokens; a masked row at q drafts f(q)
with confidence conf(q), except at the "bad" positions, where it drafts f(q) + 40 (p = 0.6) with f(q)
second (p = 0.3). It also checks the cache bookkeeping of every forward: the window starts exactly at
the cached length, and a cache write appends the whole window.
"""
from __future__ import annotations

import torch

from types import SimpleNamespace

from specfold.decoding.causal.ar import AR
from specfold.decoding.causal.linear_spec import LinearSpec
from specfold.decoding.causal.program import CausalProgram
from specfold.decoding.rules import make_rule
from specfold.engine.engine import Engine
from specfold.models.forward import ForwardResult
from specfold.models.spec import ModelSpec
from specfold.params import DecodeParams, EngineConfig, SamplingParams

V, M = 96, 95
PROMPT = [1, 2, 3]  # positions 0..2: generated token i sits at position 3 + i


def f(q: int) -> int:
    return 10 + q


def probs(top: list[tuple[int, float]]) -> torch.Tensor:
    rest = 1.0 - sum(p for _, p in top)
    p = torch.full((V,), rest / (V - 1 - len(top)), dtype=torch.float64)
    p[M] = 1e-30
    for t, pt in top:
        p[t] = pt
    return p.log()


class Scripted:
    def __init__(self, bad=(), conf=lambda q: 0.9):
        self.bad, self.conf = set(bad), conf

    device = torch.device("cpu")
    dtype = torch.float64

    def forward_many(self, forwards):
        return [ForwardResult(self(f.tokens, f.positions, f.cache, f.mask, f.write_cache, f.logits_at, f.head))
                for f in forwards]

    def __call__(self, tokens, positions, cache=None, mask=None, write_cache=False, logits_at=None, head="lm"):
        B, T = tokens.shape
        assert positions.tolist() == list(range(cache.length, cache.length + T)), "window != cache end"
        idx = torch.arange(T) if logits_at is None else logits_at
        out = torch.empty(B, len(idx), V, dtype=torch.float64)
        for b in range(B):
            for k, i in enumerate(idx.tolist()):
                q = int(positions[i])
                if int(tokens[b, i]) != M:
                    out[b, k] = probs([(f(q + 1), 0.99)])
                elif q in self.bad:
                    out[b, k] = probs([(f(q) + 40, 0.6), (f(q), 0.3)])
                else:
                    out[b, k] = probs([(f(q), self.conf(q))])
        if write_cache:
            cache.write(0, torch.zeros(1, T, 1, dtype=torch.float64), torch.zeros(1, T, 1, dtype=torch.float64))
            cache.commit_write()
        return out


SPEC = ModelSpec(family="nemotron_labs_diffusion", model_type="nemotron_labs_diffusion", hidden_size=1,
                 num_layers=1, num_heads=1, num_kv_heads=1, head_dim=1, intermediate_size=1, vocab_size=V,
                 mask_token_id=M, attention="causal_prefix", alignment="after_prompt", seed_token=True)


def run(program, model, max_new=10, stop=()):
    """One request through the engine (the only way to run one), with the scripted model."""
    host = SimpleNamespace(model=model, spec=SPEC, tokenizer=None)
    model.spec = SPEC
    eng = Engine(host, EngineConfig(method="ar", kv_cache_memory="64KiB"), program=CausalProgram(program))
    out = eng.run_one(PROMPT, SamplingParams(max_new_tokens=max_new, stop_token_ids=list(stop), seed=0))
    return out.token_ids, out.stats


def linear(tau: float, branches: int = 1) -> LinearSpec:
    rule = make_rule(DecodeParams(rule="threshold", threshold=tau, threshold_ge=True))
    return LinearSpec(SPEC, rule, 4, branches)


ANSWER = [f(q) for q in range(3, 13)]


def test_ar_counts():
    out, st = run(AR(SPEC), Scripted())
    assert out == ANSWER and st.nfe == 10 and st.extra["decode_forwards"] == 9


def test_linear_spec_tau0_counts():
    # prefill -> f3. Round 1: block @3..6, one draft forward, 6 is bad: accept f4 f5 + bonus f6 (3).
    # Round 2: @6..9 all good: accept f7 f8 f9 + bonus f10 (4). Round 3: 2 tokens left, block @10..11,
    # 11 bad: bonus f11 only (1). Round 4: 1 left, block [f11] has no mask: verify only -> f12.
    out, st = run(linear(0.0), Scripted(bad={6, 11}))
    assert out == ANSWER
    assert st.extra["accept_lengths"] == [3, 4, 1, 1]
    assert (st.extra["prefill_forwards"], st.extra["draft_forwards"], st.verify_forwards) == (1, 3, 4)
    assert st.nfe == 8


def test_linear_spec_threshold_counts():
    # τ = 0.5, conf 0.9 at even q and 0.3 at odd q, bad positions draft at 0.6 (>= τ).
    # Round 1 masks 4(.9) 5(.3) 6(bad .6): forward 1 commits 4 and 6, forward 2 commits 5 -> 2 drafts.
    # Round 2 masks 7(.3) 8(.9) 9(.3): commits 8, then 7 (tie: lower position), then 9 -> 3 drafts.
    # Round 3 mask 11(bad .6): 1 draft. Round 4: verify only. Accepts as at τ = 0.
    out, st = run(linear(0.5), Scripted(bad={6, 11}, conf=lambda q: 0.9 if q % 2 == 0 else 0.3))
    assert out == ANSWER
    assert st.extra["accept_lengths"] == [3, 4, 1, 1]
    assert (st.extra["draft_forwards"], st.verify_forwards, st.nfe) == (6, 4, 11)


def test_stop_inside_a_round_counts():
    # as τ = 0 above, with f8 a stop token: round 2 accepts f7 f8 ..., the output stops before f8.
    out, st = run(linear(0.0), Scripted(bad={6, 11}), stop={f(8)})
    assert out == ANSWER[:5] and st.nfe == 1 + 2 + 2


def test_multi_branch_counts():
    # B = 2. Round 1: main [f3 f4 f5 w6]; the top-2 swap with the largest reach·p2 is at 6
    # (0.9·0.9·0.3 against ~0.001 elsewhere) and is all right: accept f4..f7 (4); nothing is written.
    # Round 2: the draft forward's window is pending f3..f6 + block @7..10 (it writes the pending K/V),
    # main all right: accept f8..f11 (4). Round 3: 1 left, one branch: the verify writes pending f7..f10
    # + [f11] and yields f12.
    out, st = run(linear(0.0, branches=2), Scripted(bad={6, 11}))
    assert out == ANSWER
    assert st.extra["accept_lengths"] == [4, 4, 1]
    assert (st.extra["draft_forwards"], st.verify_forwards, st.nfe) == (2, 3, 6)
    assert st.extra["alternative_wins"] == 1
    assert st.extra["rows"] == 3 + 4 + 2 * 4 + (4 + 4) + 2 * 4 + (4 + 1)
