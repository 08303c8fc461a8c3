"""The engine (specfold/engine/): packed forwards equal single ones, batching never changes tokens,
the scheduler's limits, abort, and streaming deltas.

Batch invariance is checked in float64 against the same method decoding one request at a time
(itself checked against vanilla and the cache-free reference in test_decoding/test_speculative)."""
from __future__ import annotations

import os

import pytest
import torch

from specfold import LLM, DecodeParams, EngineConfig, SamplingParams
from specfold.decoding.drafts.graph import DraftGraph, Node
from specfold.models.forward import Forward
from specfold.errors import EngineFull, ParamsError

MIXED = DraftGraph([Node(0, ((0, 0),)), Node(1, ((0, 0),)), Node(0, ((1, 0),)), Node(0, ((0, 1),)),
                    Node(2, ((0, 0), (1, 0))), Node(0, ((0, 0), (1, 0))), Node(3, ((0, 0),)), Node(4, ((2, 1),))])
FAMILIES = {
    "bc": dict(attention="block_causal"),
    "bc_shift": dict(attention="block_causal", logits_shift=True, seed_token=True),
    "bi": dict(attention="bidirectional"),
    "bi_shift": dict(attention="bidirectional", logits_shift=True),
}
METHODS = {
    "vanilla": dict(method="vanilla"),
    "freedave": dict(method="freedave", draft_depth=6),
    "freedave_eager": dict(method="freedave", draft_depth=6, eager=True),
    "spiffy": dict(method="spiffy", branches=8, graph=MIXED),
    "specfold": dict(method="specfold", drafts="spiffy", branches=8, graph=MIXED, delta=0.0),
    "specfold_chain": dict(method="specfold", drafts="freedave", draft_depth=4, delta=0.0),
    "specfold_eager": dict(method="specfold", drafts="spiffy", branches=8, graph=MIXED, delta=0.0, eager=True),
}
# mixed prompt lengths (inside a block, exactly a block, several blocks)
PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15, 16], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30], [40],
           [50, 51, 52, 53, 54, 55]]
MAX_NEW = [16, 9, 21, 12, 5]  # requests end at different times


def _llm(checkpoint, family, peaked=30.0):
    return LLM(checkpoint("qwen2", peaked=peaked, block_size=8, sub_block_size=4, **FAMILIES[family]), dtype="float64")


def _alone(llm, base: DecodeParams, prompts, max_new, temps=None):
    outs = []
    for i, (pr, n) in enumerate(zip(prompts, max_new)):
        t = temps[i] if temps else 0.0
        outs.append(llm.generate([pr], base.replace(max_new_tokens=n, temperature=t, seed=i))[0])
    return outs


def _batched(llm, config: EngineConfig, prompts, max_new, stagger: int = 0, temps=None):
    """All requests through one engine; with `stagger` > 0 request i joins after i*stagger steps."""
    eng = llm.engine(config)
    outs, ids, nxt, step = {}, [], 0, 0
    while nxt < len(prompts) or eng.has_unfinished():
        while nxt < len(prompts) and step >= nxt * stagger:
            sp = SamplingParams(max_new_tokens=max_new[nxt], temperature=temps[nxt] if temps else 0.0, seed=nxt)
            ids.append(eng.add_request(prompts[nxt], sp))
            nxt += 1
        for d in eng.step():
            if d.finished:
                outs[d.request_id] = d.output
        step += 1
    assert not eng.running and not eng.waiting
    return [outs[r] for r in ids]


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("family", [f if f == "bc" else pytest.param(f, marks=pytest.mark.slow) for f in FAMILIES])
def test_batch_invariance(checkpoint, family, method):
    if METHODS[method].get("eager") and FAMILIES[family]["attention"] != "block_causal":
        pytest.skip("eager windows need a block-causal family")
    llm = _llm(checkpoint, family)
    base = DecodeParams(rule="threshold", threshold=0.6, draft_budget=64, **METHODS[method])
    want = _alone(llm, base, PROMPTS, MAX_NEW)
    cfg, _ = base.split()
    for stagger, budget in ((0, 64), (2, 64), (1, 2), (1, "auto")):
        got = _batched(llm, cfg.replace(draft_budget=budget), PROMPTS, MAX_NEW, stagger)
        for w, g, pr in zip(want, got, PROMPTS):
            assert g.token_ids == w.token_ids, (stagger, budget, pr)
            assert g.finish_reason == w.finish_reason
            if budget == 64:  # the same verifications: identical forward counts
                assert g.stats.nfe == w.stats.nfe


