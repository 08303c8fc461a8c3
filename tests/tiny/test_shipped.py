"""The shipped tiny model: loads through LLM("tiny") from the package and decodes held-out problems."""
from pathlib import Path

import pytest

from specfold.tiny import data as D

MODEL_DIR = Path(D.__file__).resolve().parent / "model"
pytestmark = pytest.mark.skipif(not (MODEL_DIR / "model.safetensors").is_file(),
                                reason="no shipped tiny model (specfold/tiny/model/) yet")


def test_shipped_files_small_enough():
    assert sum(f.stat().st_size for f in MODEL_DIR.iterdir()) <= 25 * 2**20


def test_llm_tiny_decodes_heldout_static_deterministic(tiny_llm):
    from specfold import DecodeParams
    from specfold.api import tiny_path

    llm = tiny_llm
    assert Path(llm.path).resolve() == Path(str(tiny_path())).resolve()
    held = D.load_jsonl(Path(llm.path) / "heldout.jsonl")[:5]
    params = DecodeParams(chat_template=True, rule="static", tokens_per_step=1, max_new_tokens=96)
    outs = llm.generate([p["question"] for p in held], params)
    again = llm.generate([held[0]["question"]], params)
    assert again[0].token_ids == outs[0].token_ids
    right = [D.final_answer(o.text) == D.final_answer(p["answer"]) for p, o in zip(held, outs)]
    assert sum(right) >= 3, [o.text for o in outs]
    assert all("####" in o.text for o in outs)


@pytest.mark.slow
def test_tiny_loads_from_an_installed_wheel(tmp_path):
    """Build the wheel, install it into a folder outside the source tree and load LLM("tiny") from
    there in a fresh process: the model files travel as package data, not as a source-tree path."""
    import subprocess
    import sys

    root = MODEL_DIR.parents[2]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "w"), str(root)],
                   check=True, capture_output=True)
    wheel = next((tmp_path / "w").glob("specfold-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp_path / "site"),
                    str(wheel)], check=True, capture_output=True)
    code = ("import specfold, json; from specfold import LLM; llm = LLM('tiny'); "
            "print(json.dumps([specfold.__file__, str(llm.path)]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    import json
    pkg, model = json.loads(out.stdout.strip().splitlines()[-1])
    assert pkg.startswith(str(tmp_path / "site")) and model.startswith(str(tmp_path / "site"))
