"""`specfold bench`: every decode method (and sweep point) on the same prompts, in one process.

`run_bench(llm, tasks, methods, ...)` generates and scores one sample at a time and appends one
record per (task, id, method, setting) to a JSONL file (`records.py`: resumable); the runs come
from `sweeps.py`; `summarize` (`summary.py`) turns records into table rows; `plots.py` draws them.

Invariants:
- Every method sees the same samples (the task's first `limit`) with the same base `DecodeParams`;
  a sweep point overrides fields of it. `setting` names the overrides ("default" when none).
- `vanilla` is the reference: it runs first for each task, and each record of another method is
  compared token by token with the vanilla record of the same sample (`match`, `exact`). Fields
  that only steer drafts and verification (`DRAFT_FIELDS`) do not apply to vanilla, so a sweep over
  them runs vanilla once; a sweep over any other field (threshold, block_size ...) runs vanilla at
  every point and each point is compared with its own vanilla.
- Resuming needs the same model and parameters per setting (else `ResumeError`).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from specfold.eval.records import RecordWriter, check_compatible, load_records
from specfold.eval.summary import REFERENCE, format_table, summarize, token_match
from specfold.eval.sweeps import Run, expand_runs, parse_sweep
from specfold.eval.tasks import Task, get_task


def model_label(model: str) -> str:
    """How records name the model: "tiny", or the checkpoint folder's absolute path."""
    return model if model == "tiny" else str(Path(model).expanduser().resolve())


def params_dict(params) -> dict[str, Any]:
    d = dataclasses.asdict(params)
    return {k: (v if v is None or isinstance(v, (bool, int, float, str)) else str(v)) for k, v in d.items()}


def run_bench(llm, tasks: Sequence[str | Task], methods: Sequence[str], base=None,
              sweeps: Sequence[tuple[str, list]] = (), data: str | None = None, limit: int | None = None,
              out: str | None = None, model_name: str | None = None, progress: bool = True,
              warmup: int = 0, label: str = "bench", generate=None,
              batch_sizes: Sequence[int] = (1,)) -> list[dict[str, Any]]:
    """Generate and score every (task sample, run); return the records of this run (resumed ones too).

    `base`: DecodeParams for every run (default: greedy, chat template on). `out`: JSONL to append
    to and resume from (None: nothing written). `warmup`: untimed generations before each run's
    first timed sample (compilation, caches), none when everything is resumed. `label`: the overall
    progress bar's name ("bench", "eval"). `generate(jobs, warmup)`: the outputs of `(prompt,
    DecodeParams)` jobs in job order, warm-ups its own (e.g. specfold/ray's actors); default: `llm`
    in this process, one sample at a time. `batch_sizes`: every run also at these batch sizes (B > 1:
    B samples at once through one engine, B concurrent requests; setting "...,batch=B", compared with
    vanilla at the same B; each record's `throughput_seconds` is its share of the batch's wall time).
    """
    from specfold.params import DecodeParams

    base = base or DecodeParams(chat_template=True)
    model_name = model_name or str(llm.path)
    runs = [_at_batch(r, b) for b in batch_sizes for r in expand_runs(methods, base, sweeps)]
    if generate is not None and any(b > 1 for b in batch_sizes):
        from specfold.errors import ParamsError
        raise ParamsError("--batch-sizes above 1 run in this process only (not with --ray)")
    done, loaded, pdicts, n_stored = _resume(tasks, runs, data, limit, out, model_name)
    total = sum(len(samples) for _, samples in loaded) * len(runs)
    overall = _bar(progress, label, total, n_stored, position=0, leave=True)
    decode = _local_path(llm, warmup) if generate is None else _ray_path(generate, loaded, runs, done, warmup)
    with overall, RecordWriter(out) as writer:
        return _record_runs(loaded, runs, done, decode, writer, overall, model_name, pdicts, progress)


