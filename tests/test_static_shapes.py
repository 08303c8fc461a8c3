"""Static shapes (EngineConfig(static_shapes=True)): the pooled KV cache, bucket padding, the padded
forward. Everything in float64 on the CPU, where the same padded function runs without a graph:

- the window masks of models/static.py equal decoding/layout.py's for every kind, padded or not;
- the padded forward (several forwards of different prefix lengths, branch counts, window lengths,
  heads, with cache writes) equals `forward_many`: logits and the written K/V;
- the engine with static shapes gives the same tokens and the same forward counts as without, for
  every method (SpecFold's folded verifications stay eager, its other forwards are static), under
  the native and the static rule, alone and 8 at once, and for the causal programs;
- the paged pool's blocks come back on finish and abort; bad settings are one clear error.
"""
from __future__ import annotations

import pytest
import torch

from specfold import LLM, EngineConfig, SamplingParams
from specfold.decoding.drafts.graph import DraftGraph, Node
from specfold.decoding.jobs import Job
from specfold.decoding.layout import build_mask
from specfold.decoding.readout import Read
from specfold.engine.buckets import bucket, mask_code
from specfold.engine.graphs import StaticRunner
from specfold.errors import ConfigError, ParamsError
from specfold.models.forward import Forward
from specfold.models.pool import BlockPool
from specfold.models.static import META, window_masks

MIXED = DraftGraph([Node(0, ((0, 0),)), Node(1, ((0, 0),)), Node(0, ((1, 0),)), Node(0, ((0, 1),)),
                    Node(2, ((0, 0), (1, 0))), Node(0, ((0, 0), (1, 0))), Node(3, ((0, 0),))])
PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15, 16], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30], [40],
           [50, 51, 52, 53, 54, 55], [60, 61], [70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83], [33, 34, 35, 36]]
MAX_NEW = [16, 9, 21, 12, 5, 24, 8, 16]
METHODS = {
    "vanilla": dict(method="vanilla"),
    "freedave": dict(method="freedave", draft_depth=6),
    "freedave_eager": dict(method="freedave", draft_depth=6, eager=True),
    "spiffy": dict(method="spiffy", branches=7, graph=MIXED),
    "specfold": dict(method="specfold", drafts="spiffy", branches=7, graph=MIXED, delta=0.0),
}


# ---------------------------------------------------------------------------- masks
@pytest.mark.parametrize("desc", [None, ("block", 4, 0), ("block", 8, 3), ("causal",), ("pending", 3), ("pending", 0)])
def test_window_masks_equal_layout(desc):
    for start, t, T in ((0, 5, 5), (6, 7, 12), (13, 3, 4)):
        meta = torch.tensor([[start, 0, t, *mask_code(desc)]])
        got = window_masks(meta, T)[0]
        pos = torch.arange(start, start + t)
        want = build_mask(desc, pos)
        want = torch.ones(t, t, dtype=torch.bool) if want is None else want
        assert torch.equal(got[:t, :t], want), (desc, start, t)
        assert not got[:t, t:].any()  # a real row never sees a padded one
        assert torch.equal(got[t:, :], torch.eye(T, dtype=torch.bool)[t:])  # padded rows see themselves


def test_bucket_ladder():
    assert [bucket(n) for n in (1, 3, 5, 7, 9, 13, 17, 33, 100)] == [1, 3, 6, 8, 12, 16, 24, 48, 128]
    assert bucket(3, lo=16) == 16


