"""SDAR-MoE (`model_type` `sdar_moe`) and plain `qwen3_moe`: a random `transformers`
`Qwen3MoeForCausalLM` saved by `save_pretrained` is the reference.

- forward: specfold's logits within 1e-10 of transformers' in float64 (1e-5 in float32, unpatched);
- decoding: vanilla, FreeDave, Spiffy and SpecFold at delta 0 through `specfold.LLM`, one request and
  a batch, equal token for token to a cache-free block-causal reference decode whose every forward
  is transformers' (tests/reference_decode.py; it shares only the unmask rules with the engine);
- the routing margins those comparisons rely on are checked on both sides (our router on every row
  the engine routed, drafts included; transformers' on every row the reference routed);
- plain `qwen3_moe` loads with the diffusion fields from `overrides`; bad configs and checkpoints
  end in one line.

What differs from transformers, and how the test handles it: transformers' Qwen3-MoE router runs its
softmax in float32 whatever the model dtype; specfold runs it in the input dtype for float32/float64
(float64 end to end, as models/moe.py does for LLaDA2). For the float64 comparisons the router's own
source is re-executed with that one dtype replaced by the input's (`router_in_input_dtype`, as
test_llada2_moe.py does for DeepSeek-V3's router); the float32 comparison runs it unpatched.
`float64_reference` (tests/hf_reference.py) keeps HF's RMSNorm and RoPE tables in float64 likewise.
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch

from specfold import LLM, DecodeParams
from specfold.decoding.drafts.calibrate import calibrate
from specfold.errors import CheckpointError, ConfigError
from specfold.models.loader import load_model
from specfold.models.moe import MoE
from tests.hf_reference import float64_reference, hf_logits, patched_forward, save_hf
from tests.reference_decode import reference_decode

TOL = {torch.float32: 1e-5, torch.float64: 1e-10}
MARGIN = 1e-8  # every routing decision compared is this far from a tie (float64 noise ~1e-15)
MASK, STOP, V = 95, 94, 96
DIFFUSION = {"mask_token_id": MASK, "stop_token_ids": [STOP]}
# (layers, decoder_sparse_step, mlp_only_layers, norm_topk_prob) -> which layers are MoE
SHAPES = {
    "only1_norm": (dict(num_hidden_layers=3, decoder_sparse_step=1, mlp_only_layers=[1], norm_topk_prob=True),
                   [True, False, True]),
    "step2_plain": (dict(num_hidden_layers=4, decoder_sparse_step=2, mlp_only_layers=[3], norm_topk_prob=False),
                    [False, True, False, False]),
}


def make_hf(seed: int = 0, head_scale: float = 1.0, **shape):
    """A random Qwen3-MoE: every weight ~ N(0, 1/fan_in) (norm weights 1 + N(0, 0.2)), so every
    expert and the router matter at the 1e-10 scale; `head_scale` sharpens the head (confident
    predictions: drafts are accepted)."""
    import transformers as tf
    torch.manual_seed(seed)
    cfg = tf.Qwen3MoeConfig(vocab_size=V, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=12, num_experts=8,
                            num_experts_per_tok=2, max_position_embeddings=512, tie_word_embeddings=False,
                            rope_theta=10000.0, **shape)
    cfg._experts_implementation = "eager"  # its loop over the experts hit (grouped_mm has no float64)
    model = tf.Qwen3MoeForCausalLM(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
        model.lm_head.weight.mul_(head_scale)
    return model.eval()


def router_in_input_dtype():
    """transformers' Qwen3-MoE router with its softmax in the input dtype (its one float32 cast)."""
    from transformers.models.qwen3_moe import modeling_qwen3_moe as mod
    return patched_forward(mod.Qwen3MoeTopKRouter, "dtype=torch.float,", "dtype=hidden_states.dtype,", 1,
                           "qwen3_moe_router")


def _gap(probs: torch.Tensor, k: int) -> float:
    """Smallest gap between the k-th and the (k+1)-th routing probability over the rows."""
    top = probs.double().topk(k + 1, dim=-1).values
    return (top[:, k - 1] - top[:, k]).min().item() if top.numel() else float("inf")


@contextlib.contextmanager
def hf_margins(out: list):
    """Record the routing margin of every row transformers' routers see."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter
    real = Qwen3MoeTopKRouter.forward

    def spy(self, hidden_states):
        h = hidden_states.reshape(-1, self.hidden_dim).double()
        out.append(_gap(torch.softmax(h @ self.weight.double().T, -1), self.top_k))
        return real(self, hidden_states)
    Qwen3MoeTopKRouter.forward = spy
    try:
        yield
    finally:
        Qwen3MoeTopKRouter.forward = real


def our_margins(monkeypatch, out: list) -> None:
    """Record the routing margin of every row specfold's MoE layers route."""
    real = MoE.route

    def spy(self, x):
        out.append(_gap(torch.softmax(x.double() @ self.router.double().T, -1), self.top_k))
        return real(self, x)
    monkeypatch.setattr(MoE, "route", spy)