def _resume(tasks, runs: list[Run], data, limit, out, model_name: str):
    """(the records stored in `out` by key, each task with its samples, each run's params as
    recorded, how many of this bench's records are stored); a stored record of other parameters
    fails here, before anything is generated."""
    done = load_records(out) if out else {}
    loaded = [(t, t.load(data, limit)) for t in (get_task(t) if isinstance(t, str) else t for t in tasks)]
    pdicts = {(run.method, run.setting): params_dict(run.params) for run in runs}
    stored = [(run, task, s, rec) for task, samples in loaded for run in runs for s in samples
              if (rec := done.get((task.name, s.id, run.method, run.setting))) is not None]
    for run, _task, _s, rec in stored:  # refuse to mix runs before generating anything
        check_compatible(rec, model_name, pdicts[(run.method, run.setting)], out)
    return done, loaded, pdicts, len(stored)


def _local_path(llm, warmup: int):
    """`decode(run, todo)` in this process: `warmup` untimed generations first, then the samples
    B at a time (the run's batch size); yields (samples, outputs, each one's share of the batch's wall
    time when B > 1 else None, each one's share of this process's CPU time)."""
    def decode(run: Run, todo: list):
        b = dict(run.sweep).get("batch", 1)
        for _ in range(warmup if todo else 0):
            llm.generate([s.prompt for s in todo[:b]], run.params)
        for i in range(0, len(todo), b):
            chunk = todo[i: i + b]
            t0, c0 = time.perf_counter(), time.process_time()
            outs = llm.generate([s.prompt for s in chunk], run.params)
            share = (time.perf_counter() - t0) / len(chunk) if b > 1 else None
            yield chunk, outs, share, (time.process_time() - c0) / len(chunk)
    return decode


def _ray_path(generate, loaded, runs: list[Run], done: dict, warmup: int):
    """`decode(run, todo)` over another process's outputs (specfold/ray's replicas): every job not
    stored is handed to `generate(jobs, warmup)` now, in the order the runs then take them one
    sample at a time (batch size 1; no CPU time of this process)."""
    outputs = iter(generate([(s.prompt, run.params) for task, samples in loaded for run in runs for s in samples
                             if (task.name, s.id, run.method, run.setting) not in done], warmup))

    def decode(_run: Run, todo: list):
        for s in todo:
            yield [s], [next(outputs)], None, None
    return decode


def _record_runs(loaded, runs: list[Run], done: dict, decode, writer: RecordWriter, overall, model_name: str,
                 pdicts: dict, progress: bool) -> list[dict[str, Any]]:
    """Each task's runs in order (vanilla first): stored records are taken as they are (compared
    with vanilla now when they were not), the others decoded (`decode`), scored, compared, written
    and counted on the bars."""
    records: list[dict[str, Any]] = []
    for task, samples in loaded:
        refs: dict[tuple[str, str], dict] = {}  # (setting, id) -> vanilla record
        for run in runs:
            todo = []
            for s in samples:
                rec = done.get((task.name, s.id, run.method, run.setting))
                if rec is None:
                    todo.append(s)
                    continue
                records.append(_with_match(rec, run, refs.get((run.ref_setting, s.id))))
                if run.method == REFERENCE:
                    refs[(run.setting, s.id)] = rec
            bar = _bar(progress and bool(todo), f"{task.name} {run.method} {run.setting}", len(todo), 0,
                       position=1, leave=False)
            with bar:  # closed on Ctrl-C too, so the terminal is left tidy
                for chunk, outs, share, cpu in decode(run, todo):
                    for s, o in zip(chunk, outs):
                        rec = make_record(task, s, run, o, model_name, pdicts[(run.method, run.setting)],
                                          refs.get((run.ref_setting, s.id)), share, cpu)
                        writer.write(rec)
                        records.append(rec)
                        if run.method == REFERENCE:
                            refs[(run.setting, s.id)] = rec
                        bar.update(1)
                        overall.update(1)
    return records


