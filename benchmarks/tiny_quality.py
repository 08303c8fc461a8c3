"""Held-out quality of the embedded tiny model: accuracy and tokens per forward, per decode rule.

Runs vanilla greedy decoding over the model's own held-out problems (`heldout.jsonl`, saved with the
checkpoint and never seen in training) with static one-token-per-step, the whole-block threshold rule
at 0.5 / 0.7 / 0.9 / 0.95 and the model's native threshold 0.9 inside sub-blocks, and prints
final-answer accuracy, worked-solution format rate (`specfold.tiny.data.well_formed`: every equation
right, a `####` line), NFE, tokens per forward and tokens/s. `--oracle` adds the same curve for the
Bayes-optimal denoiser of the task (`specfold.tiny.oracle`), the limit a perfect model reaches.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tiny_quality.py --threads 1            # all 500
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tiny_quality.py --model /work/tiny_run --limit 200
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specfold import LLM, DecodeParams
from specfold.eval.numeric import extract_number, numbers_equal
from specfold.tiny.data import load_jsonl, well_formed

from provenance import header, write_result  # benchmarks/ (this script's folder)

RULES = {
    "static k=1": dict(rule="static", tokens_per_step=1),
    "threshold 0.5": dict(rule="threshold", threshold=0.5),
    "threshold 0.7": dict(rule="threshold", threshold=0.7),
    "threshold 0.9": dict(rule="threshold", threshold=0.9),
    "threshold 0.95": dict(rule="threshold", threshold=0.95),
    "sub_block threshold 0.9": dict(rule="sub_block", threshold=0.9),
}
# quality.json key of each rule (`vanilla_<rule>[_<threshold>]`, read by tests/eval/test_bench.py)
KEYS = {"static k=1": "vanilla_static", "sub_block threshold 0.9": "vanilla_sub_block"}


def _correct(text: str, problem: dict) -> bool:
    """The tiny task's score (`specfold bench --tasks tiny`): the final number equals the reference's."""
    return numbers_equal(extract_number(text), extract_number(problem["answer"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", help='"tiny" (the shipped one) or a checkpoint folder')
    ap.add_argument("--limit", type=int, default=None, help="first N held-out problems (default: all)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--rules", nargs="*", default=list(RULES), help=f"subset of {list(RULES)}")
    ap.add_argument("--json", "--out", dest="json", default=None, help="write the results here (with the run's header)")
    ap.add_argument("--note", default="", help="what the run shared the machine with (the result's machine note)")
    ap.add_argument("--quality", default=None,
                    help="also write the quality record that `specfold bench` is tested against "
                         "(specfold/tiny/model/quality.json)")
    ap.add_argument("--show", type=int, default=0, help="print this many wrong answers per rule")
    ap.add_argument("--oracle", action="store_true", help="also print the Bayes-optimal oracle's curve")
    a = ap.parse_args()
    head = header(a.note)
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
            good = _correct(o.text, p)
            ok += good
            fmt += well_formed(o.text)
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
        key = KEYS.get(name, f"vanilla_{RULES[name]['rule']}_{RULES[name].get('threshold')}")
        quality[key] = dict(
            RULES[name], accuracy=r["accuracy"], n=len(problems), max_new_tokens=a.max_new_tokens,
            tokens_per_forward=r["tokens_per_forward"],
            correct=[_correct(o.text, p) for p, o in zip(problems, outs)])
        print(f"{name:<26}{r['accuracy']:>9.3f}{r['format_rate']:>8.3f}{nfe:>8}{den:>9}"
              f"{r['tokens_per_forward']:>9.2f}{r['tokens_per_denoising_forward']:>12.2f}"
              f"{r['tokens_per_second']:>8.1f}", flush=True)
        for p, text in wrong[: a.show]:
            print(f"  Q: {p['question']}\n  expected: {p['answer']!r}\n  got:      {text!r}")
    if a.oracle and all("facts" in p for p in problems):
        from specfold.tiny.oracle import curve
        res = curve(problems, llm.tokenizer, {n: RULES[n] for n in a.rules})
        results["oracle"] = res
        for name, r in res.items():
            print(f"oracle {name:<19}{r['accuracy']:>9.3f}  broken {r['broken']:.3f}"
                  f"  tok/fwd {r['tokens_per_forward']:.2f}", flush=True)
    if a.json:
        write_result(a.json, head, results)
    if a.quality:
        Path(a.quality).write_text(json.dumps(quality) + "\n")


if __name__ == "__main__":
    main()
