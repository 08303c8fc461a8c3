"""A widened checkpoint decodes exactly like its source (float64): the same tokens and forwards for every
method, and the same per-layer fold ratio; identity layers fold exactly like the real layer after them."""
from __future__ import annotations

import json

import pytest

from specfold import LLM, DecodeParams
from specfold.decoding.drafts.graph import DraftGraph, Node
from specfold.models.widen import Shape, widen_checkpoint

pytestmark = pytest.mark.slow  # decodes of widened checkpoints

PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]]
GRAPH = DraftGraph([Node(0, ((0, 0),)), Node(1, ((0, 0),)), Node(0, ((1, 0),)), Node(0, ((0, 1),)),
                    Node(2, ((0, 0), (1, 0))), Node(3, ((0, 0),)), Node(1, ((1, 0),))])
METHODS = {
    "vanilla": dict(),
    "freedave": dict(method="freedave", draft_depth=4),
    "spiffy": dict(method="spiffy", branches=7, graph=GRAPH),
    "specfold0": dict(method="specfold", branches=7, graph=GRAPH, delta=0.0),
    "specfold0.1": dict(method="specfold", branches=7, graph=GRAPH, delta=0.1),
}
RULES = {"static": dict(rule="static"), "threshold": dict(rule="threshold", threshold=0.6)}


def _expected_per_layer(src_layers: list[float], layer_source: list[int | None]) -> list[float]:
    """Per new layer: the source layer's ratio, and for an identity the ratio of the real layer after it."""
    out = []
    for i, s in enumerate(layer_source):
        nxt = s if s is not None else next(x for x in layer_source[i:] if x is not None)
        out.append(src_layers[nxt])
    return out


def _compare(src: LLM, wide: LLM, prompts, base: dict, methods=METHODS, src_outputs: dict | None = None) -> bool:
    """Asserts equal tokens, NFE and per-layer fold ratios; returns whether any row folded.
    `src_outputs` (a dict): the source's outputs, kept by method name (decoded once for every widened copy)."""
    layer_source = json.loads((wide.path / "config.json").read_text())["widened_from"]["layers"]
    src_outputs = {} if src_outputs is None else src_outputs
    folded_somewhere = False
    for name, kw in methods.items():
        params = DecodeParams(**base, **kw, draft_budget=64)  # the same drafts on both (auto may differ by cost)
        if name not in src_outputs:
            src_outputs[name] = src.generate(prompts, params)
        for a, b in zip(src_outputs[name], wide.generate(prompts, params)):
            assert b.token_ids == a.token_ids, name
            assert b.stats.nfe == a.stats.nfe, name
            if "fold_ratio_per_layer" in a.stats.extra:
                per_src, per_wide = a.stats.extra["fold_ratio_per_layer"], b.stats.extra["fold_ratio_per_layer"]
                assert per_wide == _expected_per_layer(per_src, layer_source), name
                folded_somewhere |= any(0 < r for r in per_src)
    return folded_somewhere


@pytest.fixture(scope="module")
def source_outputs():
    """(kind, rule) -> {method: the source checkpoint's outputs}: greedy float64 decoding is
    deterministic, so the source is decoded once and compared with each of its widened copies (2 and
    5 layers) instead of once per copy."""
    return {}


@pytest.mark.parametrize("layers", [2, 5])
@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_every_method_decodes_like_the_source(checkpoint, source_outputs, tmp_path, kind, rule, layers):
    src_dir = checkpoint(kind, peaked=30.0, block_size=8, sub_block_size=4)
    out = widen_checkpoint(src_dir, tmp_path / "w", Shape(48, 80, 8, 2, layers), seed=1, dtype="float64",
                           progress=False)
    src, wide = LLM(src_dir, dtype="float64"), LLM(out, dtype="float64")
    assert _compare(src, wide, PROMPTS, dict(max_new_tokens=24, early_stop=False, **RULES[rule]),
                    src_outputs=source_outputs.setdefault((kind, rule), {}))


def test_widened_tiny_decodes_held_out_problems_like_tiny(tmp_path, tiny_llm64):
    """The embedded model widened (and deepened) keeps its tokens under its own rule and the static
    rule, and finds the tiny model's shipped Spiffy graphs without a graph argument."""
    from specfold.api import tiny_path
    from specfold.decoding.drafts.spiffy import fingerprint
    out = widen_checkpoint("tiny", tmp_path / "w", Shape(224, 576, 6, 2, 5), seed=0, dtype="float64",
                           progress=False)
    src, wide = tiny_llm64, LLM(out, dtype="float64")
    assert fingerprint(wide.spec) == fingerprint(src.spec)
    rows = [json.loads(x) for x in (tiny_path() / "heldout.jsonl").read_text().splitlines()[:2]]
    methods = {k: {kk: vv for kk, vv in v.items() if kk != "graph"} for k, v in METHODS.items()}
    folded = [_compare(src, wide, [r["question"] for r in rows],
                       dict(chat_template=True, max_new_tokens=48, **rule), methods)
              for rule in ({}, dict(rule="static"))]
    assert folded[1]  # under the static rule its drafts are verified and rows fold


def test_specfold_bench_runs_on_widened_output(tmp_path, capsys):
    """`specfold bench --model DIR` treats a widened folder like any checkpoint: every method runs and
    matches vanilla's tokens, SpecFold at δ = 0 (the held-out set and Spiffy graph come from the packaged
    tiny model)."""
    from specfold.cli import main
    from specfold.eval.records import load_records
    out = widen_checkpoint("tiny", tmp_path / "w", Shape(224, 576, 6, 2, 4), seed=0, dtype="float64",
                           progress=False)
    rc = main(["bench", "--model", str(out), "--dtype", "float64", "--tasks", "tiny", "--limit", "1",
               "--methods", "vanilla,freedave,spiffy,specfold", "--rule", "static", "--tokens-per-step", "1",
               "--max-new-tokens", "48", "--delta", "0", "--warmup", "0", "--no-progress", "--out", str(tmp_path / "b.jsonl"),
               "--draft-budget", "7"])  # a fixed budget: auto's choice depends on the machine's timing
    assert rc == 0, capsys.readouterr().err
    recs = list(load_records(str(tmp_path / "b.jsonl")).values())
    assert {r["method"] for r in recs} == {"vanilla", "freedave", "spiffy", "specfold"}
    assert all(r["exact"] for r in recs if r["method"] != "vanilla")
    van = next(r for r in recs if r["method"] == "vanilla")
    assert all(r["nfe"] < van["nfe"] for r in recs if r is not van)  # drafts were accepted
