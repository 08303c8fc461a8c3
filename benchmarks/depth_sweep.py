"""Spiffy / SpecFold against the draft graph's depth D at fixed B (issue 14; the SpecFold paper's
Fig. 8 in shape).

    python benchmarks/depth_sweep.py --model DIR [--depths 1,2,3,4] [--branches 7] [--n 20] --out DIR

Per D, a graph of B nodes none deeper than D is calibrated (`specfold calibrate --max-depth D`) on
fresh problems of the tiny task (disjoint from the held-out set) under the model's own rule, with
the source model (a widened checkpoint computes its function, so its graph is the source's). Then
vanilla, Spiffy and SpecFold (δ from --delta) run on the same held-out problems through
`specfold bench`'s runner, one thread; the table and `gain_vs_graph_depth.png` go into --out.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specfold import LLM, DecodeParams  # noqa: E402
from specfold.decoding.drafts.calibrate import calibrate  # noqa: E402
from specfold.eval.bench import run_bench  # noqa: E402
from specfold.eval.plots import write_plots  # noqa: E402
from specfold.eval.summary import format_table, summarize, token_match  # noqa: E402
from specfold.tiny import choices as C  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="checkpoint to time (e.g. a widened copy of tiny)")
    ap.add_argument("--source", default="tiny", help="model the graphs are calibrated with (default tiny)")
    ap.add_argument("--depths", default="1,2,3,4")
    ap.add_argument("--branches", type=int, default=7)
    ap.add_argument("--delta", type=float, default=0.1)
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--calibration-prompts", type=int, default=50)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    src = LLM(a.source, dtype="float32")
    held = {json.loads(x)["question"] for x in (Path(src.path) / "heldout.jsonl").read_text().splitlines()}
    rng, prompts = random.Random("depth-sweep"), []
    while len(prompts) < a.calibration_prompts:
        q = C.make_problem(rng)["question"]
        if q not in held:
            prompts.append(q)
    base = DecodeParams(chat_template=True, max_new_tokens=a.max_new_tokens)
    llm = LLM(a.model, dtype="float32")
    records = []
    for i, d in enumerate(int(x) for x in a.depths.split(",")):
        g = calibrate(src, prompts, base, a.branches, max_depth=d)
        path = g.save(out / f"graph_d{d}.json")
        methods = ["spiffy", "specfold"] if i else ["vanilla", "spiffy", "specfold"]
        recs = run_bench(llm, ["tiny"], methods, base.replace(graph=str(path), branches=a.branches, delta=a.delta),
                         [], str(Path(src.path) / "heldout.jsonl"), a.n, None, progress=False, warmup=1)
        van = {r["id"]: r for r in records + recs if r["method"] == "vanilla"}
        for r in recs:
            if r["method"] != "vanilla":
                r["setting"], r["sweep"] = f"graph_depth={d}", {"graph_depth": d}
                r["match"], r["exact"] = token_match(r["token_ids"], van[r["id"]]["token_ids"])
        records += recs
        print(f"D={d}: {len(g)} nodes, depths {sorted(set(g.depths()))}", flush=True)
    rows = summarize(records)
    table = format_table(rows)
    (out / "depth.md").write_text(table + "\n")
    print(table)
    for p in write_plots(rows, out):
        print("plot:", p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
