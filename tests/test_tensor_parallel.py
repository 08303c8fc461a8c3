"""Tensor and expert parallelism (models/parallel.py, engine/mirror.py, executor/): with
`tensor_parallel_size=2` (two local processes, gloo, float64 on the CPU) every method decodes the
tokens one rank decodes, on the embedded model and on random checkpoints of each attention layout,
one request at a time and in a batch; each rank holds its shard only; the ranks reach the same fold
decisions; a bad size is one line before anything starts; a rank that dies ends the request set with
one line.
"""
from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from specfold import LLM, DecodeParams, EngineConfig, SamplingParams
from specfold.decoding.drafts.graph import DraftGraph, Node
from specfold.errors import ConfigError, DistributedError, ParamsError
from specfold.models.parallel import parameter_bytes

pytestmark = pytest.mark.slow  # ranks in other processes: minutes in all

QUESTIONS = ["What is 3 + 4?", "Count from 5 to 9.", "Name a colour.", "What is 12 - 5?"]
METHODS = {
    "vanilla": dict(method="vanilla"),
    "freedave": dict(method="freedave", draft_budget=2),
    "freedave_auto": dict(method="freedave", draft_budget="auto"),
    "spiffy": dict(method="spiffy", draft_budget=2),
    "spiffy_auto": dict(method="spiffy", draft_budget="auto"),
    "specfold": dict(method="specfold", delta=0.0, draft_budget=2),
    "specfold_auto": dict(method="specfold", delta=0.0, draft_budget="auto"),
    "specfold_eager": dict(method="specfold", delta=0.0, draft_budget=2, eager=True),
}


@pytest.fixture(scope="module")
def tiny(tiny_llm64):
    one = tiny_llm64
    two = LLM("tiny", dtype="float64", tensor_parallel_size=2)
    yield one, two
    two.close()


def _ids(llm, prompts, params):
    return [o.token_ids for o in llm.generate(prompts, params)]


@pytest.mark.parametrize("name", list(METHODS))
def test_tiny_model_tokens_equal_one_rank(tiny, name):
    one, two = tiny
    p = DecodeParams(chat_template=True, max_new_tokens=32, rule="static", **METHODS[name])
    batch = _ids(one, QUESTIONS, p)
    assert sum(map(len, batch)) > 40  # real answers, not an immediate stop
    assert _ids(two, QUESTIONS, p) == batch  # in a batch
    assert [_ids(two, [q], p)[0] for q in QUESTIONS[:2]] == batch[:2]  # one request at a time


def test_each_rank_holds_its_shard_only(tiny):
    one, two = tiny
    full = parameter_bytes(one.model)
    replicated = sum(p.numel() * p.element_size() for n, p in one.model.named_parameters()
                     if n.startswith(("embed", "lm_head", "norm")) or "norm" in n)
    want = replicated + (full - replicated) // 2
    assert two.ranks.param_bytes == [want, want]
    assert parameter_bytes(two.model) == want


def test_static_shapes_under_tensor_parallelism(tiny):
    one, two = tiny
    cfg = EngineConfig(method="spiffy", draft_budget=2, static_shapes=True, max_num_seqs=4)
    sp = SamplingParams(chat_template=True, max_new_tokens=24)

    def run(llm):
        eng = llm.engine(cfg)
        outs = eng.run_all([llm.encode(q, sp) for q in QUESTIONS[:3]], [sp] * 3)
        assert eng.runner.static.forwards > 0  # the padded static forward ran
        return [o.token_ids for o in outs]
    assert run(two) == run(one)


def test_a_size_that_does_not_divide_is_one_line_before_any_rank_starts():
    with pytest.raises(ConfigError, match=r"tensor_parallel_size=3 does not divide .*sizes that divide every "
                                          r"sharded dimension: 1, 2$"):
        LLM("tiny", tensor_parallel_size=3)
    with pytest.raises(ParamsError, match="distributed_executor_backend 'threads' is not supported"):
        LLM("tiny", tensor_parallel_size=2, distributed_executor_backend="threads")
    with pytest.raises(ParamsError, match="needs a mixture-of-experts checkpoint"):
        LLM("tiny", tensor_parallel_size=2, enable_expert_parallel=True)


