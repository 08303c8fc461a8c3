"""Auto draft budgets against fixed ones and vanilla (issue 23), side by side in one process.

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/draft_budgets.py [--model tiny]
        [--widths native,0.5b] [--rules native,static] [--batches 1,16] [--budgets auto,0,1,2,4,7]
        [--methods freedave,spiffy,specfold] [--n 8] [--rounds 2] [--max-new-tokens 48] [--offset 0]
        [--fresh SEED]
        [--runs runs/widened] [--ab-last-layer] [--out FILE.json]

Per (width, rule, batch) cell: vanilla, and every speculative method at every budget, on the same
problems (the tiny task's held-out set, or with `--fresh SEED` problems of its fresh stream SEED that
no split of the shipped model has seen; chat template, greedy). Each configuration has one engine
for the whole cell, as a server holds one (since ac0a119; before, every run built its own through
`LLM.generate(DecodeParams)`, and paid for it). A run decodes `batch` prompts on it (batch 1: one
prompt at a time, `n` of them; batch B: B prompts at once, B concurrent requests). Runs are interleaved (every configuration once per round, rounds
repeated), so a shared machine's load hits all alike; each configuration gets one untimed warm-up
run first on two prompts (auto's first steps); the order of the configurations rotates from one unit (round, chunk) to the next.
Reported per configuration: tokens per process-CPU-second (`time.process_time` around each call:
steadier than the wall clock on a shared core; one thread) and per wall second, each as a ratio to
vanilla's pooled figure, and the *paired* ratio: the median over units of this configuration's
tokens per CPU-second over vanilla's in the same unit (the verdict against vanilla uses it; the one
against the best fixed budget uses auto over each fixed budget in the same unit, median over units, and
the lowest of these), and the best-of-rounds
ratio (each chunk at its fastest round: noise only adds time); NFE per request; the token match with vanilla; for auto the budgets it chose
(drafts per verification: distribution and mean) and, in the JSON, each arm's plays and rate.

`--ab-last-layer` adds, for every specfold budget, the same config with the folded verifier's last
layer on every row (`FoldVerifier.prune_last_layer = False`, the code before it ran only the rows the
head reads), interleaved in the same units; the verdicts ignore those configs. Auto is each config's own, so only
the fixed budgets compare cleanly.

Widened checkpoints (`specfold widen`, 0.5B preset width, the source's depth) are cost proxies with
the source's function (benchmarks/widened.py); they are kept under --runs.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from specfold import LLM, DecodeParams  # noqa: E402
from specfold.eval.tasks import get_task  # noqa: E402
from widened import RULES, widened_folder  # noqa: E402

METHODS = {"freedave": dict(method="freedave", draft_depth=8), "spiffy": dict(method="spiffy", branches=7),
           "specfold": dict(method="specfold", drafts="spiffy", branches=7)}


def configs(methods: list[str], budgets: list, rule: str, max_new: int) -> dict[str, DecodeParams]:
    base = dict(chat_template=True, max_new_tokens=max_new, **RULES[rule])
    out = {"vanilla": DecodeParams(**base)}
    for m in methods:
        for b in budgets:
            out[f"{m} {b}"] = DecodeParams(**base, **METHODS[m], draft_budget=b)
    return out


AUTOS = ("auto",)  # (the side-by-side of issue 42 added the earlier chooser here: branch issue42-matrix)


FULL_LAST = " full-last"  # a config name ending so runs with the folded verifier's last layer on every row


def problems_file(ckpt: str, seed: int | None, n: int, runs: Path) -> str | None:
    """The cell's problem file: `n` fresh problems of stream `fresh-{seed}` (written once under
    `runs`), else the checkpoint's held-out set (None: the task's own)."""
    if seed is not None:
        from specfold.tiny import data as D
        from specfold.tiny.fresh import fresh
        path = runs / f"fresh-{seed}-{n}.jsonl"
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            D.save_jsonl(fresh(seed, n), path)
        return str(path)
    held = Path(ckpt) / "heldout.jsonl"
    return str(held) if held.is_file() else None


def run_on(llm: LLM, engine, prompts: list[str], sp) -> list:
    """`llm.generate(prompts, sp)` on `engine` (the configuration's own, built once per cell, as a
    server holds one engine: no run pays for building it)."""
    return engine.run_all([llm.encode(p, sp) for p in prompts], [sp] * len(prompts), prompts)


def run_cell(llm: LLM, prompts: list[str], batch: int, params: dict[str, DecodeParams], rounds: int) -> tuple[dict, dict]:
    """Per configuration its units' records, and each auto configuration's chooser report at the end
    of the cell (each arm's plays and rate per batch size: what it had learnt)."""
    chunks = [prompts[i: i + batch] for i in range(0, len(prompts), batch)] if batch > 1 else [[p] for p in prompts]
    engines = {name: llm.engine(p.split()[0]) for name, p in params.items()}
    sps = {name: p.split()[1] for name, p in params.items()}
    for name in params:  # warm-up (untimed)
        with _last_layer(name):
            run_on(llm, engines[name], chunks[0][:2], sps[name])
    recs: dict[str, list[dict]] = {k: [] for k in params}
    names = list(params)
    unit = 0
    for _ in range(rounds):
        for chunk in chunks:
            order = names[unit % len(names):] + names[: unit % len(names)]  # rotated: no config always first
            unit += 1
            for name in order:
                with _last_layer(name):
                    c0, w0 = time.process_time(), time.perf_counter()
                    outs = run_on(llm, engines[name], chunk, sps[name])
                    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
                budgets = Counter()
                for o in outs:
                    for k, v in o.stats.extra.get("draft_budgets", {}).items():
                        budgets[int(k)] += v
                recs[name].append({"chunk": (unit - 1) % len(chunks), "cpu": cpu, "wall": wall,
                                   "tokens": sum(o.stats.tokens for o in outs),
                                   "nfe": sum(o.stats.nfe for o in outs), "n": len(outs),
                                   "ids": [list(o.token_ids) for o in outs], "budgets": dict(budgets)})
    return recs, {name: engines[name].budget.report() for name in params if name.split()[-1] in AUTOS}


@contextlib.contextmanager
def _last_layer(name: str):
    """Under a `FULL_LAST` config, the folded verifier runs its last layer's FFN on every row."""
    from specfold.decoding.verify.fold import FoldVerifier
    FoldVerifier.prune_last_layer = not name.endswith(FULL_LAST)
    try:
        yield
    finally:
        FoldVerifier.prune_last_layer = True


def summarize(recs: dict[str, list[dict]]) -> list[dict]:
    ref = recs["vanilla"]
    rows = []
    for name, rs in recs.items():
        tok = sum(r["tokens"] for r in rs)
        b = Counter()
        for r in rs:
            b.update(r["budgets"])
        ver = sum(b.values())
        match = [a == c for r, v in zip(rs, ref) for a, c in zip(r["ids"], v["ids"])]
        rows.append({"config": name, "tpcpu": tok / sum(r["cpu"] for r in rs), "tps": tok / sum(r["wall"] for r in rs),
                     "nfe": sum(r["nfe"] for r in rs) / sum(r["n"] for r in rs), "match": sum(match) / len(match),
                     "budgets": dict(sorted(b.items())),
                     "mean_budget": sum(k * v for k, v in b.items()) / ver if ver else 0.0})
    v = rows[0]
    for r, rs in zip(rows, recs.values()):
        r["x_cpu"], r["x_wall"] = r["tpcpu"] / v["tpcpu"], r["tps"] / v["tps"]
        # paired: per unit (round, chunk), this config's tokens per CPU-second over vanilla's in the
        # same unit; the median over units is robust to the machine's drifts and outliers
        pair = [(a["tokens"] / a["cpu"]) / (b["tokens"] / b["cpu"]) for a, b in zip(rs, ref)]
        r["x_pair"] = _median(pair)
        r["x_pair_iqr"] = [_quantile(pair, 0.25), _quantile(pair, 0.75)]  # the spread of the paired ratios
        r["units"] = len(pair)
        r["unit_rates"] = [a["tokens"] / a["cpu"] for a in rs]  # tokens per CPU-second, per unit
        # best of rounds: per chunk the least CPU time any round took (noise only ever adds time)
        r["x_best"] = _best_of_rounds(rs) / _best_of_rounds(ref)
    return rows


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    i = q * (len(xs) - 1)
    lo = int(i)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (i - lo)


def _best_of_rounds(rs: list[dict]) -> float:
    """Tokens per CPU-second with each chunk's fastest round (records are in unit order, chunks
    repeating every round)."""
    chunks: dict[int, list[dict]] = {}
    n = len({r["chunk"] for r in rs})
    for i, r in enumerate(rs):
        chunks.setdefault(i % n, []).append(r)
    return sum(min(rr, key=lambda r: r["cpu"])["tokens"] for rr in chunks.values()) / \
        sum(min(r["cpu"] for r in rr) for rr in chunks.values())


def verdicts(rows: list[dict], methods: list[str]) -> list[str]:
    """Per method: auto against vanilla (>= 0.97) and against the best fixed budget (within 3 %)."""
    by = {r["config"]: r for r in rows if not r["config"].endswith(FULL_LAST)}  # the verdicts: this code's
    out = []
    for m in methods:
        fixed = [r for k, r in by.items() if k.startswith(m + " ") and k.split()[-1] not in AUTOS]
        for which in AUTOS:
            auto = by.get(f"{m} {which}")
            if auto is not None and fixed:
                out += _verdict(m, which, auto, fixed, by)
    return out


def _verdict(m: str, which: str, auto: dict, fixed: list[dict], by: dict) -> list[str]:
    out = []
    best = max(fixed, key=lambda r: r["x_pair"])
    rel = auto["x_pair"] / best["x_pair"]
    # auto against every fixed budget in the same unit (median over units); the worst of them
    direct, worst = min((_median([a / b for a, b in zip(auto["unit_rates"], r["unit_rates"])]), r["config"])
                        for r in fixed)
    zero = by.get(f"{m} 0")  # budget 0 does vanilla's work: its ratio is what the cell can resolve
    if zero is not None:
        lo, hi = zero["x_pair_iqr"]
        out.append(f"{m}: resolution: budget 0 (vanilla's work) {zero['x_pair']:.3f}x vanilla, paired median over "
                   f"{zero['units']} units (quartiles {lo:.3f}-{hi:.3f}); auto's quartiles "
                   f"{auto['x_pair_iqr'][0]:.3f}-{auto['x_pair_iqr'][1]:.3f}")
    out.append(f"{m}: {which} {auto['x_pair']:.2f}x vanilla (paired median; aim >= 0.97: "
               f"{'met' if auto['x_pair'] >= 0.97 else 'NOT met'}); best fixed {best['config'].split()[1]} "
               f"{best['x_pair']:.2f}x; auto/best {rel:.3f} (ratio of the two medians against vanilla), "
               f"{direct:.3f} (auto against the fixed budget it trails most, {worst.split()[1]}, in the same unit, median; aim >= 0.97: "
               f"{'met' if direct >= 0.97 else 'NOT met'}); "
               f"auto chose (drafts per verification: verifications) {auto['budgets']}, mean {auto['mean_budget']:.2f}")
    return out


def table(rows: list[dict]) -> str:
    lines = ["| config | tok/CPU-s | (×v) | paired ×v | best-of-rounds ×v | tok/s | (×v) | NFE/req | match "
             "| drafts/verif. (auto: chosen) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        bud = "" if not r["budgets"] else f"{r['mean_budget']:.2f} {r['budgets']}" if r["config"].split()[-1] in AUTOS \
            else f"{r['mean_budget']:.2f}"
        lines.append(f"| {r['config']} | {r['tpcpu']:.1f} | {r['x_cpu']:.2f} | {r['x_pair']:.2f} | {r['x_best']:.2f} | "
                     f"{r['tps']:.1f} | {r['x_wall']:.2f} | "
                     f"{r['nfe']:.1f} | {r['match']:.2f} | {bud} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--widths", default="native,0.5b")
    ap.add_argument("--rules", default="native,static")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--budgets", default="auto,0,1,2,4,7")
    ap.add_argument("--methods", default="freedave,spiffy,specfold")
    ap.add_argument("--n", type=int, default=8, help="problems per batch-1 cell (batch B: B problems)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--offset", type=int, default=0, help="first problem of the set")
    ap.add_argument("--fresh", type=int, default=None, metavar="SEED",
                    help="problems from the tiny task's fresh stream SEED (specfold.tiny.fresh: no held-out, "
                         "training, tokenizer or calibration question) instead of the held-out set")
    ap.add_argument("--runs", default=str(ROOT / "runs" / "widened"))
    ap.add_argument("--checkpoints", default=None, help="comma-separated checkpoint folders to run instead of "
                                                        "--widths (e.g. widened copies made elsewhere)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ab-last-layer", action="store_true",
                    help="also run every specfold budget with the folded verifier's last layer on every row "
                         "(the code before it ran only the rows the head reads), side by side")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    methods = a.methods.split(",")
    budgets = [b if b in AUTOS else int(b) for b in a.budgets.split(",")]
    task = get_task("tiny")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    started = datetime.now(timezone.utc)
    results = {}
    targets = ([(Path(c).name, c) for c in a.checkpoints.split(",")] if a.checkpoints else
               [(w, widened_folder(a.model, w, None, Path(a.runs))[0]) for w in a.widths.split(",")])
    for width, ckpt in targets:
        llm = LLM(ckpt, dtype="float32", device=a.device)
        for rule in a.rules.split(","):
            for batch in (int(x) for x in a.batches.split(",")):
                n = a.n if batch == 1 else batch
                data = problems_file(ckpt, a.fresh, a.offset + n, Path(a.runs))
                prompts = [s.prompt for s in task.load(data, a.offset + n)[a.offset:]]
                t0 = time.perf_counter()
                cfg = configs(methods, budgets, rule, a.max_new_tokens)
                if a.ab_last_layer:
                    cfg.update({k + FULL_LAST: v for k, v in list(cfg.items()) if k.startswith("specfold ")})
                recs, learnt = run_cell(llm, prompts, batch, cfg, a.rounds)
                rows = summarize(recs)
                key = f"{width} width, {rule} rule, batch {batch}"
                load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
                results[key] = {"load": load, "seconds": time.perf_counter() - t0, "rows": rows, "units": {k: [{f: u[f] for f in ("chunk", "cpu", "wall", "tokens", "nfe", "budgets")}
                                                            for u in v] for k, v in recs.items()}, "auto": learnt}
                print(f"\n### {key} ({time.perf_counter() - t0:.0f} s, load average {load})\n\n{table(rows)}\n\n"
                      + "\n".join(f"- {v}" for v in verdicts(rows, methods)), flush=True)
    cpus = ",".join(str(c) for c in sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else "?"
    head = (f"Command: `OMP_NUM_THREADS=1 taskset -c {cpus} python benchmarks/draft_budgets.py "
            f"{' '.join(argv if argv is not None else sys.argv[1:])}`; {platform.machine()} CPU, device {a.device}, "
            f"{a.threads} thread, "
            f"float32, commit {commit}, started {started:%Y-%m-%d %H:%M} UTC, took "
            f"{(datetime.now(timezone.utc) - started).seconds} s.")
    print("\n" + head)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps({"header": head, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