@pytest.mark.parametrize("method", ["vanilla", "spiffy", "freedave_eager"])
def test_batch_invariance_sampling_and_stops(checkpoint, method):
    """Temperature with per-request seeds, a stop token that ends some requests early."""
    folder = checkpoint("qwen2", peaked=3.0, block_size=8, sub_block_size=4, **FAMILIES["bc_shift"])
    free = LLM(folder, dtype="float64")
    base = DecodeParams(rule="static", **METHODS[method])
    temps = [0.0, 0.8, 1.0, 0.0, 0.5]
    stop = _alone(free, base, PROMPTS[:1], [16])[0].token_ids[4]
    llm = LLM(folder, dtype="float64", overrides={"stop_token_ids": [stop]})
    want = _alone(llm, base, PROMPTS, MAX_NEW, temps)
    assert {w.finish_reason for w in want} == {"stop", "length"}
    got = _batched(llm, base.split()[0], PROMPTS, MAX_NEW, stagger=1, temps=temps)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert [g.finish_reason for g in got] == [w.finish_reason for w in want]


@pytest.mark.slow
def test_tiny_model_batch_invariance(tiny_llm64):
    llm = tiny_llm64
    qs = ["Tom has 3 apples and buys 5 more. How many apples?", "What is 7 + 8?", "Sam had 10 pens and lost 4."]
    for kw in (METHODS["vanilla"], dict(method="freedave", draft_depth=8, eager=True), dict(method="spiffy"),
               dict(method="specfold", delta=0.0)):
        p = DecodeParams(chat_template=True, max_new_tokens=40, **kw)
        alone = [llm.generate([q], p)[0].token_ids for q in qs]
        assert [o.token_ids for o in llm.generate(qs, p)] == alone, kw


