"""Stop tokens come from the checkpoint: its eos (generation_config.json, then config.json, as
`transformers` reads them) plus the family's end-of-turn token; the family table only when the
checkpoint names no eos.

References: `transformers.GenerationConfig` loading the same folder (the eos it would stop at), and,
for decoding, the same model run without stop tokens, relabelled so that eos 198 is the token it
emits at a chosen position: the stopped output must be exactly that run's prefix.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specfold import LLM, DecodeParams
from specfold.errors import ConfigError
from specfold.models.loader import read_spec
from specfold.models.spec import FAMILIES

HF_SHAPE = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                intermediate_size=48, vocab_size=256)
OLMO_SHAPE = dict(d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, mlp_hidden_size=48, vocab_size=256,
                  embedding_size=256)
DIFFUSION_TYPES = sorted(t for t in FAMILIES if FAMILIES[t].get("stop_token_ids"))  # every family with a table entry


def _folder(tmp_path: Path, model_type: str, config_eos=None, generation: dict | None = None,
            eot: tuple[str, int] | None = None, **extra) -> Path:
    folder = tmp_path / f"{model_type}-{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    shape = OLMO_SHAPE if FAMILIES[model_type].get("weight_layout") == "olmo" else HF_SHAPE
    cfg = dict(model_type=model_type, mask_token_id=250, **shape, **extra)
    if config_eos is not None:
        cfg["eos_token_id"] = config_eos
    (folder / "config.json").write_text(json.dumps(cfg))
    if generation is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation))
    if eot is not None:
        from tokenizers import Tokenizer, models
        vocab = {f"t{i}": i for i in range(256)}
        del vocab[f"t{eot[1]}"]
        vocab[eot[0]] = eot[1]
        Tokenizer(models.WordLevel(vocab, unk_token="t0")).save(str(folder / "tokenizer.json"))
    return folder


def _spec(folder: Path, overrides: dict | None = None):
    from specfold.models.tokenizer import Tokenizer
    tok = Tokenizer.load(folder)
    return read_spec(folder, overrides, tok.vocab if tok else None)[0]


def _transformers_eos(folder: Path) -> tuple[int, ...] | None:
    """What transformers' from_pretrained gives the model as its generation config's eos."""
    from transformers import GenerationConfig
    try:
        gc = GenerationConfig.from_pretrained(folder)
    except OSError:  # no generation_config.json: the generation config is made from config.json
        gc = GenerationConfig.from_pretrained(folder, config_file_name="config.json", _from_model_config=True)
    eos = gc.eos_token_id
    return None if eos is None else tuple(eos) if isinstance(eos, list) else (eos,)


@pytest.mark.parametrize("model_type", DIFFUSION_TYPES)
def test_the_checkpoint_eos_replaces_the_family_default(tmp_path, model_type):
    family = FAMILIES[model_type]
    eot_name = family.get("eot_token")
    for config_eos, generation in ((198, None), (7, {"eos_token_id": [198, 199]}), ([3, 4], {"pad_token_id": 0})):
        folder = _folder(tmp_path, model_type, config_eos, generation, eot=(eot_name, 201) if eot_name else None)
        want = _transformers_eos(folder) or tuple(config_eos if isinstance(config_eos, list) else [config_eos])
        assert want != family["stop_token_ids"]
        spec = _spec(folder)
        assert spec.stop_token_ids == want + ((201,) if eot_name else ()), (model_type, config_eos, generation)


def test_transformers_agrees_on_which_eos(tmp_path):
    """Where transformers reads an eos, ours is the same one (generation_config.json first)."""
    cases = [(198, None), (7, {"eos_token_id": 198}), (7, {"eos_token_id": [198, 5]}), ([9, 8], None),
             (None, {"eos_token_id": 12})]
    for config_eos, generation in cases:
        folder = _folder(tmp_path, "sdar", config_eos, generation)
        assert _spec(folder).stop_token_ids == _transformers_eos(folder), (config_eos, generation)


def test_end_of_turn_token_and_fallbacks(tmp_path):
    # no eos anywhere: the family table, plus the end-of-turn token when the tokenizer has it
    assert _spec(_folder(tmp_path, "Dream")).stop_token_ids == FAMILIES["Dream"]["stop_token_ids"]
    assert _spec(_folder(tmp_path, "Dream", eot=("<|im_end|>", 77))).stop_token_ids == (151643, 77)
    assert _spec(_folder(tmp_path, "llada", 5, eot=("<|eot_id|>", 6))).stop_token_ids == (5, 6)
    assert _spec(_folder(tmp_path, "llada", [6, 5], eot=("<|eot_id|>", 6))).stop_token_ids == (6, 5)  # once
    # a nested text config (multimodal layouts): its eos, as GenerationConfig.from_model_config reads it
    assert _spec(_folder(tmp_path, "sdar", text_config={"eos_token_id": 42})).stop_token_ids == (42,)
    # specfold's own config key and overrides still win over the checkpoint
    assert _spec(_folder(tmp_path, "sdar", 198, {"eos_token_id": 199}, stop_token_ids=[3])).stop_token_ids == (3,)
    assert _spec(_folder(tmp_path, "sdar", 198), {"stop_token_ids": [4]}).stop_token_ids == (4,)
    # plain layouts have no table entry: the checkpoint's eos only
    assert _spec(_folder(tmp_path, "qwen2", 198)).stop_token_ids == (198,)


def test_malformed_eos_and_generation_config_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"config.json: eos_token_id must be a token id or a list of token ids, got 'x'"):
        _spec(_folder(tmp_path, "sdar", "x"))
    with pytest.raises(ConfigError, match=r"generation_config.json: eos_token_id .* got \[1, True\]"):
        _spec(_folder(tmp_path, "sdar", 3, {"eos_token_id": [1, True]}))
    folder = _folder(tmp_path, "sdar", 3)
    (folder / "generation_config.json").write_text("{oops")
    from specfold.errors import CheckpointError
    with pytest.raises(CheckpointError, match="generation_config.json is not valid JSON"):
        _spec(folder)


# ------------------------------------------------------------------ decoding stops at the checkpoint's eos
EOS = 198
PROMPT = [5, 6, 7, 8, 9]
MASK = 95


def _nld_state(seed: int = 0) -> tuple[dict, dict]:
    """A random Ministral-3 of vocabulary 256 under Nemotron-Labs-Diffusion's tensor names."""
    from tests.hf_reference import make_hf_model
    hf = make_hf_model("ministral3", seed=seed)
    hf.resize_token_embeddings(256)
    sd = {}
    g = torch.Generator().manual_seed(seed + 1)
    for k, v in hf.state_dict().items():
        if k == "lm_head.weight":
            sd["diffusion_head.weight"] = v.clone() * 3.0  # peaked: the threshold rule commits several tokens
            sd["lm_head.weight"] = torch.randn(v.shape, generator=g) * v.std() * 3.0  # the causal head
        elif k.startswith("model."):
            sd["encoder." + k[len("model."):]] = v.contiguous()
    cfg = hf.config.to_dict()
    cfg.update(model_type="nemotron_labs_diffusion", mask_token_id=MASK, block_size=4, tie_word_embeddings=False,
               vocab_size=256)
    cfg.pop("eos_token_id", None)
    return sd, cfg