def _save(hf, folder: Path, model_type: str = "sdar_moe", **extra) -> Path:
    return save_hf(hf, folder, dict(DIFFUSION, model_type=model_type, **extra))


def _block_causal(T: int, n: int = 4) -> torch.Tensor:
    pos = torch.arange(T)
    return (pos[:, None] // n) >= (pos[None, :] // n)


# ------------------------------------------------------------------ spec
def test_spec_of_an_sdar_moe_config():
    """SDAR-30B-A3B-like keys (transformers < 5 names: num_experts) give SDAR's decoding on a Qwen3-MoE."""
    from specfold.models.spec import resolve_spec
    cfg = dict(model_type="sdar_moe", hidden_size=2048, num_hidden_layers=48, num_attention_heads=32,
               num_key_value_heads=4, head_dim=128, intermediate_size=6144, moe_intermediate_size=768,
               vocab_size=151936, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
               decoder_sparse_step=1, mlp_only_layers=[], rope_theta=1000000.0, eos_token_id=151643)
    s = resolve_spec(cfg)
    assert (s.family, s.weight_layout, s.qk_norm, s.qkv_bias, s.rotary_dim) == ("sdar_moe", "hf", True, False, None)
    assert (s.num_experts, s.experts_per_token, s.moe_intermediate_size, s.router_scoring, s.norm_topk_prob,
            s.expert_groups, s.topk_groups, s.shared_experts, s.router_bias, s.routed_scaling) == \
        (128, 8, 768, "softmax", True, 1, 1, 0, False, 1.0)
    assert all(s.is_moe_layer(i) for i in range(48))
    assert (s.mask_token_id, s.block_size, s.rule, s.tokens_per_step, s.attention, s.logits_shift) == \
        (151669, 4, "static", 1, "block_causal", False)
    assert s.stop_token_ids == (151643,)
    # transformers' Qwen3MoeConfig defaults where a key is absent: norm_topk_prob false, step 1
    s2 = resolve_spec({k: v for k, v in cfg.items() if k not in ("norm_topk_prob", "decoder_sparse_step",
                                                                 "mlp_only_layers")})
    assert (s2.norm_topk_prob, s2.decoder_sparse_step, s2.mlp_only_layers) == (False, 1, ())
    s3 = resolve_spec(dict(cfg, decoder_sparse_step=3, mlp_only_layers=[5]))
    assert [i for i in range(12) if s3.is_moe_layer(i)] == [2, 8, 11]
    sdar = resolve_spec(dict(cfg, model_type="sdar", mask_token_id=151669))
    for f in ("block_size", "rule", "tokens_per_step", "threshold", "attention", "alignment", "seed_token",
              "logits_shift", "confidence"):
        assert getattr(s, f) == getattr(sdar, f), f


# ------------------------------------------------------------------ forward
@pytest.fixture(scope="module", params=list(SHAPES))
def saved(request, tmp_path_factory):
    shape, moe_layers = SHAPES[request.param]
    hf = make_hf(seed=1, **shape)
    folder = _save(hf, tmp_path_factory.mktemp(request.param))
    return hf, folder, moe_layers


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_forward_matches_transformers(saved, dtype):
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
    hf, folder, moe_layers = saved
    assert [isinstance(l.mlp, Qwen3MoeSparseMoeBlock) for l in hf.model.layers] == moe_layers
    model, spec, _ = load_model(folder, dtype, "cpu")
    assert spec.family == "sdar_moe" and [l.moe is not None for l in model.layers] == moe_layers
    assert spec.norm_topk_prob == hf.config.norm_topk_prob
    g = torch.Generator().manual_seed(3)
    for T in (13, 8):
        ids = torch.randint(0, V, (1, T), generator=g)
        for allowed in (_block_causal(T), torch.ones(T, T, dtype=torch.bool)):
            margins: list = []
            patch = router_in_input_dtype() if dtype == torch.float64 else contextlib.nullcontext()
            with float64_reference(), patch, hf_margins(margins):
                ref = hf_logits(hf, ids, allowed, dtype)
            assert min(margins) > (MARGIN if dtype == torch.float64 else 1e-6)  # float32 probs: ~1e-7
            ours = model(ids, torch.arange(T), mask=allowed)
            assert (ours - ref).abs().max().item() <= TOL[dtype]
    if dtype == torch.float64:  # through the prefix cache and a packed window of several branches
        ids = torch.randint(0, V, (1, 11), generator=g)
        allowed = _block_causal(11)
        with float64_reference(), router_in_input_dtype():
            ref = hf_logits(hf, ids, allowed, dtype)
        cache = model.new_cache(capacity=4)
        model(ids[:, :8], torch.arange(8), cache=cache, mask=allowed[:8, :8], write_cache=True)
        win = model(ids[:, 8:].repeat(3, 1), torch.arange(8, 11), cache=cache, mask=allowed[8:, 8:])
        assert (win - ref[:, 8:]).abs().max().item() <= TOL[dtype]


def test_the_router_is_really_compared(saved):
    """The float64 bound can fail: transformers' float32 softmax alone moves the logits past it, and
    so does a wrong renormalisation."""
    hf, folder, _ = saved
    model, spec, _ = load_model(folder, torch.float64, "cpu")
    ids = torch.randint(0, V, (1, 12), generator=torch.Generator().manual_seed(5))
    allowed = _block_causal(12)
    ours = model(ids, torch.arange(12), mask=allowed)
    with float64_reference():
        unpatched = hf_logits(hf, ids, allowed, torch.float64)
    assert (ours - unpatched).abs().max().item() > TOL[torch.float64]
    flipped, _, _ = load_model(folder, torch.float64, "cpu", overrides={"norm_topk_prob": not spec.norm_topk_prob})
    assert (flipped(ids, torch.arange(12), mask=allowed) - ours).abs().max().item() > 1e-6


# ------------------------------------------------------------------ decoding
class HFModel:
    """transformers' model as reference_decode's `model(tokens, positions, mask=...)`: every call a
    full cache-free forward, float64 end to end, its routing margins recorded."""

    def __init__(self, hf):
        self.hf, self.margins = hf, []

    def __call__(self, tokens, positions, mask):
        assert torch.equal(positions, torch.arange(tokens.shape[1]))
        with float64_reference(), router_in_input_dtype(), hf_margins(self.margins):
            return hf_logits(self.hf, tokens, mask, torch.float64)


PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15, 16], [20, 21, 22, 23, 24, 25]]
RULES = {"static": {}, "dynamic": dict(rule="dynamic", threshold=0.9, tokens_per_step=1)}