# ---------------------------------------------------------------------------- forward_many
def _forwards(m, g):
    """Forwards of different shapes, prefix lengths, masks, heads, logits_at, cache writes."""
    fws, caches = [], []
    for P, B, T, kind in ((8, 3, 8, "verify"), (0, 1, 5, "prefill"), (13, 1, 4, "commit"), (4, 5, 16, "verify"),
                          (0, 2, 6, "verify")):
        cache = None
        if P or kind == "prefill":
            cache = m.new_cache(64)
            if P:
                m(torch.randint(0, 90, (1, P), generator=g), torch.arange(P), cache=cache, write_cache=True)
        caches.append(cache)
        pos = torch.arange(P, P + T)
        mask = None if kind == "verify" and P == 0 else (pos[:, None] // 4 >= pos[None, :] // 4)
        at = None if B == 2 else torch.tensor([0, T - 1, T // 2])
        fws.append(Forward(torch.randint(0, 95, (B, T), generator=g), pos, cache, mask, write_cache=kind != "verify",
                           logits_at=at, return_hidden=(B == 3), kind=kind))
    return fws, caches


def test_forward_many_equals_forward(checkpoint):
    llm = LLM(checkpoint("qwen3"), dtype="float64")
    m = llm.model
    g = torch.Generator().manual_seed(0)
    fws, caches = _forwards(m, g)
    ref_caches = [None if c is None else _copy(c) for c in caches]
    with torch.inference_mode():
        ref = []
        for f, c in zip(fws, ref_caches):
            ref.append(m(f.tokens, f.positions, cache=c, mask=f.mask, write_cache=f.write_cache,
                         logits_at=f.logits_at, return_hidden=f.return_hidden))
        got = m.forward_many(fws)
    for f, r, o in zip(fws, ref, got):
        lg, hid = r if f.return_hidden else (r, None)
        assert o.logits.shape == lg.shape
        assert (o.logits - lg).abs().max().item() <= 1e-12
        if hid is not None:
            assert len(o.hidden) == len(hid) and all((a - b).abs().max() <= 1e-12 for a, b in zip(o.hidden, hid))
    for c, rc in zip(caches, ref_caches):
        if c is not None:
            assert c.length == rc.length
            assert (c.k[:, :, : c.length] - rc.k[:, :, : c.length]).abs().max() <= 1e-12
            assert (c.v[:, :, : c.length] - rc.v[:, :, : c.length]).abs().max() <= 1e-12


def _grouped_forwards(m, g):
    """Forwards that share (B, T) next to each other (one attention `Group`: prefixes of different
    lengths, one empty, masks and no mask, cache writes and none), then a different window length,
    then the first shape again (not contiguous with its group: the per-forward path)."""
    fws, caches = [], []
    for P, B, T, write, masked in ((9, 1, 8, False, True), (0, 1, 8, True, True), (21, 1, 8, True, False),
                                   (4, 1, 8, False, True), (5, 2, 6, False, False), (7, 1, 8, False, True)):
        cache = m.new_cache(64)
        if P:
            m(torch.randint(0, 90, (1, P), generator=g), torch.arange(P), cache=cache, write_cache=True)
        caches.append(cache)
        pos = torch.arange(P, P + T)
        mask = (pos[:, None] // 4 >= pos[None, :] // 4) if masked else None
        fws.append(Forward(torch.randint(0, 95, (B, T), generator=g), pos, cache, mask, write_cache=write,
                           logits_at=torch.tensor([0, T - 1]), kind="commit" if write else "verify"))
    return fws, caches


def test_grouped_attention_equals_forward_per_forward(checkpoint, monkeypatch):
    from specfold.models import attention as attn
    llm = LLM(checkpoint("qwen3"), dtype="float64")
    m = llm.model
    planned = []
    plan = attn.Group.plan
    monkeypatch.setattr(attn.Group, "plan", staticmethod(lambda *a: planned.append(plan(*a)) or planned[-1]))
    fws, caches = _grouped_forwards(m, torch.Generator().manual_seed(3))
    ref_caches = [_copy(c) for c in caches]
    with torch.inference_mode():
        ref = [m(f.tokens, f.positions, cache=c, mask=f.mask, write_cache=f.write_cache, logits_at=f.logits_at)
               for f, c in zip(fws, ref_caches)]
        got = m.forward_many(fws)
    for r, o in zip(ref, got):
        assert (o.logits - r).abs().max().item() <= 1e-12
    for c, rc in zip(caches, ref_caches):
        assert c.length == rc.length
        assert (c.k[:, :, : c.length] - rc.k[:, :, : c.length]).abs().max() <= 1e-12
        assert (c.v[:, :, : c.length] - rc.v[:, :, : c.length]).abs().max() <= 1e-12
    # forwards 0-3 of (1, 8) are one group; 4 (another length) and 5 (after it) are alone
    assert [p.idx for p in planned] == [[0, 1, 2, 3], [5], [4]]


def _naive_attention(q, k, v, pk, pv, mask, scale):
    """Per branch and head, softmax over [prefix keys; window keys] (the definition, no shared code)."""
    B, H, T, D = q.shape
    g = H // k.shape[1]
    out = torch.empty(B, T, H, D, dtype=q.dtype)
    for b in range(B):
        for h in range(H):
            keys, vals = k[b, h // g], v[b, h // g]
            s = q[b, h] @ keys.T * scale
            if mask is not None:
                s = s.masked_fill(~mask, float("-inf"))
            if pk is not None:
                s = torch.cat([q[b, h] @ pk[h // g].T * scale, s], -1)
                vals = torch.cat([pv[h // g], vals])
            out[b, :, h] = torch.softmax(s, -1) @ vals
    return out.reshape(B, T, H * D)


def test_attention_core_equals_the_definition():
    """`attention` (one forward) and `attend_padded` (padded branches, padded prefixes) against the
    naive per-head softmax, in float64: GQA, masks, an empty prefix, several branches."""
    from specfold.models.attention import attend_padded, attention
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    H, hkv, D, T = 6, 2, 8, 5
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for B, P, m in ((1, 0, None), (1, 7, mask), (3, 4, mask), (2, 0, mask), (3, 6, None)):
        q, k, v = r(B, H, T, D), r(B, hkv, T, D), r(B, hkv, T, D)
        pk, pv = (r(hkv, P, D), r(hkv, P, D)) if P else (None, None)
        want = _naive_attention(q, k, v, pk, pv, m, 0.3)
        assert (attention(q, k, v, pk, pv, m, 0.3) - want).abs().max() <= 1e-12
    # two forwards padded to 3 branches and a prefix of 6: the real rows equal each forward alone
    shapes = ((2, 4), (3, 6))
    Q, K, V = r(2, 3, H, T, D), r(2, 3, hkv, T, D), r(2, 3, hkv, T, D)
    PK, PV = r(2, hkv, 6, D), r(2, hkv, 6, D)
    PK[0, :, 4:] = PV[0, :, 4:] = 1e3  # padded prefix keys: finite junk, masked out
    valid = torch.arange(6)[None] < torch.tensor([[4], [6]])
    M = torch.stack([mask, torch.ones(T, T, dtype=torch.bool)])
    out = attend_padded(Q, K, V, M, PK, PV, valid, 0.3)
    for i, (B, P) in enumerate(shapes):
        want = _naive_attention(Q[i, :B], K[i, :B], V[i, :B], PK[i, :, :P], PV[i, :, :P], M[i], 0.3)
        assert (out[i, :B] - want).abs().max() <= 1e-12


def _copy(c):
    import copy
    return copy.deepcopy(c)  # the cache and its private pool


def test_write_kv_equals_commit_forward(checkpoint):
    llm = LLM(checkpoint("qwen2"), dtype="float64")
    m = llm.model
    g = torch.Generator().manual_seed(1)
    a, b = m.new_cache(32), m.new_cache(32)
    pre = torch.randint(0, 90, (1, 8), generator=g)
    with torch.inference_mode():
        for c in (a, b):
            m(pre, torch.arange(8), cache=c, write_cache=True)
        win, pos = torch.randint(0, 90, (2, 8), generator=g), torch.arange(8, 16)
        mask = pos[:, None] >= pos[None, :]
        _, hidden = m(win, pos, cache=a, mask=mask, return_hidden=True)
        m.write_kv(a, [h[1] for h in hidden[:-1]], pos)
        m(win[1:2], pos, cache=b, mask=mask, write_cache=True)
    assert a.length == b.length == 16
    assert (a.k[:, :, :16] - b.k[:, :, :16]).abs().max() <= 1e-12
    assert (a.v[:, :, :16] - b.v[:, :, :16]).abs().max() <= 1e-12


# ---------------------------------------------------------------------------- scheduler
def test_max_num_seqs_and_full_engine(checkpoint):
    llm = _llm(checkpoint, "bc")
    cfg = EngineConfig(method="freedave", draft_depth=4, rule="static", max_num_seqs=2, max_waiting=1)
    eng = llm.engine(cfg)
    sp = SamplingParams(max_new_tokens=12)
    for pr in PROMPTS[:3]:
        eng.add_request(pr, sp)
    with pytest.raises(EngineFull, match="max_num_seqs=2"):
        eng.add_request(PROMPTS[3], sp)
    seen = 0
    while eng.has_unfinished():
        eng.step()
        assert len(eng.running) <= 2
        seen = max(seen, len(eng.running))
    assert seen == 2
    eng.add_request(PROMPTS[3], sp)  # room again


def test_token_budget_same_tokens(checkpoint):
    llm = _llm(checkpoint, "bc")
    base = DecodeParams(method="spiffy", branches=8, graph=MIXED, rule="threshold", threshold=0.6)
    want = _alone(llm, base, PROMPTS, MAX_NEW)
    eng = llm.engine(base.split()[0].replace(max_num_batched_tokens=24))
    rows = []
    real = eng.runner.run

    def spy(fws):
        rows.append((len(fws), sum(f.rows for f in fws)))
        return real(fws)
    eng.runner.run = spy
    ids = [eng.add_request(p, SamplingParams(max_new_tokens=n)) for p, n in zip(PROMPTS, MAX_NEW)]
    outs = {}
    while eng.has_unfinished():
        outs.update({d.request_id: d.output for d in eng.step() if d.finished})
    assert [outs[i].token_ids for i in ids] == [w.token_ids for w in want]
    assert all(r <= 24 or n == 1 for n, r in rows) and max(n for n, _ in rows) > 1


def test_abort_frees_and_leaves_others_unchanged(checkpoint):
    llm = _llm(checkpoint, "bc_shift")
    base = DecodeParams(method="freedave", draft_depth=6, eager=True, rule="threshold", threshold=0.6,
                        early_stop=False)
    want = _alone(llm, base, PROMPTS, [24] * 5)
    eng = llm.engine(base.split()[0])
    ids = [eng.add_request(p, SamplingParams(max_new_tokens=24)) for p in PROMPTS]
    eng.step()
    eng.step()
    victim = eng.requests[ids[1]]
    assert victim.cache is not None and victim.memory_bytes() > 0
    eng.abort(ids[1])
    assert victim.cache is None and victim.memory_bytes() == 0 and victim not in eng.running
    outs = {}
    while eng.has_unfinished():
        outs.update({d.request_id: d.output for d in eng.step() if d.finished})
    assert outs[ids[1]].finish_reason == "abort"
    for i in (0, 2, 3, 4):
        assert outs[ids[i]].token_ids == want[i].token_ids
    assert eng.memory_bytes() == 0 and not eng.requests


def test_generate_reuses_the_engine_of_the_same_settings(checkpoint, tmp_path):
    """`generate` with DecodeParams runs on the engine an earlier call built for the same settings
    (its program and cost model are not rebuilt), with the tokens a fresh engine gives; other
    settings get their own engine, at most ENGINES_KEPT are kept, and a graph file rewritten since
    is read again."""
    from specfold import api
    llm = _llm(checkpoint, "bc")
    spiffy = DecodeParams(method="spiffy", branches=8, graph=MIXED, rule="threshold", threshold=0.6, max_new_tokens=16)
    first = llm.generate(PROMPTS[:2], spiffy)
    (engine,) = llm._engines.values()
    again = llm.generate(PROMPTS[2:4], spiffy.replace(seed=3))  # a sampling field: the same engine
    assert list(llm._engines.values()) == [engine] and not engine.has_unfinished()
    cfg, sp = spiffy.split()
    want = [llm.engine(cfg).run_one(p, sp).token_ids for p in PROMPTS[:4]]  # each on an engine of its own
    assert [o.token_ids for o in first + again] == want
    for k in range(1, api.ENGINES_KEPT + 1):  # other settings: engines of their own, the oldest dropped
        llm.generate(PROMPTS[:1], spiffy.replace(branches=8 - k))
    assert len(llm._engines) == api.ENGINES_KEPT and engine not in llm._engines.values()
    graph = tmp_path / "g.json"
    MIXED.save(graph)
    g = spiffy.replace(graph=str(graph))
    llm.generate(PROMPTS[:1], g)
    before = llm._engines[next(reversed(llm._engines))]
    llm.generate(PROMPTS[:1], g)
    assert llm._engines[next(reversed(llm._engines))] is before
    os.utime(graph, ns=(graph.stat().st_mtime_ns + 10**9,) * 2)  # rewritten: read again
    llm.generate(PROMPTS[:1], g)
    assert llm._engines[next(reversed(llm._engines))] is not before


# ---------------------------------------------------------------------------- deltas, stop strings
def test_deltas_stream_final_tokens_and_stop_strings(tiny_llm):
    llm = tiny_llm
    q = "Tom has 3 apples and buys 5 more. How many apples does he have now?"
    ids = llm.encode(q, SamplingParams(chat_template=True))
    full = llm.generate([q], SamplingParams(max_new_tokens=64, chat_template=True))[0]
    assert len(full.token_ids) > 16  # more than one block of the tiny model
    eng = llm.engine()
    rid = eng.add_request(ids, SamplingParams(max_new_tokens=64))
    deltas = []
    while eng.has_unfinished():
        deltas += eng.step()
    assert sum(1 for d in deltas if d.new_token_ids) >= 2 and deltas[-1].finished
    assert [t for d in deltas for t in d.new_token_ids] == full.token_ids
    assert "".join(d.text_delta for d in deltas) == full.text == deltas[-1].output.text
    # a stop string cuts the text before its first match
    word = full.text.split()[3]
    cut = full.text.index(word)
    eng.add_request(ids, SamplingParams(max_new_tokens=64, stop=["zzz", word]))
    deltas = []
    while eng.has_unfinished():
        deltas += eng.step()
    out = deltas[-1].output
    assert out.finish_reason == "stop" and out.text == full.text[:cut]
    assert "".join(d.text_delta for d in deltas) == out.text
    assert out.token_ids == full.token_ids[: len(out.token_ids)] and len(out.token_ids) < len(full.token_ids)
    assert word in llm.tokenizer.decode(out.token_ids) and word not in llm.tokenizer.decode(out.token_ids[:-1])


def test_request_params_errors(checkpoint):
    llm = _llm(checkpoint, "bc")
    eng = llm.engine()
    with pytest.raises(ParamsError, match="seed must be an integer"):
        SamplingParams(seed="x")
    with pytest.raises(ParamsError, match="stop must be"):
        SamplingParams(stop=[1])
    with pytest.raises(ParamsError, match="outside the vocabulary"):
        eng.add_request([1, 10_000], SamplingParams())
    with pytest.raises(ParamsError, match="stop strings need a tokenizer"):
        eng.add_request([1, 2], SamplingParams(stop=["a"]))
    with pytest.raises(ParamsError, match="unknown engine setting.*bogus"):
        LLM(checkpoint("qwen2", peaked=30.0, block_size=8, sub_block_size=4, **FAMILIES["bc"]), bogus=1)
    assert not eng.has_unfinished()


def test_request_fold_statistics_are_none_without_draft_positions():
    """A request whose verifications were all root-only has no fold ratio (None, not 0.0); with drafts
    the per-request ratios are the pooled counts, per layer and without layer 0."""
    from specfold.decoding.verify.fold import FoldStats
    from specfold.decoding.request import Counters
    from specfold.outputs import DecodeStats

    def report(counts):
        return FoldStats.from_counts(counts).report(0.1)
    c, st = Counters(), DecodeStats()
    c.add_fold(FoldStats([0, 0], [0, 0], [0, 0], verifications=3, root_only=3).counts())
    c.write(st, report)
    assert st.extra["fold_ratio"] is None and st.extra["fold_ratio_excl_layer0"] is None
    assert st.extra["fold_ratio_per_layer"] == [None, None] and st.extra["fold_root_only"] == 3
    c.add_fold(FoldStats([15, 2], [16, 16], [1, 1], verifications=1).counts())
    c.add_fold(FoldStats([1, 2], [16, 16], [0, 1], verifications=1).counts())
    c.write(st, report)
    assert st.extra["fold_ratio"] == 20 / 64 and st.extra["fold_ratio_excl_layer0"] == 4 / 32
    assert st.extra["fold_ratio_per_layer"] == [16 / 32, 4 / 32] and st.extra["fold_verifications"] == 5


def test_root_only_verifications_go_to_the_dense_call(checkpoint):
    """A step where some requests verify drafts and others only their root: the drafts go through
    the folded call, the root-only verifications through the dense call; the tokens are the ones each
    request decodes alone (SpecFold at δ = 0, float64)."""
    llm = _llm(checkpoint, "bc")
    base = DecodeParams(rule="threshold", threshold=0.6, draft_budget=64, **METHODS["specfold"])
    want = _alone(llm, base, PROMPTS, MAX_NEW)
    eng = llm.engine(base.split()[0])
    calls = []  # per step: (the folded call's forwards as (kind, branches), the dense call's kinds)
    v, m = eng.runner.verifier, eng.runner.model
    real_v, real_m = v.verify_many, m.forward_many
    v.verify_many = lambda fws: (calls[-1][0].extend((f.kind, f.tokens.shape[0]) for f in fws), real_v(fws))[1]
    m.forward_many = lambda fws: (calls[-1][1].extend(f.kind for f in fws), real_m(fws))[1]
    ids, outs, nxt = [], {}, 0
    while nxt < len(PROMPTS) or eng.has_unfinished():
        if nxt < len(PROMPTS):  # one more request per step: some verify their first block state alone
            ids.append(eng.add_request(PROMPTS[nxt], SamplingParams(max_new_tokens=MAX_NEW[nxt], seed=nxt)))
            nxt += 1
        calls.append(([], []))
        outs.update({d.request_id: d.output for d in eng.step() if d.finished})
    assert [outs[i].token_ids for i in ids] == [w.token_ids for w in want]
    folding = [c for c in calls if c[0]]  # the steps with a folded call
    assert all(b > 1 for folded, _ in folding for _, b in folded)  # only verifications with drafts fold
    assert any("verify" in dense for folded, dense in folding)  # root-only ones beside them: the dense call
