"""The shipped default Spiffy graphs of the tiny model, remade by calibration on fresh problems of its
task (`python -m specfold.tiny.graphs [MODEL_DIR]`)."""
from __future__ import annotations

import random
from pathlib import Path

from specfold.api import LLM
from specfold.decoding.drafts.calibrate import calibrate
from specfold.decoding.drafts.spiffy import GRAPHS
from specfold.params import DecodeParams
from specfold.tiny import choices as C
from specfold.tiny import data as D


def tiny_defaults(model: str = "tiny", n: int = 50, branches: int = 32, out_dir: str | Path | None = None) -> list[Path]:
    """(Re)make the shipped default graphs of the tiny model: threshold, sub_block and static rules, calibrated
    on `n` fresh problems of the model's task (the `choices` task when its held-out rows carry their
    facts, else the arithmetic one; a stream disjoint from the held-out set) through the chat template.
    `python -m specfold.tiny.graphs [MODEL_DIR]`."""
    llm = LLM(model, dtype="float32")
    rng = random.Random("spiffy-calibration")
    rows = D.load_jsonl(llm.path / "heldout.jsonl") if (llm.path / "heldout.jsonl").is_file() else []
    held = {r["question"] for r in rows}
    task, make = ("choices", C.make_problem) if rows and "facts" in rows[0] else ("arith", D.make_problem)
    prompts: list[str] = []
    while len(prompts) < n:
        q = make(rng)["question"]
        if q not in held:
            prompts.append(q)
    out_dir = Path(out_dir or GRAPHS)
    written = []
    for rule in ("threshold", "sub_block", "static"):
        p = DecodeParams(rule=rule, threshold=0.9, tokens_per_step=1, chat_template=True, max_new_tokens=128)
        g = calibrate(llm, prompts, p, branches)
        g.meta["source"] = (f"tiny_defaults(n={n}): fresh {task}-task problems, chat template, threshold 0.9 / "
                            f"static k=1")
        written.append(g.save(out_dir / f"tiny_{rule}.json"))
    return written


if __name__ == "__main__":
    import sys
    for f in tiny_defaults(sys.argv[1] if len(sys.argv) > 1 else "tiny"):
        print("wrote", f)
