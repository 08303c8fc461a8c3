"""The paged KV cache (issue 41), in float64 on the CPU, against independent references:

- paging: the engine's tokens equal the cache-free recomputation (tests/reference_decode.py) for
  vanilla, FreeDave, Spiffy and SpecFold at delta 0, with KV blocks that do and do not divide the
  diffusion block, prompts that end mid-block, alone and in a batch; the causal programs equal a
  cache-free greedy AR;
- forced preemption: a pool sized for about two requests, 16 requests (behind one that holds the
  pool's oldest place), each preempted at least once, all complete with the tokens of a run with
  memory to spare, per method and family;
- prefix caching: 16 requests sharing a long system prompt hit the cache, with the tokens of
  caching off; eviction is least recently used and never takes a referenced block;
- limits: a request larger than the pool is one line when added.
"""
from __future__ import annotations

import pytest
import torch

from specfold import LLM, DecodeParams, EngineConfig, SamplingParams
from specfold.errors import ConfigError, ParamsError
from specfold.models.pool import BlockPool
from tests.reference_decode import reference_decode
from tests.test_static_shapes import METHODS, MIXED  # the same methods and graph

FAMILIES = {  # block 8: KV blocks of 3 and 5 do not divide it, 4 and 16 do (16 spans two)
    "bc": ("qwen2", dict(attention="block_causal")),
    "bc_shift": ("qwen2", dict(attention="block_causal", logits_shift=True, seed_token=True)),
    "sdar": ("qwen3", dict(attention="block_causal")),
}
PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15, 16], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30], [40],
           [50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63]]
MAX_NEW = [16, 9, 21, 12, 13]


def _llm(checkpoint, family):
    kind, kw = FAMILIES[family]
    return LLM(checkpoint(kind, peaked=30.0, block_size=8, sub_block_size=4, **kw), dtype="float64")


def _bytes(llm, bs: int, blocks: int) -> int:
    s = llm.model.spec
    return blocks * 2 * s.num_layers * s.num_kv_heads * s.head_dim * bs * llm.model.dtype.itemsize


def _run(llm, cfg: EngineConfig, prompts, max_new, first=None):
    """Every request through one engine (after `first`, which then holds the oldest place). A pool of
    4096 blocks unless the test sizes it (the CPU default, an eighth of the RAM, is millions of blocks
    here, and the check below walks them all after every step)."""
    if cfg.kv_cache_memory is None:
        cfg = cfg.replace(kv_cache_memory=_bytes(llm, cfg.kv_block_size, 4096))
    eng = llm.engine(cfg)
    jobs = ([first] if first else []) + list(zip(prompts, max_new))
    ids = [eng.add_request(p, SamplingParams(max_new_tokens=n, seed=i)) for i, (p, n) in enumerate(jobs)]
    outs = {}
    while eng.has_unfinished():
        for d in eng.step():
            if d.finished:
                outs[d.request_id] = d.output
        if eng.pool is not None:
            assert sum(eng.pool.refs) == sum(len(r.cache.blocks) for r in eng.running if r.cache)
    got = [outs[i] for i in ids]
    return (got[1:] if first else got), eng


# ---------------------------------------------------------------------------- paging
@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_paging_equals_cache_free_reference(checkpoint, family, method):
    if METHODS[method].get("eager") and family != "bc":
        pytest.skip("one family is enough for eager windows here")
    llm = _llm(checkpoint, family)
    base = DecodeParams(rule="static", draft_budget=64, **METHODS[method])
    want = [reference_decode(llm.model, llm.spec, base.replace(method="vanilla", max_new_tokens=n), p)
            for p, n in zip(PROMPTS, MAX_NEW)]
    cfg, _ = base.split()
    for bs in (3, 4, 5, 16):
        got, eng = _run(llm, cfg.replace(kv_block_size=bs, enable_prefix_caching=False), PROMPTS, MAX_NEW)
        assert [g.token_ids for g in got] == want, (bs, [g.token_ids for g in got])
        assert eng.pool.used_blocks == 0 and 0 < eng.pool.peak
        alone, _ = _run(llm, cfg.replace(kv_block_size=bs), PROMPTS[2:3], MAX_NEW[2:3])
        assert alone[0].token_ids == want[2]


