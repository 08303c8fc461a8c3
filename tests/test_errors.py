"""Bad input gets a clear error naming the problem."""
from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from specfold import LLM, DecodeParams
from specfold.errors import CheckpointError, ConfigError, ParamsError


def copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_missing_folder():
    with pytest.raises(CheckpointError, match="does not exist"):
        LLM("/nonexistent/model")


def test_missing_config_and_bad_json(checkpoint, tmp_path):
    d = copy(checkpoint("qwen2"), tmp_path / "c")
    (d / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        LLM(d)
    (d / "config.json").unlink()
    with pytest.raises(CheckpointError, match="no config.json"):
        LLM(d)


def test_missing_and_partial_weights(checkpoint, tmp_path):
    d = copy(checkpoint("qwen2"), tmp_path / "w")
    sd = load_file(str(d / "model.safetensors"))
    sd.pop("model.layers.1.mlp.up_proj.weight")
    save_file(sd, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match="layers.1.up_proj.weight"):
        LLM(d)
    (d / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        LLM(d)
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(CheckpointError, match="missing"):
        LLM(d)


def test_sharded_checkpoint_loads(checkpoint, tmp_path):
    d = copy(checkpoint("qwen2"), tmp_path / "s")
    sd = load_file(str(d / "model.safetensors"))
    (d / "model.safetensors").unlink()
    names = sorted(sd)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for f, ns in shards.items():
        save_file({n: sd[n] for n in ns}, str(d / f))
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {n: f for f, ns in shards.items() for n in ns}}))
    whole = LLM(checkpoint("qwen2"), dtype="float64").generate([[1, 2, 3]], DecodeParams(max_new_tokens=4))[0]
    sharded = LLM(d, dtype="float64").generate([[1, 2, 3]], DecodeParams(max_new_tokens=4))[0]
    assert whole.token_ids == sharded.token_ids


def test_wrong_shape(checkpoint, tmp_path):
    d = copy(checkpoint("qwen2"), tmp_path / "sh")
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = 64
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="shape"):
        LLM(d)


def test_unknown_model_type_and_missing_mask(checkpoint, tmp_path):
    d = copy(checkpoint("qwen2"), tmp_path / "t")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(dict(cfg, model_type="gpt2")))
    with pytest.raises(ConfigError, match="unknown model_type 'gpt2'.*supported"):
        LLM(d)
    cfg.pop("mask_token_id")
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="no mask token id"):
        LLM(d)
    assert LLM(d, overrides={"mask_token_id": 95}).spec.mask_token_id == 95
    with pytest.raises(ConfigError, match="unknown override"):
        LLM(d, overrides={"mask_id": 95})


@pytest.mark.parametrize("kw,msg", [
    (dict(max_new_tokens=0), "max_new_tokens must be >= 1"),
    (dict(threshold=-0.1), "threshold must be in"),
    (dict(threshold=1.5), "threshold must be in"),
    (dict(delta=-0.1), "delta must be >= 0"),
    (dict(rule="greedy"), "unknown rule"),
    (dict(block_size=-4), "block_size must be a positive"),
])
def test_impossible_params(kw, msg):
    with pytest.raises(ParamsError, match=msg):
        DecodeParams(**kw)


def test_params_against_the_model(checkpoint):
    llm = LLM(checkpoint("qwen2"))
    with pytest.raises(ParamsError, match="not a multiple of sub_block_size"):
        llm.generate([[1, 2]], DecodeParams(rule="sub_block", block_size=8, sub_block_size=3))
    with pytest.raises(ParamsError, match="exceeds the model's context"):
        llm.generate([[1] * 500], DecodeParams(max_new_tokens=32))
    with pytest.raises(ParamsError, match="empty list of prompts"):
        llm.generate([], DecodeParams())
    with pytest.raises(ParamsError, match="outside the vocabulary"):
        llm.generate([[1, 2, 1000]], DecodeParams())
    with pytest.raises(CheckpointError, match="no tokenizer.json"):
        llm.generate(["hello"], DecodeParams())
    with pytest.raises(ParamsError, match="unknown decode method"):
        llm.generate([[1, 2]], DecodeParams(method="magic"))
