"""`specfold eval`: score one decode method on benchmarks (accuracy, task metrics and speed).

The same engine as `specfold bench` with a single method and no vanilla comparison: samples are
generated with the chat template, one at a time, scored, and (with `--out`) appended to a
resumable JSONL of per-sample records.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from specfold.eval.bench import add_run_args, local_engines, model_label, run_bench
from specfold.eval.summary import summarize


def format_results(rows: Sequence[dict[str, Any]]) -> str:
    """One line per task: accuracy (n), the task's other metrics, then speed."""
    lines = []
    for r in rows:
        more = "".join(f", {k} {v:.3f}" for k, v in r["metrics"].items() if k != "accuracy")
        fold = f", fold ratio {r['fold_ratio']:.2f}" if r["fold_ratio"] is not None else ""
        lines.append(f"{r['task']} [{r['method']}]: accuracy {r['accuracy']:.3f} (n={r['n']}){more} | "
                     f"{r['nfe_per_sample']:.1f} NFE/sample, {r['tokens_per_forward']:.2f} tokens/forward, "
                     f"{r['tokens_per_second']:.1f} tokens/s{fold}")
    return "\n".join(lines)


def cmd_eval(a: argparse.Namespace) -> int:
    from specfold.args import params_from_args
    from specfold.decoding.methods import get_method
    from specfold.eval.bench import check_writable_dir, start_or_resume
    from specfold.eval.tasks import get_task

    params = params_from_args(a)
    get_method(params.method)  # unknown method: one line before the model is loaded
    tasks = [get_task(t) for t in a.tasks.split(",")]
    check_writable_dir(Path(a.out).parent if a.out else None, f"--out {a.out!r}: its folder")
    start_or_resume(a.out, a.overwrite, "eval")
    llm, generate = a.engines(a)
    records = run_bench(llm, tasks, [params.method], params, data=a.data, limit=a.limit,
                        out=a.out, model_name=model_label(a.model),
                        progress=not a.no_progress, warmup=a.warmup, label="eval", generate=generate)
    print(format_results(summarize(records)))
    if a.out:
        print(f"records: {a.out}", file=sys.stderr)
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    from specfold.args import add_model_args, add_settings
    p = subparsers.add_parser("eval", help="score a method on benchmarks",
                              description="Generate with the chat template, score, print accuracy and speed.")
    add_model_args(p)
    add_settings(p, exclude=("logprobs",))  # records keep no logprobs
    add_run_args(p)
    p.add_argument("--out", default=None, help="per-sample records JSONL (rerunning with it resumes)")
    p.set_defaults(func=cmd_eval, engines=local_engines)
    return p