@pytest.fixture(scope="module")
def nld(tmp_path_factory):
    from tests.causal_helpers import nld_checkpoint
    folder = nld_checkpoint(tmp_path_factory.mktemp("nld"), focus=2.0, mask_like=15, mask_mix=0.7, layer_scale=0.6)
    return LLM(folder, dtype="float64", overrides={"stop_token_ids": [94]})


def _greedy_ar(llm, prompt: list[int], n: int) -> list[int]:
    """Cache-free greedy AR: the whole sequence through a causal forward per token."""
    seq, M, stop = list(prompt), llm.spec.mask_token_id, set(llm.spec.stop_token_ids)
    with torch.inference_mode():
        for _ in range(n):
            pos = torch.arange(len(seq))
            lg = llm.model(torch.tensor(seq)[None], pos, mask=pos[:, None] >= pos[None, :], head="ar")[0, -1]
            lg[M] = float("-inf")
            t = int(lg.argmax())
            if t in stop:
                break
            seq.append(t)
    return seq[len(prompt):]


@pytest.mark.parametrize("method", ["ar", "linear_spec", "linear_spec_multi", "linear_specfold"])
def test_causal_programs_equal_cache_free_ar(nld, method):
    prompts, max_new = PROMPTS[:4], [19, 7, 19, 12]
    want = [_greedy_ar(nld, p, n) for p, n in zip(prompts, max_new)]
    cfg = EngineConfig(method=method, threshold=0.5, branches=4, delta=0.0, draft_budget=64)
    for bs in (1, 3, 4):
        got, _ = _run(nld, cfg.replace(kv_block_size=bs), prompts, max_new)
        assert [g.token_ids for g in got] == want, bs


# ---------------------------------------------------------------------------- preemption
SIXTEEN = [[(7 * i + j) % 90 + 1 for j in range(15 - (5 * i) % 13)] for i in range(16)]
SIXTEEN_NEW = [40 - (3 * i) % 17 for i in range(16)]
FIRST = (list(range(1, 21)), 48)  # holds the oldest place: the pool is sized for it and one more