def make_record(task: Task, sample, run: Run, out, model_name: str, pdict: dict, ref: dict | None,
                throughput_seconds: float | None = None, cpu_seconds: float | None = None) -> dict:
    """One sample's record; `throughput_seconds`: its share of its batch's wall time (B > 1), and
    `cpu_seconds`: its share of this process's CPU time over the generate call (steadier than wall
    time when other jobs share the cores; None when another process generated it)."""
    st = out.stats
    score = task.score(sample, out.text)
    rec = {"task": task.name, "id": sample.id, "method": run.method, "setting": run.setting,
           "sweep": dict(run.sweep), "ref_setting": run.ref_setting, "model": model_name, "params": pdict,
           "output": out.text, "token_ids": list(out.token_ids), "finish_reason": out.finish_reason,
           "score": score, "correct": bool(score.get("correct")), "nfe": st.nfe, "tokens": st.tokens,
           "seconds": st.seconds, "tokens_per_forward": st.tokens_per_forward,
           "tokens_per_second": st.tokens_per_second, "fold_ratio": st.extra.get("fold_ratio"),
           "fold_ratio_excl_layer0": st.extra.get("fold_ratio_excl_layer0"),
           "extra": {str(k): v for k, v in st.extra.items()}, "batch": dict(run.sweep).get("batch", 1),
           "throughput_seconds": st.seconds if throughput_seconds is None else throughput_seconds,
           "cpu_seconds": cpu_seconds}
    match, exact = token_match(rec["token_ids"], ref["token_ids"]) if ref is not None else (None, None)
    rec["match"], rec["exact"] = match, exact
    return rec


def _at_batch(run: Run, b: int) -> Run:
    """`run` at batch size `b` (itself at 1): its setting and its vanilla reference say "batch=b"."""
    if b == 1:
        return run
    tag = lambda st: f"batch={b}" if st == "default" else f"{st},batch={b}"  # noqa: E731
    return Run(run.method, tag(run.setting), run.sweep + (("batch", b),), run.params, tag(run.ref_setting))


def _with_match(rec: dict, run: Run, ref: dict | None) -> dict:
    """A stored record made without vanilla in its run, compared now (in memory; the file is kept)."""
    if rec.get("match") is None and ref is not None and run.method != REFERENCE:
        rec = dict(rec)
        rec["match"], rec["exact"] = token_match(rec["token_ids"], ref["token_ids"])
    return rec


def _bar(enabled: bool, desc: str, total: int, initial: int, position: int, leave: bool):
    """tqdm progress bar with ETA on stderr (overall bar on top, the current run's below)."""
    from tqdm import tqdm
    return tqdm(total=total, initial=initial, desc=desc, unit="sample", disable=not enabled,
                file=sys.stderr, dynamic_ncols=True, position=position, leave=leave)


# ---------------------------------------------------------------------------------------- CLI
def add_run_args(ap: argparse.ArgumentParser) -> None:
    """Arguments shared by `bench` and `eval`."""
    ap.add_argument("--tasks", default="tiny", help="comma-separated task names (gsm8k, math500, humaneval, "
                                                      "mbpp, mbpp_full, ifeval, tiny, tiny_fresh)")
    ap.add_argument("--data", default=None, help="benchmark file or folder (e.g. ../shared/data)")
    from specfold.args import nonnegative_int, positive_int
    ap.add_argument("--limit", type=positive_int, default=None, help="first N samples of each task (N >= 1)")
    ap.add_argument("--warmup", type=nonnegative_int, default=1, help="untimed generations before each run")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--overwrite", action="store_true",
                    help="start over: discard the records already in --out instead of resuming from them")


def start_or_resume(out: str | None, overwrite: bool, label: str) -> None:
    """Before a run (and before the model loads): with `overwrite`, the records file `out` is removed;
    otherwise, when it holds records, one stderr line says the run resumes from them and how to start
    over. A corrupt file fails here (CorruptRecordError), not after loading the model."""
    if not out:
        return
    if overwrite:
        Path(out).unlink(missing_ok=True)
        return
    found = load_records(out)
    if found:
        print(f"{label}: resuming from {out} ({len(found)} records found; only the missing ones run); "
              f"to start over pass --overwrite or delete the file", file=sys.stderr)


def local_engines(a: argparse.Namespace):
    """(llm, generate) of a run in this process: the flags' LLM, no `generate` (run_bench's own loop).
    A room above may set another `engines` default on the parser (specfold/ray: `--ray`)."""
    from specfold.args import llm_from_args
    return llm_from_args(a), None