def _save(folder: Path, sd: dict, cfg: dict, swap: tuple[int, int] | None = None) -> Path:
    """Save with token ids a and b exchanged (embedding and head rows): the same model, relabelled."""
    from safetensors.torch import save_file
    sd = {k: v.clone() for k, v in sd.items()}
    if swap is not None:
        a, b = swap
        for k in ("encoder.embed_tokens.weight", "diffusion_head.weight", "lm_head.weight"):
            sd[k][[a, b]] = sd[k][[b, a]]
    folder.mkdir(parents=True)
    save_file(sd, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("method", ["vanilla", "freedave", "ar", "linear_spec", "linear_spec_multi"])
def test_nemotron_labs_diffusion_stops_at_its_eos_198(tmp_path, method):
    sd, cfg = _nld_state(seed=1)  # a seed whose causal outputs are not one repeated token from the start
    free_llm = LLM(_save(tmp_path / "free", sd, cfg), dtype="float64", overrides={"stop_token_ids": []})
    params = DecodeParams(method=method, max_new_tokens=24)
    free = free_llm.generate([PROMPT], params)[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 24
    # the last token the model emits for the first time (after position 0) becomes eos 198 by relabelling
    k = max(i for i in range(1, 24) if free.token_ids[i] not in free.token_ids[:i] + [EOS, MASK])
    assert k >= 8  # a stop well inside the run
    t = free.token_ids[k]
    relabel = {t: EOS, EOS: t}
    folder = _save(tmp_path / "eos198", sd, dict(cfg, eos_token_id=EOS), swap=(t, EOS))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": EOS}))
    llm = LLM(folder, dtype="float64")
    assert llm.spec.stop_token_ids == (EOS,)
    out = llm.generate([[relabel.get(x, x) for x in PROMPT]], params)[0]
    assert out.token_ids == [relabel.get(x, x) for x in free.token_ids[:k]]
    assert out.finish_reason == "stop"
    assert out.stats.nfe < free.stats.nfe  # it stopped decoding there, not only cut the text