@pytest.fixture(scope="module")
def decoding(tmp_path_factory):
    hf = make_hf(seed=2, head_scale=6.0, **SHAPES["only1_norm"][0])
    folder = _save(hf, tmp_path_factory.mktemp("sdar_moe_decode"))
    llm = LLM(str(folder), dtype="float64")
    cal = [torch.randint(0, V - 2, (L,), generator=torch.Generator().manual_seed(L)).tolist() for L in (4, 7, 9)]
    return hf, llm, cal


@pytest.mark.parametrize("rule", list(RULES))
def test_decoding_equals_the_cache_free_transformers_reference(decoding, rule, monkeypatch):
    hf, llm, cal = decoding
    assert llm.spec.family == "sdar_moe" and llm.spec.rule == "static" and llm.spec.block_size == 4
    ours: list = []
    our_margins(monkeypatch, ours)
    base = DecodeParams(max_new_tokens=14, draft_budget=64, **RULES[rule])
    van = llm.generate(PROMPTS, base)
    ref_model = HFModel(hf)
    for prompt, v in zip(PROMPTS, van):
        ref = reference_decode(ref_model, llm.spec, base, prompt)
        assert v.token_ids == ref, (prompt, v.token_ids, ref)
        assert MASK not in v.token_ids
    graph = calibrate(llm, cal, base, branches=4)
    settings = [dict(method="freedave", draft_depth=1), dict(method="freedave", draft_depth=4),
                dict(method="spiffy", branches=4, graph=graph),
                dict(method="specfold", delta=0.0, drafts="freedave", draft_depth=4),
                dict(method="specfold", delta=0.0, drafts="spiffy", branches=4, graph=graph)]
    saved_nfe = 0
    for s in settings:
        batch = llm.generate(PROMPTS, base.replace(**s))
        for prompt, v, b in zip(PROMPTS, van, batch):
            alone = llm.generate([prompt], base.replace(**s))[0]
            assert alone.token_ids == b.token_ids == v.token_ids, (s, prompt)
            assert alone.finish_reason == b.finish_reason == v.finish_reason
            assert b.stats.nfe <= v.stats.nfe, (s, b.stats.nfe, v.stats.nfe)
            saved_nfe += v.stats.nfe - b.stats.nfe
    assert saved_nfe > 0  # drafts were really accepted on this MoE model
    assert min(ref_model.margins) > MARGIN and min(ours) > MARGIN