# ---------------------------------------------------------------------------------------- layouts
LAYOUTS = {  # random checkpoints (tests/hf_reference.py) under each attention layout
    "qwen2_block_causal": ("qwen2", dict(attention="block_causal")),
    "qwen3_tied_qk_norm": ("qwen3", dict(attention="block_causal", logits_shift=True, seed_token=True)),
    "llama_bidirectional": ("llama", dict(attention="bidirectional")),
}
PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15, 16, 17], [40]]
MIXED = DraftGraph([Node(0, ((0, 0),)), Node(1, ((0, 0),)), Node(0, ((1, 0),)), Node(0, ((0, 1),)),
                    Node(2, ((0, 0), (1, 0))), Node(0, ((0, 0), (1, 0))), Node(3, ((0, 0),)), Node(4, ((2, 1),))])


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_random_checkpoints_of_each_layout(checkpoint, layout):
    kind, fam = LAYOUTS[layout]
    path = checkpoint(kind, peaked=30.0, block_size=8, sub_block_size=4, **fam)
    one, two = LLM(path, dtype="float64"), LLM(path, dtype="float64", tensor_parallel_size=2)
    try:
        for kw in (dict(method="vanilla"), dict(method="spiffy", graph=MIXED, branches=8, draft_budget=2),
                   dict(method="specfold", graph=MIXED, branches=8, delta=0.0, draft_budget="auto"),
                   dict(method="freedave", draft_depth=4, draft_budget=2, eager=fam["attention"] == "block_causal")):
            p = DecodeParams(max_new_tokens=20, rule="static", **kw)
            assert _ids(two, PROMPTS, p) == _ids(one, PROMPTS, p), kw
    finally:
        two.close()


def test_fold_decisions_are_the_same_on_every_rank(monkeypatch):
    """At delta > 0 a rank whose hidden states differed by one ulp would fold other rows: every step
    the ranks compare digests of their fold statistics (SPECFOLD_TP_CHECK) and rank 0 raises on any
    difference. The check has to have run, on steps that folded rows."""
    monkeypatch.setenv("SPECFOLD_TP_CHECK", "1")
    two = LLM("tiny", dtype="float64", tensor_parallel_size=2)
    try:
        p = DecodeParams(chat_template=True, max_new_tokens=32, method="specfold", delta=0.05, draft_budget=2,
                         rule="static")
        outs = two.generate(QUESTIONS, p)
        assert two.leader.checked > 10
        assert sum(o.stats.extra["fold_ratio"] or 0 for o in outs) > 0
    finally:
        two.close()


def test_a_rank_that_dies_ends_the_request_set_with_one_line():
    two = LLM("tiny", dtype="float64", tensor_parallel_size=2)
    try:
        p = DecodeParams(chat_template=True, max_new_tokens=64, method="spiffy", draft_budget=2, rule="static")
        eng = two._engine_for(p.split()[0])
        for q in QUESTIONS:
            eng.add_request(two.encode(q, p), p.split()[1])
        eng.step()  # the prefills: every request has blocks left to decode
        pid = two.ranks.launcher.pids()[1]
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(DistributedError) as err:
            while eng.has_unfinished():
                eng.step()
        assert time.monotonic() - t0 < 60
        msg = str(err.value)
        assert "\n" not in msg and msg.startswith("tensor-parallel rank 1 was killed by SIGKILL")
        with pytest.raises(DistributedError, match="rank 1 was killed"):  # later use: the same line at once
            two.generate(QUESTIONS[:1], p)
    finally:
        two.close()


# ---------------------------------------------------------------------------------------- MoE
MARGIN = 1e-8  # every routing decision is this far from a tie (one rank and two differ by ~1e-15)


