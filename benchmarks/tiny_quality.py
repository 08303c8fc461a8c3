"""Held-out quality of the embedded tiny model: accuracy and tokens per forward, per decode rule.

Runs vanilla greedy decoding over the model's own held-out problems (`heldout.jsonl`, saved with the
checkpoint and never seen in training) with static one-token-per-step and with the model's default
threshold 0.9 inside sub-blocks, and prints final-answer accuracy, worked-solution format rate, NFE,
tokens per forward and tokens/s.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tiny_quality.py --threads 1            # all 500
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tiny_quality.py --model /work/tiny_run --limit 200
"""
from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import torch

from specfold import LLM, DecodeParams
from specfold.tiny.data import final_answer, load_jsonl

RULES = {
    "static k=1": dict(rule="static", tokens_per_step=1),
    "sub_block threshold 0.9": dict(rule="sub_block", threshold=0.9),
}
_FORMAT = re.compile(r"^.+: \d+[+-]\d+=\d+\. .+: \d+[+-]\d+=\d+\.\n#### \d+$")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", help='"tiny" (the shipped one) or a checkpoint folder')
    ap.add_argument("--limit", type=int, default=None, help="first N held-out problems (default: all)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--rules", nargs="*", default=list(RULES), help=f"subset of {list(RULES)}")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--quality", default=None,
                    help="also write the quality record that `specfold bench` is tested against "
                         "(specfold/tiny/model/quality.json)")
    ap.add_argument("--show", type=int, default=0, help="print this many wrong answers per rule")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    llm = LLM(a.model, dtype="float32", device="cpu")
    folder = Path(llm.path) if hasattr(llm, "path") else None
    if folder is None or not (folder / "heldout.jsonl").is_file():
        from specfold.api import tiny_path
        folder = tiny_path() if a.model == "tiny" else Path(a.model)
    problems = load_jsonl(folder / "heldout.jsonl")[: a.limit]
    questions = [p["question"] for p in problems]
    results = {"model": str(folder), "problems": len(problems), "threads": a.threads, "rules": {}}
    quality = {}
    print(f"model {folder}  held-out problems {len(problems)}  threads {a.threads}")
    print(f"{'rule':<26}{'accuracy':>9}{'format':>8}{'NFE':>8}{'denoise':>9}{'tok/fwd':>9}"
          f"{'tok/denoise':>12}{'tok/s':>8}")
    for name in a.rules:
        params = DecodeParams(chat_template=True, max_new_tokens=a.max_new_tokens, **RULES[name])
        t0 = time.perf_counter()
        outs = llm.generate(questions, params)
        secs = time.perf_counter() - t0
        ok = fmt = nfe = den = toks = 0
        wrong = []
        for p, o in zip(problems, outs):
            good = final_answer(o.text) == final_answer(p["answer"])
            ok += good
            fmt += bool(_FORMAT.match(o.text.strip()))
            nfe += o.stats.nfe
            den += o.stats.verify_forwards
            toks += o.stats.tokens
            if not good:
                wrong.append((p, o.text))
        r = dict(accuracy=ok / len(problems), format_rate=fmt / len(problems), nfe=nfe,
                 denoising_forwards=den, tokens=toks, tokens_per_forward=toks / max(nfe, 1),
                 tokens_per_denoising_forward=toks / max(den, 1), tokens_per_second=toks / secs,
                 seconds=secs)
        results["rules"][name] = r
        quality[f"vanilla_{RULES[name]['rule']}"] = dict(
            RULES[name], accuracy=r["accuracy"], n=len(problems), max_new_tokens=a.max_new_tokens,
            tokens_per_forward=r["tokens_per_forward"],
            correct=[final_answer(o.text) == final_answer(p["answer"]) for p, o in zip(problems, outs)])
        print(f"{name:<26}{r['accuracy']:>9.3f}{r['format_rate']:>8.3f}{nfe:>8}{den:>9}"
              f"{r['tokens_per_forward']:>9.2f}{r['tokens_per_denoising_forward']:>12.2f}"
              f"{r['tokens_per_second']:>8.1f}", flush=True)
        for p, text in wrong[: a.show]:
            print(f"  Q: {p['question']}\n  expected: {p['answer']!r}\n  got:      {text!r}")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2) + "\n")
    if a.quality:
        Path(a.quality).write_text(json.dumps(quality) + "\n")


if __name__ == "__main__":
    main()