def cmd_bench(a: argparse.Namespace) -> int:
    from specfold.args import params_from_args
    from specfold.decoding.methods import method_names
    from specfold.errors import ParamsError

    sweeps = [parse_sweep(s) for s in a.sweep]
    tasks = [get_task(t) for t in a.tasks.split(",")]
    methods = a.methods.split(",") if a.methods else None  # None: every method this model can run
    unknown = [m for m in methods or [] if m not in method_names()]
    if unknown:
        raise ParamsError(f"unknown method(s) {unknown}; registered: {method_names()}")
    if methods:
        expand_runs(methods, params_from_args(a), sweeps)  # every sweep point valid before any work
    check_writable_dir(a.plot, "--plot")
    check_writable_dir(Path(a.out).parent if a.out else None, f"--out {a.out!r}: its folder")
    start_or_resume(a.out, a.overwrite, "bench")
    llm, generate = a.engines(a)
    if methods is None:
        methods = method_names(llm.spec)
        expand_runs(methods, params_from_args(a), sweeps)
    records = run_bench(llm, tasks, methods, params_from_args(a), sweeps, a.data,
                        a.limit, a.out, model_name=model_label(a.model),
                        progress=not a.no_progress, warmup=a.warmup, generate=generate,
                        batch_sizes=a.batch_sizes)
    rows = summarize(records)
    table = format_table(rows)
    print(table)
    if a.out:
        md = Path(a.out).with_suffix(".md")
        md.write_text(f"command: `{_command_line()}`\n\n{table}\n")
        print(f"\nrecords: {a.out}; table: {md}", file=sys.stderr)
    if a.plot:
        from specfold.eval.plots import write_plots
        for path in write_plots(rows, a.plot):
            print(f"plot: {path}", file=sys.stderr)
    return 0


def _batch_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return tuple(dict.fromkeys(sizes))


def check_writable_dir(folder: str | Path | None, what: str) -> None:
    """ParamsError (naming `what`) unless `folder` is a writable folder or can be created: checked
    before a long run, not after it."""
    from specfold.errors import ParamsError
    if folder is None:
        return
    d = Path(folder).expanduser()
    if d.exists() and not d.is_dir():
        raise ParamsError(f"{what} {str(d)!r} is a file, not a folder")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ParamsError(f"{what} {str(d)!r} cannot be created ({e.strerror or e})") from None
    if not os.access(d, os.W_OK | os.X_OK):
        raise ParamsError(f"{what} {str(d)!r} is not writable")


def _command_line() -> str:
    """The `specfold ...` command line of this process ("(from Python)" when not run as specfold)."""
    import shlex
    prog = Path(sys.argv[0]).name if sys.argv else ""
    if prog not in ("specfold", "cli.py", "__main__.py"):
        return "(from Python)"
    return "specfold " + " ".join(shlex.quote(x) for x in sys.argv[1:])


def register(subparsers) -> argparse.ArgumentParser:
    from specfold.args import add_model_args, add_settings
    p = subparsers.add_parser("bench", help="benchmark methods side by side",
                              description="Run every method (and sweep point) on the same prompts; write "
                                          "per-sample JSONL records (resumable) and print a markdown table.")
    add_model_args(p)
    add_settings(p, exclude=("method", "logprobs"))  # --methods instead; records keep no logprobs
    add_run_args(p)
    p.add_argument("--methods", default=None, help="comma-separated decode methods (default: all registered)")
    p.add_argument("--out", default="bench.jsonl", help="records JSONL; rerunning with the same file resumes "
                                                         "(--overwrite starts over)")
    p.add_argument("--sweep", action="append", default=[], metavar="FIELD=VALUES",
                   help="e.g. delta=0,0.05,0.1,0.2 or branches=2..8 (repeatable: grid)")
    p.add_argument("--plot", default=None, metavar="DIR", help="write PNG plots into DIR")
    p.add_argument("--batch-sizes", type=_batch_sizes, default=(1,), metavar="B1,B2,...",
                   help="run every method at these batch sizes too (B concurrent requests; default 1): "
                        "the tokens/s-against-batch-size plot")
    p.set_defaults(func=cmd_bench, engines=local_engines)
    return p
