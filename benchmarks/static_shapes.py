"""Static shapes on the CPU (issue 19): EngineConfig(static_shapes=True) against the default engine,
side by side in one process, alternating, one thread.

    python benchmarks/static_shapes.py [--rounds 2] [--max-new-tokens 64] [--draft-budget 7]
        [--out benchmarks/results/static_shapes.json]

Static shapes pad every dense forward of a step to a bucket (packed rows, forwards, branches,
window rows, prefix keys: engine/graphs.py) so that a CUDA graph can replay it. On a CPU there is no
graph and no launch overhead to save: the padding is extra compute, and the pooled cache's prefix
gather is an extra copy. This measures that price: output tokens/s (process CPU time) of each
configuration, the ratio, the rows computed per row asked, and whether the tokens and forward
counts are the same (they must be). Batch 1 = `--n` questions one at a time, c16 = 16 at once.
A fixed draft budget (default 7) keeps the verified drafts equal on both sides (auto budgets follow
measured step times, which differ). Prompts: the tiny model's held-out questions, chat template.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from provenance import header, write_result  # noqa: E402

from specfold import LLM, EngineConfig, SamplingParams  # noqa: E402

METHODS = ("vanilla", "freedave", "spiffy", "specfold")


def decode(llm: LLM, cfg: EngineConfig, prompts: list[list[int]], max_new: int) -> dict:
    eng = llm.engine(cfg)
    eng.run_one(prompts[0], SamplingParams(max_new_tokens=8))  # warm-up (buffers)
    if eng.runner.static is not None:
        eng.runner.static.rows = [0, 0]
    outs, ids = {}, []
    t0 = time.process_time()
    for p in prompts:
        ids.append(eng.add_request(p, SamplingParams(max_new_tokens=max_new)))
    while eng.has_unfinished():
        for d in eng.step():
            if d.finished:
                outs[d.request_id] = d.output
    cpu = time.process_time() - t0
    got = [outs[i] for i in ids]
    st = eng.runner.static
    return {"seconds": cpu, "tokens": sum(len(o.token_ids) for o in got),
            "ids": [o.token_ids for o in got], "nfe": [o.stats.nfe for o in got],
            "rows_ratio": (st.rows[1] / max(st.rows[0], 1)) if st is not None else 1.0,
            "buckets": len(st.buckets) if st is not None else 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--draft-budget", default="7")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "static_shapes.json"))
    ap.add_argument("--note", default="", help="what the run shared the machine with (the result's machine note)")
    a = ap.parse_args()
    head = header(a.note)
    torch.set_num_threads(1)
    llm = LLM("tiny", dtype="float32")
    rows = [json.loads(x) for x in (ROOT / "specfold" / "tiny" / "model" / "heldout.jsonl").read_text().splitlines()]
    qs = [llm.encode(r["question"], SamplingParams(chat_template=True)) for r in rows[:16]]
    budget = a.draft_budget if a.draft_budget == "auto" else int(a.draft_budget)
    table = []
    for method in a.methods.split(","):
        for label, prompts, seqs in (("batch1", qs[: a.n], 1), ("c16", qs[:16], 16)):
            cfg = EngineConfig(method=method, max_num_seqs=seqs, draft_budget=budget)
            best: dict[bool, dict] = {}
            for r in range(a.rounds):
                for static in ((False, True) if r % 2 == 0 else (True, False)):
                    res = decode(llm, cfg.replace(static_shapes=static), prompts, a.max_new_tokens)
                    if static not in best or res["seconds"] < best[static]["seconds"]:
                        best[static] = res
            off, on = best[False], best[True]
            row = {"method": method, "batch": label, "tokens_s_off": off["tokens"] / off["seconds"],
                   "tokens_s_on": on["tokens"] / on["seconds"], "ratio": off["seconds"] / on["seconds"],
                   "rows_ratio": on["rows_ratio"], "buckets": on["buckets"],
                   "same_tokens": off["ids"] == on["ids"], "same_nfe": off["nfe"] == on["nfe"]}
            table.append(row)
            print(f"| {method} | {label} | {row['tokens_s_off']:.1f} | {row['tokens_s_on']:.1f} | {row['ratio']:.2f}x | "
                  f"{row['rows_ratio']:.2f} | {row['buckets']} | {row['same_tokens']}, {row['same_nfe']} |", flush=True)
    write_result(a.out, head, {"args": {k: v for k, v in vars(a).items() if k not in ("out", "note")}, "rows": table})


if __name__ == "__main__":
    main()
