"""A model's first request: each method's first `generate` in a fresh process, against vanilla's (issue 42).

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/cold_start.py [--width 0.5b] [--n 4] [--rounds 3]
        [--max-new-tokens 32] [--configs vanilla,spiffy,specfold] [--runs runs/widened] [--out FILE.json]

Each configuration runs in a process of its own with an empty cache folder (XDG_CACHE_HOME), as a
new install would: it loads the checkpoint, builds its engine and decodes `n` fresh problems at once
(one batch, chat template, greedy, auto draft budgets). Reported per configuration: the process CPU
seconds of building the engine and of that first batch, their sum against vanilla's sum in the same
round (the ratio the issue bounds at 1.1), and the files left in the cache folder. Rounds interleave
the configurations, the order rotated each round. (The side-by-side with the earlier cost-model
chooser, `NAME@model`, ran on branch issue42-matrix, where that chooser still exists.)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from provenance import header, write_result  # noqa: E402

METHODS = {"vanilla": {}, "freedave": dict(method="freedave", draft_depth=8), "spiffy": dict(method="spiffy", branches=7),
           "specfold": dict(method="specfold", drafts="spiffy", branches=7)}


def child(a) -> dict:
    """One configuration's first request, in this (fresh) process."""
    import torch
    torch.set_num_threads(1)
    from draft_budgets import problems_file
    from widened import RULES, widened_folder
    from specfold import LLM, EngineConfig, SamplingParams
    from specfold.eval.tasks import get_task
    name = a.child
    ckpt = widened_folder("tiny", a.width, None, Path(a.runs))[0]
    prompts = [s.prompt for s in get_task("tiny").load(problems_file(ckpt, a.fresh, a.n, Path(a.runs)), a.n)]
    llm = LLM(ckpt, dtype="float32")
    sp = SamplingParams(max_new_tokens=a.max_new_tokens, temperature=0.0)
    ids = [llm.encode(p, sp) if hasattr(llm, "encode") else None for p in prompts]
    c0 = time.process_time()
    eng = llm.engine(EngineConfig(**RULES[a.rule], **METHODS[name]))
    c1 = time.process_time()
    outs = eng.run_all(ids, [sp] * len(ids), prompts)
    c2 = time.process_time()
    return {"build": c1 - c0, "first": c2 - c1, "tokens": sum(len(o.token_ids) for o in outs),
            "ids": [list(o.token_ids) for o in outs]}


def run(cfg: str, a) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, XDG_CACHE_HOME=cache, PYTHONPATH=str(ROOT))
        cmd = [sys.executable, __file__, "--child", cfg] + [f"--{k.replace('_', '-')}={v}" for k, v in
                                                            (("width", a.width), ("n", a.n), ("rule", a.rule),
                                                             ("max_new_tokens", a.max_new_tokens), ("runs", a.runs),
                                                             ("fresh", a.fresh))]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"{cfg} failed:\n{r.stderr[-2000:]}")
        out = json.loads(r.stdout.strip().splitlines()[-1])
        out["cache_files"] = sum(len(f) for _, _, f in os.walk(cache))
        return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--width", default="0.5b")
    ap.add_argument("--rule", default="static")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--fresh", type=int, default=17)
    ap.add_argument("--configs", default="vanilla,spiffy,specfold")
    ap.add_argument("--runs", default=str(ROOT / "runs" / "widened"))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a)))
        return 0
    head = header(note="see the command's taskset")
    cfgs = a.configs.split(",")
    recs: dict[str, list[dict]] = {c: [] for c in cfgs}
    for r in range(a.rounds):
        for c in cfgs[r % len(cfgs):] + cfgs[: r % len(cfgs)]:
            recs[c].append(run(c, a))
            print(f"round {r}: {c}: build {recs[c][-1]['build']:.2f} s, first batch {recs[c][-1]['first']:.2f} s",
                  flush=True)
    rows = summarize(recs)
    for row in rows:
        print(f"{row['config']}: build {row['build']:.2f} s + first batch {row['first']:.2f} s = "
              f"{row['total']:.2f} s; x vanilla (median of rounds) {row['x_vanilla']:.2f}; "
              f"tokens equal to vanilla's: {row['match']}; cache files {row['cache_files']}")
    if a.out:
        write_result(a.out, head, {"rows": rows, "rounds": recs})
    return 0


def summarize(recs: dict[str, list[dict]]) -> list[dict]:
    ref = recs["vanilla"]
    rows = []
    for c, rs in recs.items():
        ratios = sorted((x["build"] + x["first"]) / (v["build"] + v["first"]) for x, v in zip(rs, ref))
        rows.append({"config": c, "build": _mean([x["build"] for x in rs]), "first": _mean([x["first"] for x in rs]),
                     "total": _mean([x["build"] + x["first"] for x in rs]), "x_vanilla": ratios[len(ratios) // 2],
                     "x_vanilla_all": ratios, "match": all(x["ids"] == v["ids"] for x, v in zip(rs, ref)),
                     "cache_files": max(x["cache_files"] for x in rs)})
    return rows


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


if __name__ == "__main__":
    sys.exit(main())
