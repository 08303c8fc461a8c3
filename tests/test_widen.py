"""`specfold widen` is function-preserving (SPEC §9): float64 logits equal the source's at every position
under a block-causal mask (through specfold and through `transformers`), for Qwen2 (q/k/v bias) and
Qwen3 (q/k norm) layouts with GQA; head layouts that move, regroup and copy KV heads; identity layers.
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from specfold.models.loader import load_model
from specfold.models.widen import PRESETS, Shape, WidenError, plan, resolve_shape, widen_checkpoint
from tests.hf_reference import float64_reference, hf_logits

TOL = 1e-9
SRC = Shape(hidden=32, intermediate=48, heads=4, kv_heads=2, layers=2)  # tests/hf_reference.py BASE
# (heads, kv heads, layers): regroup 2 -> 4 query heads per KV head; a new KV head; KV heads copied
# (groups of 1 < 2); identity layers (2 -> 5: not a multiple)
LAYOUTS = [(8, 2, 2), (9, 3, 2), (8, 8, 2), (6, 2, 5)]


def _block_causal(T: int, n: int) -> torch.Tensor:
    pos = torch.arange(T)
    return (pos[:, None] // n) >= (pos[None, :] // n)


def _widen(src, tmp_path, heads, kv, layers, name="w", **kw):
    shape = Shape(hidden=48, intermediate=80, heads=heads, kv_heads=kv, layers=layers)
    return widen_checkpoint(src, tmp_path / name, shape, seed=3, dtype="float64", progress=False, **kw)


# ------------------------------------------------------------------ the layout plan
@pytest.mark.parametrize("src,dst", [((4, 2), (8, 2)), ((4, 2), (9, 3)), ((4, 2), (8, 8)), ((14, 2), (18, 2)),
                                     ((6, 2), (12, 6)), ((8, 2), (10, 5)), ((28, 4), (28, 28))])
def test_plan_keeps_every_query_head_on_its_kv_head(src, dst):
    a = Shape(64, 64, src[0], src[1], 3)
    b = Shape(64, 64, dst[0], dst[1], 7)
    p = plan(a, b)
    g, g2 = src[0] // src[1], dst[0] // dst[1]
    assert len(set(p.q_slot)) == src[0] and all(0 <= s < dst[0] for s in p.q_slot)
    for h, slot in enumerate(p.q_slot):
        assert p.kv_source[slot // g2] == h // g, (h, slot)
    assert len(p.kv_source) == dst[1] and set(range(src[1])) <= set(p.kv_source)
    assert [i for i in p.layer_source if i is not None] == [0, 1, 2]  # real layers in order
    assert len(p.layer_source) == 7 and p.layer_source[-1] == 2  # identities only before real layers
    for i in range(7):  # an identity's template is the real layer it precedes
        assert p.template[i] == next(x for x in p.layer_source[i:] if x is not None)


@pytest.mark.parametrize("dst,msg", [
    (Shape(16, 64, 4, 2, 3), "--hidden 16 is below the source's 32"),
    (Shape(32, 64, 7, 2, 3), "--heads 7 is not a multiple of --kv-heads 2"),
    (Shape(32, 64, 6, 3, 3), "need --kv-heads >= 4"),
    (Shape(32, 64, 6, 2, 2), "--layers 2 is below the source's 3"),
])
def test_plan_rejects_impossible_shapes(dst, msg):
    with pytest.raises(WidenError, match=msg):
        plan(Shape(32, 64, 6, 2, 3), dst)


def test_presets_match_named_shapes_for_their_head_dim():
    src = Shape(192, 512, 4, 2, 4)
    for key, p in PRESETS.items():
        exact = resolve_shape(src, p["head_dim"], key)
        assert (exact.hidden, exact.intermediate, exact.heads, exact.kv_heads) == \
               (p["hidden"], p["intermediate"], p["heads"], p["kv_heads"])
        assert exact.layers == 4  # the preset is a width; depth stays unless --layers
    # head_dim 48: the query head count whose H·D is nearest the named H·D, a multiple of the KV heads
    assert resolve_shape(src, 48, "0.5b").heads == 18  # 864 vs 896
    assert resolve_shape(src, 48, "1.5b").heads == 32  # 1536 exact
    assert resolve_shape(src, 48, "1.5b", layers=28, heads=30).layers == 28
    with pytest.raises(WidenError, match="unknown preset"):
        resolve_shape(src, 48, "3b")


# ------------------------------------------------------------------ logits
def _hf(folder):
    import transformers as tf
    return tf.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: f"{x[0]}q{x[1]}kv{x[2]}l")
@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_logits_equal_source(checkpoint, tmp_path, kind, layout):
    src = checkpoint(kind)
    out = _widen(src, tmp_path, *layout, shard_bytes=40_000 if layout[2] == 5 else 2 << 30)
    ids = torch.randint(0, 95, (1, 11), generator=torch.Generator().manual_seed(1))
    allowed = _block_causal(11, 4)
    s_model, s_spec, _ = load_model(src, torch.float64, "cpu")
    w_model, w_spec, _ = load_model(out, torch.float64, "cpu")
    assert (w_spec.hidden_size, w_spec.num_heads, w_spec.num_kv_heads, w_spec.num_layers) == (48, *layout)
    assert w_spec.head_dim == s_spec.head_dim and w_spec.qk_norm == (kind == "qwen3")
    with torch.no_grad():
        ref = s_model(ids, torch.arange(11), mask=allowed)
        ours = w_model(ids, torch.arange(11), mask=allowed)
    assert (ours - ref).abs().max().item() <= TOL
    with float64_reference():
        hf_src = hf_logits(_hf(src), ids, allowed, torch.float64)
        hf_wide = hf_logits(_hf(out), ids, allowed, torch.float64)
    assert (hf_wide - hf_src).abs().max().item() <= TOL
    assert (hf_wide - ours).abs().max().item() <= TOL
    if layout[2] == 5:
        assert (out / "model.safetensors.index.json").is_file()  # the sharded writer was used


def test_new_heads_and_units_are_live(checkpoint, tmp_path):
    """The equality above is not vacuous: new heads/units compute nonzero outputs that only the zero
    o_proj / down_proj columns cancel (one nonzero entry there changes the logits)."""
    out = _widen(checkpoint("qwen2"), tmp_path, 8, 2, 3)
    model, spec, _ = load_model(out, torch.float64, "cpu")
    cfg = json.loads((out / "config.json").read_text())
    q_slots = cfg["widened_from"]["q_heads"]
    new_head = next(h for h in range(spec.num_heads) if h not in q_slots)
    ids = torch.randint(0, 95, (1, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        base = model(ids, torch.arange(8))
        for li, layer in enumerate(model.layers):
            for proj, col in (("o_proj", new_head * spec.head_dim), ("down_proj", spec.intermediate_size - 1)):
                w = getattr(layer, proj).weight
                assert w[:, col].abs().max() == 0
                w[0, col] = 1.0
                moved = (model(ids, torch.arange(8)) - base).abs().max().item()
                w[0, col] = 0.0
                assert moved > 1e-6, (li, proj)
    assert cfg["widened_from"]["layers"] == [None, 0, 1]


def test_output_is_a_complete_checkpoint(checkpoint, tmp_path):
    src = checkpoint("qwen3")
    out = _widen(src, tmp_path, 8, 2, 2)
    cfg, src_cfg = json.loads((out / "config.json").read_text()), json.loads((src / "config.json").read_text())
    for key in ("mask_token_id", "block_size", "stop_token_ids", "model_type", "architectures", "vocab_size"):
        assert cfg[key] == src_cfg[key]
    assert cfg["rms_norm_eps"] == pytest.approx(src_cfg["rms_norm_eps"] * 32 / 48, rel=1e-15)
    assert cfg["head_dim"] == src_cfg["head_dim"]
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.float64
    with pytest.raises(WidenError, match="exists and is not empty"):
        _widen(src, tmp_path, 8, 2, 2)


def test_cli_widens_and_rejects_bad_input_in_one_line(checkpoint, tmp_path, capsys):
    from specfold.cli import main
    src = str(checkpoint("qwen2"))
    capsys.readouterr()  # the fixture's own output
    bad = [(["--hidden", "16"], "--hidden 16 is below the source's 32"),
           (["--heads", "7"], "--heads 7 is not a multiple of --kv-heads 2"),
           (["--preset", "0.5b", "--heads", "15"], "--heads 15 is not a multiple of --kv-heads 2"),
           (["--model", str(tmp_path / "nowhere")], "does not exist")]
    for args, msg in bad:
        assert main(["widen", "--model", src, "--out", str(tmp_path / "x"), "--quiet", *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and msg in err[0], err
    assert not (tmp_path / "x").exists()
    assert main(["widen", "--model", src, "--out", str(tmp_path / "x"), "--quiet", "--hidden", "40",
                 "--layers", "3", "--dtype", "float64"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "x")
    model, spec, _ = load_model(tmp_path / "x", torch.float64, "cpu")
    assert (spec.hidden_size, spec.num_layers, spec.num_heads) == (40, 3, 4)
