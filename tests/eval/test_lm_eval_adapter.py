"""The lm-eval-harness model "specfold": registered on import, generate_until with lm-eval's own
`Instance` objects (stop strings, max_gen_toks, chat template), no log-likelihoods."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("lm_eval")
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.api.registry import get_model  # noqa: E402

from specfold.eval.lm_eval_adapter import SpecfoldLM, truncate_at_stops  # noqa: E402
from specfold.params import DecodeParams  # noqa: E402
from tests.eval.test_bench_model import text_checkpoint  # noqa: E402

pytestmark = pytest.mark.slow  # lm-eval's task indexing

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def lm(checkpoint, tmp_path_factory):
    folder = text_checkpoint(checkpoint(), tmp_path_factory.mktemp("lmeval"))
    cls = get_model("specfold")
    assert cls is SpecfoldLM
    return cls.create_from_arg_string(f"pretrained={folder},method=vanilla,max_new_tokens=8,threads=1",
                                      {"batch_size": 1, "max_batch_size": None, "device": None})


def req(context, **gen_kwargs):
    return Instance("generate_until", {}, (context, gen_kwargs), 0)


def test_generate_until_honours_max_gen_toks_and_stops(lm):
    direct = lm.llm.generate(["Q: 1 + 2 ="], DecodeParams(max_new_tokens=12))[0]
    assert len(direct.text) == 12  # random weights: no stop token, one character per token
    stop = direct.text[4:6]
    cut = direct.text[: direct.text.find(stop)]
    outs = lm.generate_until([req("Q: 1 + 2 =", until=[], max_gen_toks=12),
                              req("Q: 1 + 2 =", until=["not there", stop], max_gen_toks=12),
                              req("Q: 1 + 2 =", until=stop, max_gen_toks=12, do_sample=False),
                              req("Q: 1 + 2 =", until=[], max_gen_toks=5)])
    assert outs == [direct.text, cut, cut, direct.text[:5]]
    assert len(lm.generate_until([req("Q: 1 + 2 =")])[0]) == 8  # model_args max_new_tokens


def test_chat_template_and_context_formatting(lm):
    chat = lm.apply_chat_template([{"role": "user", "content": "hi"}])
    assert chat.startswith("<|im_start|>user\nhi<|im_end|>") and chat.endswith("assistant\n")
    assert lm.chat_template(True) == lm.llm.tokenizer.chat_template and lm.tokenizer_name
    direct = lm.llm.generate(["hi"], DecodeParams(max_new_tokens=6, chat_template=True))[0]
    assert lm.generate_until([req(chat, until=[], max_gen_toks=6)]) == [direct.text]
    lm.wrap_chat = True  # model_args chat_template=True: the adapter wraps bare contexts itself
    try:
        assert lm.generate_until([req("hi", until=[], max_gen_toks=6)]) == [direct.text]
    finally:
        lm.wrap_chat = False


def test_no_loglikelihoods_and_bad_args(lm, checkpoint):
    for fn in (lm.loglikelihood, lm.loglikelihood_rolling):
        with pytest.raises(NotImplementedError, match="computes no log-likelihoods"):
            fn([Instance("loglikelihood", {}, ("a", " b"), 0)])
    with pytest.raises(ValueError, match="unknown specfold model_args \\['bogus'\\]"):
        SpecfoldLM(pretrained=str(checkpoint()), bogus=1)
    assert truncate_at_stops("abc\n\nde", ["\n\n", "c"]) == "ab"
    assert truncate_at_stops("abc", ["", "z"]) == "abc"


def test_model_args_device_wins_over_lm_evals_device_flag():
    """lm-eval passes its --device (default cuda:0) beside --model_args; device=cpu there is no clash."""
    lm = SpecfoldLM.create_from_arg_string("pretrained=tiny,device=cpu,threads=1",
                                           {"batch_size": 4, "max_batch_size": None, "device": "cuda:0"})
    assert lm.llm.model.device.type == "cpu" and lm._device == "cpu"
    lm = SpecfoldLM.create_from_arg_obj({"pretrained": "tiny", "device": "cpu"}, {"device": "cuda:0"})  # lm-eval's CLI
    assert lm._device == "cpu"


def test_entry_point_without_lm_eval_gives_one_install_line():
    import subprocess
    import sys

    code = ("import sys; sys.modules['lm_eval'] = None\n"
            "from specfold.eval.lm_eval_adapter import main\nmain()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        "specfold-lm-eval: lm-eval is not installed; install it with: pip install 'specfold[lm-eval]'"]


def test_offline_data_set_gives_one_line_naming_include_path(tmp_path):
    """The real command, offline (HF_*_OFFLINE set, so no retries), on lm-eval's own gsm8k task,
    whose data set is on the Hub only: one line, exit 2, no traceback."""
    import os
    import subprocess
    import sys

    from specfold.eval.lm_eval_adapter import local_data_dir

    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    code = "import sys; from specfold.cli import lm_eval_main; sys.exit(lm_eval_main())"
    r = subprocess.run([sys.executable, "-c", code, "run", "--model", "specfold", "--model_args",
                        "pretrained=tiny,max_new_tokens=4", "--tasks", "gsm8k", "--limit", "1"],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("specfold-lm-eval: a task's data set is not available offline (Couldn't reach 'openai/gsm8k'")
    assert "--include_path" in last and local_data_dir() in last
