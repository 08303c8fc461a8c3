"""Speculative decoding at realistic widths: a cost proxy (issue 11, SPEC §9).

    python benchmarks/widened.py [--model tiny|DIR] [--widths native,0.5b,1.5b] [--n 10]
        [--max-new-tokens 96] [--layers N] [--runs runs/widened] [--threads 1] [--out FILE.json]

Widens the model (`specfold widen`, float32) to the Qwen2.5-0.5B and 1.5B preset widths (depth: the
source's unless --layers; identity layers would scale every method's model time alike and fold like
the layer after them, see specfold/models/widen.py), then runs vanilla, FreeDave (d=8), Spiffy (B=7)
and SpecFold (δ=0.1, Spiffy drafts, B=7) on the same held-out problems under the model's native rule
and the static one-token rule. Methods are interleaved per problem (one thread, one process, an
untimed one-block warm-up each), so load on a shared machine hits them alike.

A widened model computes its source's function: accuracy, NFE, tokens per forward, accepted drafts,
token match and fold ratio are the source's (tested exactly in float64, tests/test_widen*.py); only
time changes. Its random extra weights make it a **cost proxy**, never a quality measurement.

Reported per (width, rule, method): accuracy, NFE per sample, tokens per forward, tokens/s (wall
clock, from the outputs' stats) and tokens per CPU-second (process CPU time around each generate
call: steadier than wall clock when other jobs share the core), each with its ratio to vanilla,
plus the fraction of problems whose tokens equal vanilla's, the mean fold ratio, and the share of
decode time outside the model forwards (drafting, store, rules, loop).
Widened folders are kept under --runs and reused when their config matches.
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specfold import LLM, DecodeParams  # noqa: E402
from specfold.eval.tasks import get_task  # noqa: E402
from specfold.models.widen import Shape, resolve_shape, source_spec, widen_checkpoint  # noqa: E402

def methods(delta: float) -> dict:
    """label -> DecodeParams fields."""
    return {
        "vanilla": {},
        "FreeDave d=8": dict(method="freedave", draft_depth=8),
        "FreeDave d=8 eager": dict(method="freedave", draft_depth=8, eager=True),
        "Spiffy B=7": dict(method="spiffy", branches=7),
        f"SpecFold δ={delta:g}": dict(method="specfold", drafts="spiffy", branches=7, delta=delta),
        f"SpecFold δ={delta:g} eager": dict(method="specfold", drafts="spiffy", branches=7, delta=delta, eager=True),
    }
RULES = {"native": {}, "static": dict(rule="static", tokens_per_step=1)}


def widened_folder(model: str, width: str, layers: int | None, runs: Path) -> tuple[str, Shape | None]:
    """The checkpoint to run for `width` ("native": the model itself), widened here unless cached."""
    if width == "native":
        return model, None
    path, _config, spec = source_spec(model)
    shape = resolve_shape(Shape.of(spec), spec.head_dim, width, layers=layers)
    name = f"{'tiny' if model == 'tiny' else path.name}-{width}-l{shape.layers}"
    folder = runs / name
    cfg_path = folder / "config.json"
    if cfg_path.is_file():
        cfg = json.loads(cfg_path.read_text())
        have = (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"],
                cfg["num_key_value_heads"], cfg["num_hidden_layers"])
        if have == (shape.hidden, shape.intermediate, shape.heads, shape.kv_heads, shape.layers) \
                and cfg.get("widened_from", {}).get("source") == model:
            return str(folder), shape
        raise SystemExit(f"error: {folder} holds another widening ({have}); remove it or pass another --runs")
    widen_checkpoint(model, folder, shape, seed=0, dtype="float32")
    return str(folder), shape


def run_width(checkpoint: str, samples, task, args) -> dict:
    """All rules x methods on one checkpoint, methods interleaved per sample."""
    from tqdm import tqdm
    llm = LLM(checkpoint, dtype="float32")
    out = {}
    for rule in args.rules.split(","):
        rkw = RULES[rule]
        params = {m: DecodeParams(chat_template=True, max_new_tokens=args.max_new_tokens, **rkw, **kw)
                  for m, kw in methods(args.delta).items()}
        if args.graphs:  # calibrated graphs of a model that ships none: DIR/<resolved rule>.json
            for m, p in params.items():
                if p.method in ("spiffy", "specfold") and p.drafts == "spiffy":
                    params[m] = p.replace(graph=str(Path(args.graphs) / f"{p.resolve(llm.spec).rule}.json"))
        for p in params.values():  # untimed warm-up: one block
            llm.generate([samples[0].prompt], p.replace(max_new_tokens=llm.spec.block_size))
        recs = {m: [] for m in params}
        for s in tqdm(samples, desc=f"{Path(checkpoint).name} {rule}", file=sys.stderr, unit="problem"):
            for m, p in params.items():
                c0 = time.process_time()
                o = llm.generate([s.prompt], p)[0]
                cpu = time.process_time() - c0
                recs[m].append({"id": s.id, "correct": bool(task.score(s, o.text).get("correct")),
                                "nfe": o.stats.nfe, "tokens": o.stats.tokens, "seconds": o.stats.seconds,
                                "cpu_seconds": cpu, "fold_ratio": o.stats.extra.get("fold_ratio"),
                                "model_seconds": o.stats.extra.get("model_seconds", 0.0),
                                "token_ids": list(o.token_ids)})
        out[rule] = recs
    return out


def summarize(recs: dict[str, list[dict]]) -> list[dict]:
    rows = []
    ref_ids = [r["token_ids"] for r in recs["vanilla"]]
    for m, rs in recs.items():
        tok, nfe = sum(r["tokens"] for r in rs), sum(r["nfe"] for r in rs)
        folds = [r["fold_ratio"] for r in rs if r["fold_ratio"] is not None]
        rows.append({"method": m, "n": len(rs), "accuracy": sum(r["correct"] for r in rs) / len(rs),
                     "nfe": nfe / len(rs), "tpf": tok / nfe, "tps": tok / sum(r["seconds"] for r in rs),
                     "tpcpu": tok / sum(r["cpu_seconds"] for r in rs),
                     "match": sum(r["token_ids"] == ids for r, ids in zip(rs, ref_ids)) / len(rs),
                     "fold": sum(folds) / len(folds) if folds else None,
                     "outside": 1 - sum(r.get("model_seconds", 0.0) for r in rs) / sum(r["seconds"] for r in rs)})
    return rows


def table(rows: list[dict]) -> str:
    v = rows[0]
    x = lambda r, k: f"{r[k]:.3f}" if k == "accuracy" else (f"{r[k]:.2f}" if k == "tpf" or r[k] < 10 else f"{r[k]:.1f}")
    lines = ["| method | accuracy | (×v) | NFE/sample | (×v) | tok/fwd | (×v) | tok/s | (×v) | tok/CPU-s | (×v) "
             "| match | fold ratio | outside fwd |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [r["method"]]
        for k in ("accuracy", "nfe", "tpf", "tps", "tpcpu"):
            cells += [x(r, k), f"{r[k] / v[k]:.2f}" if v[k] else "—"]
        cells += [f"{r['match']:.2f}", "—" if r["fold"] is None else f"{r['fold']:.2f}", f"{100 * r['outside']:.1f}%"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", help="source checkpoint folder or 'tiny'")
    ap.add_argument("--widths", default="native,0.5b,1.5b", help="comma-separated: native and/or presets")
    ap.add_argument("--n", type=int, default=10, help="held-out problems (the first n)")
    ap.add_argument("--data", default=None, help="held-out JSONL (default: the model folder's heldout.jsonl, "
                                                 "else the packaged tiny set)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--layers", type=int, default=None, help="depth of the widened models (default: the source's)")
    ap.add_argument("--runs", default=str(ROOT / "runs" / "widened"), help="where widened folders are kept")
    ap.add_argument("--graphs", default=None, help="folder of Spiffy graphs named <rule>.json (default: the "
                                                   "shipped graphs of the model's fingerprint)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--delta", type=float, default=DecodeParams().delta, help="SpecFold's δ (default: the library's)")
    ap.add_argument("--rules", default="native,static", help="comma-separated: native and/or static")
    ap.add_argument("--out", default=None, help="write the per-problem records as JSON here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = args.data
    if data is None and args.model != "tiny" and (Path(args.model) / "heldout.jsonl").is_file():
        data = str(Path(args.model) / "heldout.jsonl")
    task = get_task("tiny")
    samples = task.load(data, args.n)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip() or "?"
    started = datetime.now(timezone.utc)
    results, report = {}, []
    for width in args.widths.split(","):
        ckpt, shape = widened_folder(args.model, width, args.layers, Path(args.runs))
        t0 = time.perf_counter()
        results[width] = run_width(ckpt, samples, task, args)
        label = "native width" if shape is None else (
            f"{width} preset width: hidden {shape.hidden}, FFN {shape.intermediate}, {shape.heads}/{shape.kv_heads} "
            f"heads, {shape.layers} layers (cost proxy)")
        mine = [f"### {args.model}, {label}, {rule} rule (this width: {time.perf_counter() - t0:.0f} s)\n\n"
                f"{table(summarize(recs))}\n" for rule, recs in results[width].items()]
        report.extend(mine)
        print("\n".join(mine), flush=True)
    cmd = "python benchmarks/widened.py " + " ".join(argv if argv is not None else sys.argv[1:])
    head = (f"Command: `OMP_NUM_THREADS=1 {cmd.strip()}`; {len(samples)} held-out problems, max_new_tokens "
            f"{args.max_new_tokens}, float32, {args.threads} thread(s), {platform.machine()} CPU, commit {commit}, "
            f"started {started:%Y-%m-%d %H:%M} UTC, took {(datetime.now(timezone.utc) - started).seconds} s.")
    print("\n" + head + "\n\n" + "\n".join(report))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"header": head, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