def _preempted(llm, cfg: EngineConfig, bs: int = 4, prompts=SIXTEEN, max_new=SIXTEEN_NEW, first=FIRST,
               slack: int = 0, spared: int = 0):
    """The tokens of a pool just larger than the largest request's refusal bound (prompt +
    max_new_tokens + 2 blocks: about two requests' working sets) and of one with room to spare; every
    one of the 16 was preempted (all but `spared`: where a request can finish before the pool is
    short with it the most recent)."""
    N = cfg.block_size or llm.spec.block_size
    blocks = max(-(-(len(p) + n + N) // bs) for p, n in [first] + list(zip(prompts, max_new))) + 1 + slack
    want, _ = _run(llm, cfg, prompts, max_new, first)
    got, eng = _run(llm, cfg.replace(kv_block_size=bs, kv_cache_memory=_bytes(llm, bs, blocks)), prompts, max_new,
                    first)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert [g.finish_reason for g in got] == [w.finish_reason for w in want]
    pre = [g.stats.extra["preemptions"] for g in got]
    assert sum(1 for n in pre if n == 0) <= spared and eng.kv.preemptions == sum(pre), pre
    assert eng.pool.used_blocks == 0
    return got


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_forced_preemption_same_tokens(checkpoint, family, method):
    if METHODS[method].get("eager") and family != "bc":
        pytest.skip("one family is enough for eager windows here")
    llm = _llm(checkpoint, family)
    _preempted(llm, EngineConfig(rule="static", draft_budget=64, **METHODS[method]))


def test_forced_preemption_sampling(checkpoint):
    """At temperature > 0 too (the noise is keyed by position and state, not by the forward)."""
    llm = _llm(checkpoint, "bc_shift")
    cfg = EngineConfig(rule="threshold", threshold=0.6, method="spiffy", graph=MIXED, draft_budget=64)
    eng_kw = dict(kv_block_size=4, kv_cache_memory=_bytes(llm, 4, 20))
    outs = []
    for c in (cfg, cfg.replace(**eng_kw)):
        eng = llm.engine(c)
        ids = [eng.add_request(p, SamplingParams(max_new_tokens=n, seed=i, temperature=0.9))
               for i, (p, n) in enumerate([FIRST] + list(zip(SIXTEEN, SIXTEEN_NEW)))]
        done = {}
        while eng.has_unfinished():
            done.update({d.request_id: d.output.token_ids for d in eng.step() if d.finished})
        outs.append([done[i] for i in ids])
    assert outs[0] == outs[1] and eng.kv.preemptions >= 16


@pytest.mark.parametrize("method", ["vanilla", "ar", "linear_spec", "linear_spec_multi"])
def test_forced_preemption_nld(nld, method):
    """Nemotron-Labs-Diffusion: the block program (blocks after the prompt, causal prefix) and the
    causal programs."""
    mx = 32 if method == "vanilla" else None  # its diffusion mode decodes whole blocks (of 4)
    new = [mx] * 16 if mx else SIXTEEN_NEW
    cfg = EngineConfig(method=method, threshold=0.5, branches=4, draft_budget=64)
    first = (list(range(1, 61)), 40) if method != "vanilla" else FIRST  # AR grows one token at a time
    _preempted(nld, cfg, prompts=SIXTEEN, max_new=new, first=first,
               spared=int(method == "linear_spec_multi"))  # its rounds end the first request early


def test_forced_preemption_llada2(tmp_path_factory):
    """LLaDA2 (`llada2`, `llada2_edit`): the tokens of a run with room to spare. Its blocks of 32
    commit whole, so a request holds few blocks for few steps and not all 16 meet a short pool as the
    most recent (at least 4 do, in both rules)."""
    from tests import llada2_checkpoint as C
    folder, c, _ = C.make(tmp_path_factory.mktemp("l2p") / "ckpt", seed=0, head_scale=4.0, eos_boost=1.0)
    llm = LLM(folder, dtype="float64", overrides=C.overrides(c))
    prompts = [[(5 * i + j) % (c["vocab_size"] - 3) + 1 for j in range(3 + (5 * i) % 13)] for i in range(16)]
    for rule in ("llada2", "llada2_edit"):
        kw = dict(threshold=0.7, edit_threshold=0.5, max_post_steps=4) if rule == "llada2_edit" else {}
        _preempted(llm, EngineConfig(rule=rule, **kw), prompts=prompts, max_new=[64 + 8 * (i % 5) for i in range(16)],
                   first=(prompts[0] * 6, 96), slack=0, spared=12)  # blocks of 32: 2-3 commits a request


# ---------------------------------------------------------------------------- prefix caching
SYSTEM = [(11 * j) % 89 + 2 for j in range(45)]  # ends mid-block of 8 and mid-block of 4
SHARED = [SYSTEM + [(3 * i + j) % 80 + 5 for j in range(1 + i % 6)] for i in range(16)]


@pytest.mark.parametrize("family,method", [("bc", "vanilla"), ("bc_shift", "spiffy"), ("sdar", "specfold"),
                                           ("bc", "freedave_eager")])
def test_prefix_caching_same_tokens_and_hits(checkpoint, family, method):
    llm = _llm(checkpoint, family)
    cfg = EngineConfig(rule="static", draft_budget=64, kv_block_size=4, **METHODS[method])
    new = [6 + i % 11 for i in range(16)]
    off, _ = _run(llm, cfg.replace(enable_prefix_caching=False), SHARED, new)
    on, eng = _run(llm, cfg, SHARED, new)
    assert [g.token_ids for g in on] == [w.token_ids for w in off]
    hits = [g.stats.extra["prefix_cache_hit_tokens"] for g in on]
    assert hits[0] == 0 and min(hits[1:]) == 40  # 40 = the system prompt's whole blocks of 8 (K/V groups)
    assert eng.kv.hits == sum(hits) and eng.kv.queries == sum(len(p) for p in SHARED)
    assert [g.stats.extra["prefix_cache_hit_tokens"] for g in off] == [0] * 16
    # one at a time: every later request also hits the generated blocks of equal earlier requests
    again, eng2 = _run(llm, cfg, SHARED[:1] * 2, new[:1] * 2)
    assert again[0].token_ids == again[1].token_ids == off[0].token_ids


@pytest.mark.parametrize("method", ["vanilla", "ar", "linear_spec_multi"])
def test_prefix_caching_nld(nld, method):
    mx = 16 if method == "vanilla" else 12
    cfg = EngineConfig(method=method, threshold=0.5, branches=4, draft_budget=64, kv_block_size=4)
    off, _ = _run(nld, cfg.replace(enable_prefix_caching=False), SHARED, [mx] * 16)
    on, eng = _run(nld, cfg, SHARED, [mx] * 16)
    assert [g.token_ids for g in on] == [w.token_ids for w in off]
    assert min(g.stats.extra["prefix_cache_hit_tokens"] for g in on[1:]) == 44  # causal: every whole block


def test_prefix_caching_with_preemption(checkpoint):
    """A tight pool, shared prefixes, preemptions and evictions: the tokens of caching off."""
    llm = _llm(checkpoint, "bc_shift")
    cfg = EngineConfig(method="spiffy", graph=MIXED, rule="static", draft_budget=64, kv_block_size=4)
    new = [6 + i % 11 for i in range(16)]
    off, _ = _run(llm, cfg.replace(enable_prefix_caching=False), SHARED, new)
    on, eng = _run(llm, cfg.replace(kv_cache_memory=_bytes(llm, 4, 40)), SHARED, new)
    assert [g.token_ids for g in on] == [w.token_ids for w in off]
    assert eng.kv.preemptions > 0 and eng.kv.hits > 0


def test_eviction_is_lru_and_spares_referenced_blocks():
    pool = BlockPool(1, 1, 2, torch.float64, "cpu", 6, 2)  # 5 usable blocks
    a = pool.take(3)
    for b, key in zip(a, (b"x", b"y", b"z")):
        pool.register(b, key)
    pool.drop(a[:2])  # x, y cached and idle (in that order); z referenced
    assert pool.free_blocks == 4 and pool.cached_blocks == 3
    pool.share(pool.lookup(b"x"))  # x referenced again: no longer evictable
    got = pool.take(3)  # 2 never-cached blocks, then the least recently used idle one (y)
    assert got is not None and a[1] in got and a[0] not in got and a[2] not in got
    assert pool.lookup(b"y") is None and pool.lookup(b"x") == a[0] and pool.lookup(b"z") == a[2]
    assert pool.take(1) is None  # only referenced blocks are left


def test_prefix_caching_settings(checkpoint):
    bidir = LLM(checkpoint("llama", attention="bidirectional"), dtype="float64")
    assert bidir.engine(EngineConfig()).kv.keys is None and bidir.engine(EngineConfig()).pool is None
    with pytest.raises(ConfigError, match="enable_prefix_caching is not exact here: .* without a KV cache"):
        bidir.engine(EngineConfig(enable_prefix_caching=True))
    llm = _llm(checkpoint, "bc")
    with pytest.raises(ConfigError, match="SpecFold at delta > 0"):
        llm.engine(EngineConfig(method="specfold", graph=MIXED, eager=True, delta=0.1, enable_prefix_caching=True))
    assert llm.engine(EngineConfig(method="specfold", graph=MIXED, eager=True, delta=0.1)).kv.keys is None


# ---------------------------------------------------------------------------- limits
def test_too_large_request_is_one_line(checkpoint):
    llm = _llm(checkpoint, "bc")
    eng = llm.engine(EngineConfig(kv_block_size=4, kv_cache_memory=_bytes(llm, 4, 9)))  # 8 usable blocks
    eng.add_request([1, 2, 3, 4], SamplingParams(max_new_tokens=20))  # 4 + 20 + 8 = 32 = 8 blocks
    with pytest.raises(ParamsError) as e:
        eng.add_request([1, 2, 3, 4, 5], SamplingParams(max_new_tokens=20))
    msg = str(e.value)
    assert "\n" not in msg and "of KV cache (9 blocks: prompt 5 + max_new_tokens 20 + a block of 8)" in msg, msg
    assert "the KV pool has 16.0 KiB (8 blocks); lower max_new_tokens or raise kv_cache_memory" in msg, msg
    with pytest.raises(ConfigError, match="holds 1 blocks .* it needs at least 2"):
        llm.engine(EngineConfig(kv_block_size=4, kv_cache_memory=_bytes(llm, 4, 1) + 1))
    with pytest.raises(ParamsError, match="kv_cache_memory must be a positive number of bytes"):
        EngineConfig(kv_cache_memory="lots")
    assert EngineConfig(kv_cache_memory="2GiB").kv_cache_memory == 2 * 2**30
    assert EngineConfig(kv_cache_memory="1.5 MB").kv_cache_memory == 1_500_000