def _route_margins(monkeypatch, out: list) -> None:
    """Record, on rank 0, the smallest gap at every routing cut (the expert cut, and LLaDA2's group cut)."""
    from specfold.models.moe import MoE
    real = MoE.route

    def spy(self, x):
        logits = x.double() @ self.router.double().T
        if getattr(self, "scoring", "sigmoid") == "softmax":
            choice = torch.softmax(logits, -1)
        else:
            choice = torch.sigmoid(logits) + (0 if self.expert_bias is None else self.expert_bias.double())
            if self.groups > 1:
                g = choice.view(x.shape[0], self.groups, -1).topk(2, -1).values.sum(-1)
                gt = g.topk(self.topk_groups + 1, -1).values
                out.append((gt[:, self.topk_groups - 1] - gt[:, self.topk_groups]).min().item())
                keep = torch.zeros_like(g, dtype=torch.bool).scatter_(1, g.topk(self.topk_groups, -1).indices, True)
                choice = choice.masked_fill(~keep.repeat_interleave(choice.shape[1] // self.groups, 1), -1e9)
        top = choice.topk(self.top_k + 1, -1).values
        out.append((top[:, self.top_k - 1] - top[:, self.top_k]).min().item())
        return real(self, x)
    monkeypatch.setattr(MoE, "route", spy)


@pytest.fixture(scope="module")
def moe_checkpoints(tmp_path_factory):
    from tests import llada2_checkpoint as C
    from tests.test_sdar_moe import _save, make_hf
    folder, cfg, _ = C.make(tmp_path_factory.mktemp("tp_llada2") / "ckpt", seed=0, head_scale=4.0, eos_boost=1.0)
    sdar = _save(make_hf(seed=1, head_scale=4.0, num_hidden_layers=3, decoder_sparse_step=1, mlp_only_layers=[1],
                         norm_topk_prob=True), tmp_path_factory.mktemp("tp_sdar_moe"))
    return {"llada2": (folder, C.overrides(cfg), dict(rule="llada2", steps=8, threshold=0.9, block_size=8)),
            "sdar_moe": (sdar, None, dict(rule="static"))}


@pytest.mark.parametrize("family", ["llada2", "sdar_moe"])
@pytest.mark.parametrize("ep", [False, True], ids=["tp", "ep"])
def test_moe_checkpoints_under_tensor_and_expert_parallelism(moe_checkpoints, monkeypatch, family, ep):
    path, ov, rule = moe_checkpoints[family]
    margins: list = []
    _route_margins(monkeypatch, margins)
    one = LLM(path, dtype="float64", overrides=ov)
    two = LLM(path, dtype="float64", overrides=ov, tensor_parallel_size=2, enable_expert_parallel=ep)
    try:
        held = [lyr.moe.w_up.shape[:2] for lyr in two.model.layers if lyr.moe is not None]
        full = [lyr.moe.w_up.shape[:2] for lyr in one.model.layers if lyr.moe is not None]
        # expert parallelism: half the experts, whole; tensor parallelism: every expert, half its width
        assert held == [(e // 2, i) if ep else (e, i // 2) for e, i in full]
        prompts = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], [20, 21, 22], [30, 31, 32, 33, 34, 35, 36, 37]]
        for kw in (dict(method="vanilla"), dict(method="spiffy", graph=MIXED, branches=8, draft_budget=2),
                   dict(method="specfold", graph=MIXED, branches=8, delta=0.0, draft_budget="auto")):
            p = DecodeParams(max_new_tokens=16, **rule, **kw)
            want = _ids(one, prompts, p)
            assert sum(map(len, want)) > 10
            assert _ids(two, prompts, p) == want, kw
        assert len(margins) > 50 and min(margins) > MARGIN
    finally:
        two.close()


def test_nemotron_causal_programs_under_tensor_parallelism(tmp_path):
    """Nemotron-Labs-Diffusion's layout (causal prefix, its own AR head): the block program and the
    causal programs (ar, linear_spec) on two ranks."""
    from tests.hf_reference import make_hf_model
    from tests.test_forward_equivalence import _rename_and_save
    hf = make_hf_model("ministral3")
    with torch.no_grad():
        hf.lm_head.weight.mul_(30.0)
    config = hf.config.to_dict()
    config.update(model_type="nemotron_labs_diffusion", mask_token_id=95, stop_token_ids=[94], block_size=8)
    _rename_and_save(hf, tmp_path / "nld", lambda k: "diffusion_head.weight" if k == "lm_head.weight" else (
        "encoder." + k[len("model."):] if k.startswith("model.") else None), config)
    one = LLM(tmp_path / "nld", dtype="float64")
    two = LLM(tmp_path / "nld", dtype="float64", tensor_parallel_size=2)
    try:
        for kw in (dict(method="vanilla"), dict(method="ar"), dict(method="linear_spec")):
            p = DecodeParams(max_new_tokens=16, **kw)
            want = _ids(one, PROMPTS, p)
            assert sum(map(len, want)) > 10
            assert _ids(two, PROMPTS, p) == want, kw
    finally:
        two.close()


def test_a_rank_that_hangs_ends_the_request_set_within_the_collective_timeout(monkeypatch):
    monkeypatch.setenv("SPECFOLD_COLLECTIVE_TIMEOUT", "5")
    two = LLM("tiny", dtype="float64", tensor_parallel_size=2)
    pid = two.ranks.launcher.pids()[1]
    try:
        p = DecodeParams(chat_template=True, max_new_tokens=64, method="vanilla", rule="static")
        eng = two._engine_for(p.split()[0])
        for q in QUESTIONS:
            eng.add_request(two.encode(q, p), p.split()[1])
        eng.step()
        os.kill(pid, signal.SIGSTOP)  # alive, but it never answers
        t0 = time.monotonic()
        with pytest.raises(DistributedError, match=r"^a tensor-parallel collective did not complete within 5 s"):
            while eng.has_unfinished():
                eng.step()
        assert time.monotonic() - t0 < 30
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.1)  # the group is ended: the stopped rank is killed
        assert not os.path.exists(f"/proc/{pid}")
    finally:
        if os.path.exists(f"/proc/{pid}"):
            os.kill(pid, signal.SIGCONT)
        two.close()


def test_calibration_runs_on_the_ranks_too(tiny):
    """`calibrate` decodes through `LLM.decoder` (an engine with a program of its own): on two ranks it
    counts the same patterns and makes the same graph."""
    from specfold.decoding.drafts.calibrate import calibrate
    one, two = tiny
    base = DecodeParams(chat_template=True, max_new_tokens=24, rule="static", method="spiffy")
    g1, g2 = calibrate(one, QUESTIONS, base, branches=5), calibrate(two, QUESTIONS, base, branches=5)
    assert len(g1) == 5 and g2.nodes == g1.nodes


def _rank_shards(path, ov, ep: bool, dtype=torch.float32):
    from specfold.models.loader import load_model
    from specfold.models.parallel import Parallel
    return [load_model(path, dtype, "cpu", ov, None, Parallel(r, 2, ep))[0] for r in range(2)]


@pytest.mark.parametrize("case", ["tiny", "llada2_tp", "llada2_ep", "sdar_moe_ep"])
def test_shards_put_together_are_the_model_and_own_no_more(moe_checkpoints, case):
    """Each rank's shard, loaded in the checkpoint's own dtype (float32: no cast that would copy):
    the shards put back together along their split are the one-rank model's weights, and each rank's
    parameter storage is exactly its share (the replicated tensors whole, the rest halved)."""
    from specfold.models.loader import load_model, tiny_path
    from specfold.models.parallel import Parallel, shard
    path, ov, _ = (tiny_path(), None, None) if case == "tiny" else moe_checkpoints[case.rsplit("_", 1)[0]]
    ep = case.endswith("_ep")
    full = dict(load_model(path, torch.float32, "cpu", ov)[0].named_parameters())
    ranks = [dict(m.named_parameters()) for m in _rank_shards(path, ov, ep)]
    split = 0
    for name, w in full.items():
        cut = shard(name, tuple(w.shape), Parallel(0, 2, ep))
        if cut is None:
            assert all(torch.equal(r[name], w) for r in ranks), name
        else:
            split += w.numel() * w.element_size()
            assert torch.equal(torch.cat([r[name] for r in ranks], dim=cut[0]), w), name
    want = sum(w.numel() * w.element_size() for w in full.values()) - split // 2
    assert [sum(p.untyped_storage().nbytes() for p in r.values()) for r in ranks] == [want, want]
    assert split > 0.5 * sum(w.numel() * w.element_size() for w in full.values())


def test_a_step_interrupted_midway_refuses_the_next_at_once_and_close_ends_the_ranks():
    """Ctrl-C between rank 0's message and the end of its device work leaves the other ranks inside
    the step's collectives: the next step is one line at once (not a hang until the timeout), and
    close() ends the ranks instead of waiting for them to hear 'stop'."""
    two = LLM("tiny", dtype="float64", tensor_parallel_size=2)
    pid = two.ranks.launcher.pids()[1]
    p = DecodeParams(chat_template=True, max_new_tokens=32, method="vanilla")
    eng = two._engine_for(p.split()[0])

    def interrupted(jobs):
        raise KeyboardInterrupt
    real, eng.runner.runner.run = eng.runner.runner.run, interrupted  # rank 0 stops after its message
    with pytest.raises(KeyboardInterrupt):
        two.generate(QUESTIONS[:1], p)
    eng.runner.runner.run = real
    t0 = time.monotonic()
    with pytest.raises(DistributedError, match="an earlier step was interrupted midway"):
        two.generate(QUESTIONS[:1], p)
    two.close()
    assert time.monotonic() - t0 < 15
    assert not os.path.exists(f"/proc/{pid}")