# ---------------------------------------------------------------------------- the padded forward
def _forward_cases(llm, g):
    """Jobs over caches of one paged pool with blocks of 3 (prefix lengths 0..13) and the same
    forwards over private caches with blocks of 16."""
    m, N = llm.model, 4
    pool = BlockPool.for_model(m, 64, 3)
    cases = ((8, 3, 8, "verify", ("block", N, 0), "rows"), (0, 1, 5, "prefill", ("causal",), "at"),
             (13, 1, 8, "commit", ("block", N, 0), "at"), (4, 5, 8, "verify", None, "all"),
             (2, 3, 8, "verify", ("pending", 3), "rows"), (6, 1, 8, "commit", None, None),
             (9, 4, 5, "verify", ("block", N, 1), "at"))
    jobs, refs = [], []
    for P, B, T, kind, desc, head in cases:
        slot, plain = pool.new_cache(), m.new_cache(64)
        if P:
            pre = torch.randint(0, 90, (1, P), generator=g)
            for c in (slot, plain):
                m(pre, torch.arange(P), cache=c, write_cache=True)
        toks = torch.randint(0, 95, (B, T), generator=g).tolist()
        at = rows = None
        if head == "at":
            at = [0, T - 1, T // 2]
        elif head == "rows":
            rows = sorted({b * T + t for b in range(B) for t in (0, b % T, T - 1)})
        write = kind != "verify"
        if write:
            assert slot.reserve(T)  # the engine takes a write's blocks before the step
        read = None if head is None else Read()
        jobs.append(Job(toks, P, slot, desc, write, at, rows, kind=kind, read=read))
        pos = torch.arange(P, P + T)
        refs.append(Forward(torch.tensor(toks), pos, plain, build_mask(desc, pos), write,
                            None if at is None else torch.tensor(at), kind=kind,
                            head_rows=None if rows is None else torch.tensor(rows)))
    return pool, jobs, refs


def test_padded_forward_equals_forward_many(checkpoint):
    llm = LLM(checkpoint("qwen3"), dtype="float64")
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        pool, jobs, refs = _forward_cases(llm, g)
        runner = StaticRunner(llm.model, pool)
        groups = runner.plan(jobs, list(range(len(jobs))))
        assert sorted(g.key[3] for g in groups) == [6, 8]  # two window buckets; T=5 padded to 6
        big = next(g for g in groups if g.key[3] == 8)
        R, G, B, T, P = big.key
        assert (G, B, P) == (6, 6, 16) and R > sum(len(jobs[i].tokens) * 8 for i in big.jobs)  # all padded
        flat = []
        for grp in groups:
            grp.offset = len(flat)
            flat += grp.ints
        buf = torch.tensor(flat)
        got = {}
        for grp in groups:
            got.update(zip(grp.jobs, runner.run(grp, buf)))
        runner.commit(jobs, groups)
        want = llm.model.forward_many(refs)
    for i, (j, w, f) in enumerate(zip(jobs, want, refs)):
        if j.read is None:
            assert got[i] is None
            continue
        assert got[i].shape == w.logits.shape, i
        torch.testing.assert_close(got[i], w.logits, rtol=1e-10, atol=1e-10)
        assert j.cache.length == f.cache.length, i
        n = f.cache.length
        torch.testing.assert_close(j.cache.k[:, :, :n], f.cache.k[:, :, :n], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(j.cache.v[:, :, :n], f.cache.v[:, :, :n], rtol=1e-12, atol=1e-12)
    assert pool.used_blocks == sum(len(j.cache.blocks) for j in jobs) > 0


# ---------------------------------------------------------------------------- the engine
def _run(llm, config: EngineConfig, prompts, max_new, temps=None):
    eng = llm.engine(config)
    ids = [eng.add_request(p, SamplingParams(max_new_tokens=n, seed=i, temperature=temps[i] if temps else 0.0))
           for i, (p, n) in enumerate(zip(prompts, max_new))]
    outs = {}
    while eng.has_unfinished():
        for d in eng.step():
            if d.finished:
                outs[d.request_id] = d.output
    return [outs[i] for i in ids], eng


@pytest.fixture(scope="module")
def bc(checkpoint):
    return LLM(checkpoint("qwen2", peaked=30.0, block_size=8, sub_block_size=4, attention="block_causal"),
               dtype="float64")


@pytest.mark.parametrize("rule", [None, "static"])
@pytest.mark.parametrize("method", list(METHODS))
def test_engine_same_tokens_and_forwards(bc, method, rule):
    base = EngineConfig(rule=rule, draft_budget=64, max_num_seqs=8, **METHODS[method])
    for prompts, max_new in ((PROMPTS[:1], MAX_NEW[:1]), (PROMPTS, MAX_NEW)):
        want, _ = _run(bc, base, prompts, max_new)
        got, eng = _run(bc, base.replace(static_shapes=True, kv_block_size=3), prompts, max_new)
        assert [g.token_ids for g in got] == [w.token_ids for w in want], (method, rule, len(prompts))
        assert [g.stats.nfe for g in got] == [w.stats.nfe for w in want]
        assert [g.finish_reason for g in got] == [w.finish_reason for w in want]
        assert eng.pool.used_blocks == 0
    assert eng.runner.static.forwards > 0  # (eager windows: prefills only; their verifications return hidden states)


@pytest.mark.parametrize("method", ["vanilla", "spiffy"])
def test_engine_same_samples(bc, method):
    """At temperature > 0 (noise keyed by each request's seed and rows) the samples are the same too."""
    base = EngineConfig(rule="static", draft_budget=64, max_num_seqs=8, **METHODS[method])
    temps = [0.8, 1.0, 0.0, 0.5, 1.2, 0.7, 0.9, 0.3]
    want, _ = _run(bc, base, PROMPTS, MAX_NEW, temps)
    got, _ = _run(bc, base.replace(static_shapes=True, kv_block_size=5), PROMPTS, MAX_NEW, temps)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]


@pytest.fixture(scope="module")
def nld(tmp_path_factory):
    from tests.causal_helpers import nld_checkpoint  # (transformers: not needed by the CUDA test)
    folder = nld_checkpoint(tmp_path_factory.mktemp("nld"), focus=2.0, mask_like=15, mask_mix=0.7, layer_scale=0.6)
    return LLM(folder, dtype="float64", overrides={"stop_token_ids": [94]})


@pytest.mark.parametrize("method", ["ar", "linear_spec", "linear_spec_multi", "linear_specfold"])
def test_causal_programs_same_tokens(nld, method):
    base = EngineConfig(method=method, threshold=0.5, branches=4, delta=0.0, draft_budget=64)
    prompts, max_new = PROMPTS[:5], [19, 7, 19, 12, 19]
    want, _ = _run(nld, base, prompts, max_new)
    got, eng = _run(nld, base.replace(static_shapes=True, kv_block_size=3), prompts, max_new)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert [g.stats.nfe for g in got] == [w.stats.nfe for w in want]
    assert eng.runner.static.forwards > 0


def test_blocks_freed_on_finish_and_abort(bc):
    """30 requests, 3 at once, some aborted while running or waiting: no block leaks, and reused
    blocks (stale K/V past each new length) give the same tokens as private caches."""
    cfg = EngineConfig(method="spiffy", graph=MIXED, max_num_seqs=3, draft_budget=64)
    eng = bc.engine(cfg.replace(static_shapes=True, kv_block_size=4, kv_cache_memory=_bytes(bc, 4, 40)))
    plain = bc.engine(cfg)
    prompts = [PROMPTS[i % 8] for i in range(30)]
    ids = [eng.add_request(p, SamplingParams(max_new_tokens=8 + i % 9)) for i, p in enumerate(prompts)]
    done = {}
    step = 0
    while eng.has_unfinished():
        if step in (2, 5, 9):
            running = [r.id for r in eng.running]
            eng.abort(running[0])  # a running request
            eng.abort(eng.waiting[-1].id)  # a waiting one (it has no blocks)
        for d in eng.step():
            if d.finished and d.finish_reason != "abort":
                done[d.request_id] = d.output.token_ids
        assert sum(eng.pool.refs) == sum(len(r.cache.blocks) for r in eng.running)
        step += 1
    assert eng.pool.used_blocks == 0 and len(done) == 24
    for rid, p, i in zip(ids, prompts, range(30)):
        if rid in done:
            assert done[rid] == plain.run_one(p, SamplingParams(max_new_tokens=8 + i % 9)).token_ids


def test_settings_errors(bc, checkpoint):
    assert EngineConfig(cuda_graphs=True).static_shapes is True
    with pytest.raises(ConfigError, match="cuda_graphs=True needs the model on a CUDA device"):
        bc.engine(EngineConfig(cuda_graphs=True))
    with pytest.raises(ParamsError, match="static_shapes must be true or false"):
        EngineConfig(static_shapes="yes")
    eng = bc.engine(EngineConfig(static_shapes=True, kv_block_size=4, kv_cache_memory=_bytes(bc, 4, 8)))
    assert eng.pool.usable == 7  # one block is scratch
    eng.add_request([1, 2, 3, 4], SamplingParams(max_new_tokens=16))  # 4 + 16 + 8 = 28 = 7 blocks
    with pytest.raises(ParamsError, match=r"needs .* \(8 blocks: prompt 5 \+ max_new_tokens 16 \+ a block of 8\) "
                                          r"and the KV pool has .* \(7 blocks\); lower max_new_tokens"):
        eng.add_request([1, 2, 3, 4, 5], SamplingParams(max_new_tokens=16))
    bidir = LLM(checkpoint("llama", attention="bidirectional"), dtype="float64")
    with pytest.raises(ConfigError, match="static_shapes=True is not supported for this model: .* without a KV"):
        bidir.engine(EngineConfig(static_shapes=True))


def _bytes(llm, bs: int, blocks: int) -> int:
    """kv_cache_memory for a pool of `blocks` blocks of `bs` positions (one of them scratch)."""
    s = llm.model.spec
    return blocks * 2 * s.num_layers * s.num_kv_heads * s.head_dim * bs * llm.model.dtype.itemsize


def test_paged_cache_blocks_and_slots():
    pool = BlockPool(2, 1, 4, torch.float64, "cpu", 4, 2)  # 3 usable blocks of 2 positions
    c = pool.new_cache()
    f64 = dict(dtype=torch.float64)
    c.write(1, torch.ones(1, 3, 4, **f64), torch.full((1, 3, 4), 2.0, **f64))
    c.commit_write()
    assert c.length == 3 and c.blocks == [1, 2] and pool.free_blocks == 1
    assert c.slots[:3].tolist() == [2, 3, 4]
    assert c.k[1].eq(1).all() and c.v[1].eq(2).all() and c.view(1)[0].shape == (1, 3, 4)
    assert not c.reserve(4) and c.blocks == [1, 2]  # 7 positions need 4 blocks: nothing taken
    c.truncate(2)
    assert c.blocks == [1] and pool.free_blocks == 2
    with pytest.raises(RuntimeError, match="no free block"):
        c.write(0, torch.ones(1, 8, 4, **f64), torch.ones(1, 8, 4, **f64))
    c.release()
    c.release()  # once only
    assert pool.free_blocks == 3 and pool.k[:, :, :2].eq(0).all()  # the scratch block stays zero
    assert META == 6


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    from specfold.cli import main
    try:
        rc = main(list(argv))
    except SystemExit as e:
        rc = e.code
    got = capsys.readouterr()
    return rc, got.out, got.err.strip()


def test_cli_flags(capsys):
    """`specfold generate --static-shapes` prints what the default engine prints; --cuda-graphs on the
    CPU and a request larger than --kv-cache-memory are one line, exit 2."""
    base = ("generate", "--prompt", "What is 7 + 8?", "--max-new-tokens", "16", "--method", "spiffy", "--quiet-stats")
    rc, plain, _ = _cli(capsys, *base)
    rc2, static, _ = _cli(capsys, *base, "--static-shapes")
    assert rc == rc2 == 0 and static == plain and plain.strip()
    for extra, message in ((("--cuda-graphs",), "error: cuda_graphs=True needs the model on a CUDA device, not 'cpu'"),
                           (("--static-shapes", "--kv-cache-memory", "150KiB"), "of KV cache (")):
        rc, _, err = _cli(capsys, *base, *extra)
        assert rc == 2 and len(err.splitlines()) == 1 and message in err and "Traceback" not in err, err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device (benchmarks/gpu_run.sh runs this)")
@pytest.mark.parametrize("method", ["vanilla", "spiffy", "specfold"])
def test_cuda_graphs_same_tokens_float64(method):
    """On a GPU, in float64 (the tiny model): the captured graphs give the eager engine's tokens and
    forward counts; a second run on the same engine replays without capturing again."""
    llm = LLM("tiny", dtype="float64", device="cuda")
    base = EngineConfig(draft_budget=64, max_num_seqs=8, **METHODS[method])
    want, _ = _run(llm, base, PROMPTS, MAX_NEW)
    eng = llm.engine(base.replace(cuda_graphs=True, kv_block_size=5))
    for rnd in range(2):
        ids = [eng.add_request(p, SamplingParams(max_new_tokens=n, seed=i)) for i, (p, n) in enumerate(zip(PROMPTS, MAX_NEW))]
        outs = {}
        captured = eng.runner.static.captures
        while eng.has_unfinished():
            for d in eng.step():
                if d.finished:
                    outs[d.request_id] = d.output
        assert [outs[i].token_ids for i in ids] == [w.token_ids for w in want], rnd
        assert [outs[i].stats.nfe for i in ids] == [w.stats.nfe for w in want], rnd
        assert eng.runner.static.captures > 0
        if rnd == 1:
            assert eng.runner.static.captures == captured  # the same buckets: replays only
    assert eng.pool.free_slots == 8
