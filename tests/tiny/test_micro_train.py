"""A micro training run: loss goes down, the exported checkpoint loads, and a rerun resumes."""
import json

import pytest
import torch

from specfold.models.loader import load_model
from specfold.tiny import data as D
from specfold.tiny.train import train_tiny

pytestmark = pytest.mark.train


def test_micro_training_run(tmp_path):
    out = tmp_path / "run"
    kw = dict(seed=0, micro=True, batch_size=8, lr=1e-2, warmup=2, eval_problems=2, log_every=5)
    res = train_tiny(str(out), steps=15, **kw)
    assert res["step"] == 15
    assert res["loss"] < res["first_losses"][0] - 0.5
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
              "heldout.jsonl", "ckpt.pt"):
        assert (out / f).is_file(), f
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and cfg["architectures"] == ["Qwen2ForCausalLM"]
    model, spec, _ = load_model(out, torch.float32, "cpu")
    assert spec.mask_token_id == cfg["mask_token_id"] and spec.block_size == 16
    assert spec.logits_shift is False and spec.attention == "block_causal"
    assert tuple(cfg["stop_token_ids"]) == spec.stop_token_ids
    held = D.load_jsonl(out / "heldout.jsonl")
    from specfold.tiny import choices as C
    assert held == C.heldout(0, len(held))  # the default task is the shipped model's, `choices`
    try:
        from specfold import LLM, DecodeParams  # the engine's API, once it exists
    except ImportError:
        LLM = None
    if LLM is not None:
        llm = LLM(str(out), dtype="float32")
        outs = llm.generate([held[0]["question"]], DecodeParams(chat_template=True, max_new_tokens=8))
        assert len(outs[0].token_ids) <= 8
    try:  # the export is a standard HF Qwen2 checkpoint
        from transformers import Qwen2ForCausalLM
    except ImportError:
        Qwen2ForCausalLM = None
    if Qwen2ForCausalLM is not None:
        hf = Qwen2ForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
        ids = torch.tensor([[1, 5, 9, 12, 2, 7]])
        pos = torch.arange(6)
        with torch.no_grad():
            ref = hf(ids).logits[0]
            got = model(ids, pos, mask=pos[:, None] >= pos[None, :])[0]
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    # rerunning with more steps resumes from the checkpoint instead of starting over
    res2 = train_tiny(str(out), steps=18, **kw)
    assert res2["step"] == 18 and len(res2["first_losses"]) == 3


def test_micro_training_run_choices_task(tmp_path):
    """The `choices` task trains through the same command (`--task choices`): loss goes down, its
    held-out set is the task's, and resuming with another task is refused."""
    import pytest

    from specfold.tiny import choices as C
    out = tmp_path / "run"
    kw = dict(seed=0, micro=True, batch_size=8, lr=1e-2, warmup=2, eval_problems=2, log_every=5)
    res = train_tiny(str(out), steps=15, task="choices", **kw)
    assert res["step"] == 15 and res["loss"] < res["first_losses"][0] - 0.5
    held = D.load_jsonl(out / "heldout.jsonl")
    assert held == C.heldout(0, len(held)) and "facts" in held[0]
    with pytest.raises(ValueError, match="task 'choices'"):
        train_tiny(str(out), steps=18, task="arith", **kw)