# ------------------------------------------------------------------ plain qwen3_moe, errors
def test_plain_qwen3_moe_loads_with_overrides(saved, tmp_path):
    hf, folder, moe_layers = saved
    plain = save_hf(hf, tmp_path / "plain", {})
    assert json.loads((plain / "config.json").read_text())["model_type"] == "qwen3_moe"
    with pytest.raises(ConfigError, match="no mask token id for model_type 'qwen3_moe'"):
        load_model(plain, torch.float64, "cpu")
    model, spec, _ = load_model(plain, torch.float64, "cpu",
                                overrides={"mask_token_id": MASK, "block_size": 4, "stop_token_ids": [STOP]})
    assert (spec.family, spec.router_scoring, spec.mask_token_id, spec.block_size) == ("qwen3_moe", "softmax", MASK, 4)
    assert [l.moe is not None for l in model.layers] == moe_layers
    sdar, _, _ = load_model(folder, torch.float64, "cpu")
    ids, pos = torch.randint(0, V, (1, 10), generator=torch.Generator().manual_seed(6)), torch.arange(10)
    # the same function (not bit for bit: `hf` is float64 now, and a float64 file's tensors are
    # read in place, with another alignment than the float32 file's converted ones)
    assert (model(ids, pos, mask=_block_causal(10)) - sdar(ids, pos, mask=_block_causal(10))).abs().max() <= 1e-12
    # or with the diffusion fields in config.json, decoding through LLM
    cfg_plain = save_hf(hf, tmp_path / "plain_cfg", dict(DIFFUSION, block_size=4))
    out = LLM(str(cfg_plain), dtype="float64").generate([[5, 6, 7]], DecodeParams(rule="static", max_new_tokens=6))
    assert len(out[0].token_ids) == 6 or out[0].finish_reason == "stop"


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg and msg
    return msg


@pytest.mark.parametrize("key, value, match", [
    ("norm_topk_prob", "yes", r"norm_topk_prob='yes', expected true or false"),
    ("mlp_only_layers", "1", r"mlp_only_layers='1', expected a list of layer indices"),
    ("decoder_sparse_step", 0, r"decoder_sparse_step=0, expected an integer >= 1"),
    ("num_experts_per_tok", 9, r"num_experts_per_tok=9 must be in \[1, num_experts=8\]"),
    ("num_experts_per_tok", None, r"lacks the field 'num_experts_per_tok'"),
    ("hidden_act", "gelu", r"hidden_act='gelu'"),
])
def test_bad_config_is_one_clear_error(saved, tmp_path, capsys, key, value, match):
    """From Python a ConfigError of one line; from the command line that line on stderr, exit 2."""
    from specfold.cli import main
    _, folder, _ = saved
    cfg = json.loads((folder / "config.json").read_text())
    cfg[key] = value
    if value is None:
        del cfg[key]
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps(cfg))
    (bad / "model.safetensors").symlink_to(folder / "model.safetensors")
    with pytest.raises(ConfigError, match=match) as e:
        load_model(bad, torch.float64, "cpu")
    msg = _one_line(e)
    assert main(["generate", "--model", str(bad), "--prompt", "hi", "--dtype", "float64"]) == 2
    assert capsys.readouterr().err.strip() == f"error: {msg}"


def test_bad_overrides_are_one_clear_error(saved):
    _, folder, _ = saved
    for overrides, match in (({"norm_topk_prob": "yes"}, "norm_topk_prob='yes': expected true or false"),
                             ({"router_scoring": "relu"}, "router_scoring='relu'"),
                             ({"expert_groups": 2}, "softmax routing has no expert groups")):
        with pytest.raises(ConfigError, match=match) as e:
            load_model(folder, torch.float64, "cpu", overrides=overrides)
        _one_line(e)


def test_missing_or_misshapen_weights_name_the_tensor(saved, tmp_path):
    from safetensors.torch import load_file, save_file
    _, folder, moe_layers = saved
    layer = moe_layers.index(True)
    w = load_file(str(folder / "model.safetensors"))
    for drop, match in ((f"model.layers.{layer}.mlp.experts.5.up_proj.weight", rf"layers\.{layer}\.moe\.w_up\[5\]"),
                        (f"model.layers.{layer}.mlp.gate.weight", rf"layers\.{layer}\.moe\.router")):
        short = tmp_path / drop
        short.mkdir()
        save_file({k: v for k, v in w.items() if k != drop}, str(short / "model.safetensors"))
        (short / "config.json").write_text((folder / "config.json").read_text())
        with pytest.raises(CheckpointError, match=match) as e:
            load_model(short, torch.float64, "cpu")
        assert "weights missing" in _one_line(e)
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    save_file(dict(w, **{f"model.layers.{layer}.mlp.experts.2.down_proj.weight": torch.zeros(3, 3)}),
              str(wrong / "model.safetensors"))
    (wrong / "config.json").write_text((folder / "config.json").read_text())
    with pytest.raises(CheckpointError, match=r"experts\.2\.down_proj.*has shape \(3, 3\)") as e:
        load_model(wrong, torch.float64, "cpu")
    _one_line(e)
