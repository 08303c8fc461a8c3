"""BENCHMARKS.md and the README's headline block, rendered from the result files in benchmarks/results/.

    python benchmarks/report.py            # rewrite BENCHMARKS.md and README.md's block between the markers
    python benchmarks/report.py --check    # exit 1 with one line if regenerating would change either (CI)

Invariants:
- Every figure on the page comes from a committed result file, and every table row names it. A file
  carries its command, commit, machine and date (benchmarks/provenance.py writes them; the older
  formats of tensor_parallel.py and draft_budgets.py are read too); the section prints them.
- One section per area, one table per section, in the order of `AREAS`; an area whose result file is
  absent is left out (no section, no headline), so a benchmark still running never breaks the check.
- The output depends only on the result files: no clock, no environment, dicts in file order, fixed
  number formats. So `--check` is stable, and a stale page is always a real difference.
- The README is touched only between `START` and `END`; everything else in it is kept byte for byte.
- Standard library only: it runs before anything is installed.
Earlier measurements, with their notes, are in docs/bench-log/ (written by hand, not by this script).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- bench:start -->", "<!-- bench:end -->"
LOG = "docs/bench-log/2026-11-30-to-12-07.md"  # the chronological notes up to this page (one file)
LIMIT = 300  # lines of BENCHMARKS.md: one page


# ---------------------------------------------------------------- reading result files

class Ctx:
    """The result files of one rendering, and links to them from the page being written."""

    def __init__(self, results: Path, page: Path):
        self.results, self.page = results, page
        self._cache: dict[str, object] = {}

    def has(self, name: str) -> bool:
        return (self.results / name).is_file()

    def load(self, name: str):
        if name not in self._cache:
            try:
                self._cache[name] = json.loads((self.results / name).read_text())
            except (OSError, ValueError) as e:
                raise SystemExit(f"report.py: cannot read {self.results / name}: {e}") from None
        return self._cache[name]

    def href(self, target: Path) -> str:
        return Path(os.path.relpath(target, self.page.parent)).as_posix()

    def link(self, name: str) -> str:
        return f"[{name}]({self.href(self.results / name)})"


def runs(d) -> list[dict]:
    """The runs in a file: one, or several merged (`runs: [...]`, a list of runs, or a dict of runs
    keyed by name, each a dict with its own header and results)."""
    if isinstance(d, list):
        return d
    if isinstance(d.get("runs"), list):
        return d["runs"]
    if d and "results" not in d and all(isinstance(v, dict) and "results" in v for v in d.values()):
        return list(d.values())
    return [d]


def headers(d) -> list[dict]:
    """Every run's header (`meta`); a run whose `header` is a list of sentences (merged results) has one each."""
    return [meta({"header": h}) for r in runs(d) for h in r["header"]] if any(
        isinstance(r.get("header"), list) for r in runs(d)) else [meta(r) for r in runs(d)]


def meta(d: dict) -> dict:
    """The header of a result file, whichever script wrote it: command, commit, date, machine, note, load."""
    if isinstance(d.get("header"), str):  # draft_budgets.py: one sentence
        h = d["header"]
        cmd = re.search(r"`([^`]*)`", h)
        commit = re.search(r"commit (\w+)", h)
        date = re.search(r"started (\d{4}-\d\d-\d\d)", h)
        mach = re.search(r"`; (.*?), float32", h)
        return {"command": cmd and cmd.group(1), "commit": commit and commit.group(1), "date": date and date.group(1),
                "machine": mach.group(1) if mach else "", "note": "", "load": [], "dirty": False}
    m = d.get("machine") or {}
    load = d.get("load") or [x[0] for x in (d.get("load_start"), d.get("load_end")) if x]
    return {"command": d.get("command"), "commit": d.get("commit"), "date": str(d.get("date") or d.get("started") or "")[:10],
            "machine": _machine(m), "note": m.get("note") or d.get("note") or "", "load": [x for x in load if x is not None],
            "dirty": bool(d.get("tree_dirty"))}


def _machine(m: dict) -> str:
    if not m:
        return ""
    aff = m.get("affinity")
    cpus = f", ran on cpu {','.join(map(str, aff))}" if aff and len(aff) < (m.get("cores") or 0) else ""
    return f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores{cpus}, torch {m.get('torch', '?')}"


def command(cmd: str | None) -> str:
    """The command as run, less its `--note` (printed apart, as the machine note)."""
    try:
        words = shlex.split(cmd or "")
    except ValueError:
        return cmd or "?"
    keep, skip = [], False
    for w in words:
        if skip or w == "--note":
            skip = not skip
            continue
        if not w.startswith("--note="):
            keep.append(w)
    return shlex.join(keep) if keep else "?"


def provenance(ctx: Ctx, name: str) -> list[str]:
    """One line per run: the file, its command, commit, date, machine, note and load."""
    out = []
    for h in headers(ctx.load(name)):
        commit = (h["commit"] or "?")[:7] + (" + uncommitted changes" if h["dirty"] else "")
        load = f"; load average {min(h['load']):.1f}-{max(h['load']):.1f}" if h["load"] else ""
        note = f"; {h['note']}" if h["note"] else ""
        out.append(f"{ctx.link(name)}: `{command(h['command'])}` (commit {commit}, {h['date']}; {h['machine']}{note}{load}).")
    return out


# ---------------------------------------------------------------- formatting

def table(columns: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)] + ["| " + " | ".join(r) + " |" for r in rows]


def x(v: float | None, nd: int = 2) -> str:
    return "—" if v is None else f"{v:.{nd}f}x"


def f2(v: float | None, nd: int = 2) -> str:
    return "—" if v is None else f"{v:.{nd}f}"


def pct(v: float | None, nd: int = 1) -> str:
    return "—" if v is None else f"{100 * v:.{nd}f} %"


def span(lo: float, hi: float, fmt: str = "{:.2f}", unit: str = "x") -> str:
    """`lo-hi` with the unit once, or one value when they print the same."""
    a, b = fmt.format(lo), fmt.format(hi)
    return f"{a}{unit}" if a == b else f"{a}-{b}{unit}"


def yes(v: bool) -> str:
    return "yes" if v else "**no**"


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def slug(title: str) -> str:
    """The anchor a markdown renderer (GitHub's rule) gives a heading."""
    s = re.sub(r"[^\w\- ]", "", title.strip().lower())
    return s.replace(" ", "-")


# ---------------------------------------------------------------- areas

def tensor_parallel(ctx: Ctx) -> list[str]:
    d = ctx.load("tensor_parallel.json")
    s = d["summary"]
    params = d["settings"].get("method_params", {})
    rows = []
    for c in s["cells"]:
        tp2, r = c["configs"]["tp2"], c["ratios"]
        label = c["method"] + (f" (budget {params[c['method']]['draft_budget']})"
                               if "draft_budget" in params.get(c["method"], {}) else "")
        q = r["tp2/1r1t"]
        rows.append([label, str(c["batch"]), f"{x(q['median'])} ({q['q1']:.2f}-{q['q3']:.2f})",
                     x(r["tp2/1r2t"]["median"]), pct(tp2["reduce_share"]), pct(tp2["send_share"]),
                     c["tp2_tokens_equal_1r1t_units"], ctx.link("tensor_parallel.json")])
    mem = s["memory"]
    return ["`-tp 2` (two ranks, one thread each, gloo) against one rank at one thread (1r1t) and at two threads "
            f"(1r2t), on the 0.5B-width proxy of the tiny model (`specfold widen --preset 0.5b`, a cost proxy); "
            f"{d['settings']['units']} interleaved units, each configuration in its own process; ratios are medians "
            "of per-unit ratios of tokens/s (quartiles). Each rank's parameter bytes: "
            f"{x(max(mem['tp2_ratio']), 3)} the full model's.", "", *provenance(ctx, "tensor_parallel.json"), "",
            *table(["method", "batch", "tp2 / 1r1t", "tp2 / 1r2t", "tp2: in all-reduce", "tp2: control send",
                    "tokens tp2 = 1r1t", "result"], rows)]


def tensor_parallel_headline(ctx: Ctx) -> str:
    s = ctx.load("tensor_parallel.json")["summary"]
    c = next(c for c in s["cells"] if c["method"] == "vanilla" and c["batch"] == 16)
    return (f"`-tp 2` on the 2-core CPU (0.5B-width proxy, vanilla, batch 16): {x(c['ratios']['tp2/1r1t']['median'])} "
            f"one rank at one thread, {x(c['ratios']['tp2/1r2t']['median'])} one rank at two threads; each rank holds "
            f"{x(max(s['memory']['tp2_ratio']))} the parameter bytes")


DB_FILE = "draft_budgets_matrix.json"
AUTO, MODEL, FULL_LAST = "auto", "model", " full-last"


def draft_cells(ctx: Ctx) -> list[dict]:
    """Per (cell, method) of the matrix: auto against vanilla, the fixed budgets and (if run) the
    earlier chooser; the figures draft_budgets.py prints as its verdicts."""
    out = []
    for body in runs(ctx.load(DB_FILE)):
        for cell, res in body["results"].items():
            by = {r["config"]: r for r in res["rows"] if not r["config"].endswith(FULL_LAST)}
            methods = [c.split()[0] for c in by if c.endswith(" " + AUTO)]
            for m in methods:
                auto = by[f"{m} {AUTO}"]
                fixed = [r for c, r in by.items() if c.split()[0] == m and c.split()[-1].isdigit()]
                if not fixed:
                    continue
                best = max(fixed, key=lambda r: r["x_pair"])
                trail, worst = _trail(auto, fixed)
                zero = by.get(f"{m} 0")
                out.append(dict(cell=cell, method=m, units=auto["units"], auto=auto["x_pair"],
                                best=best["config"].split()[-1], best_x=best["x_pair"], rel=auto["x_pair"] / best["x_pair"],
                                trail=trail, trailed=worst, zero=zero and zero["x_pair"],
                                drafts=auto["mean_budget"], match=auto["match"], model=None, model_bars=None))
                earlier = by.get(f"{m} {MODEL}")
                if earlier is not None:
                    out[-1].update(model=earlier["x_pair"], model_bars=_bars(earlier["x_pair"], earlier["x_pair"] /
                                                                             best["x_pair"], _trail(earlier, fixed)[0]))
    for c in out:
        c["bars"] = _bars(c["auto"], c["rel"], c["trail"])
    return out


def _trail(auto: dict, fixed: list[dict]) -> tuple[float, str]:
    """The median over units of a chooser against the fixed budget it trails most, and that budget."""
    t, name = min((median([a / b for a, b in zip(auto["unit_rates"], r["unit_rates"])]), r["config"]) for r in fixed)
    return t, name.split()[-1]


def _bars(x_van: float, rel: float, trail: float) -> bool:
    return x_van >= 0.97 and rel >= 0.97 and trail >= 0.97


def draft_budgets(ctx: Ctx) -> list[str]:
    cells = draft_cells(ctx)
    model = any(c["model"] is not None for c in cells)
    by: dict[str, list[dict]] = {}
    for c in cells:
        by.setdefault(c["cell"], []).append(c)
    rows = [[cell, str(cs[0]["units"]), " / ".join(c["method"] for c in cs), " / ".join(x(c["auto"]) for c in cs),
             " / ".join(f"{c['best']} {x(c['best_x'])}" for c in cs),
             " / ".join(f"{c['rel']:.3f} {c['trail']:.3f}" for c in cs), " / ".join(x(c["zero"]) for c in cs),
             " / ".join(f2(c["drafts"]) for c in cs), " / ".join(_yes(c["bars"]) for c in cs)]
            + ([" / ".join(x(c["model"]) for c in cs), " / ".join(_yes(c["model_bars"]) for c in cs)] if model else [])
            + [ctx.link(DB_FILE)] for cell, cs in by.items()]
    cols = ["cell", "units", "methods", "auto ×v", "best fixed (×v)", "auto / best, / trailed", "budget 0 ×v",
            "drafts/verif. (auto)", "auto: both bars"] + (["earlier ×v", "earlier: both bars"] if model else []) + ["result"]
    met = sum(c["bars"] for c in cells)
    runs_, met_ = sum(c["model"] is not None for c in cells), sum(bool(c["model_bars"]) for c in cells)
    earlier = (f" The earlier chooser (a cost model with acceptance estimates, {EARLIER_LINES}), measured beside it "
               f"in the same units: **{met_} of {runs_}**.{_budget_lines(ctx)} The side-by-side runs on branch "
               "`issue42-matrix` (the engine of 02c9e57 with main's bandit beside the earlier chooser; budget `model` "
               "is the earlier one).") if model else ""
    return ["`draft_budget=\"auto\"` against vanilla and every fixed budget, per cell (width × rule × batch) and "
            "method (the methods of a cell separated by /), configurations interleaved per unit. \"×v\": the median "
            "over units of tokens per CPU-second against vanilla in the same unit; \"auto / best\": the ratio of "
            "auto's and the best fixed budget's medians; \"/ trailed\": the median over units of auto against the "
            "fixed budget it trails most, in the same unit; budget 0 (vanilla's work) shows what a cell resolves. "
            "Both bars: auto ≥ 0.97x vanilla, and ≥ 0.97 by both auto-against-best measures. 0.5B width is a cost "
            "proxy (a widened tiny model). SpecFold runs at δ = 0.05 (approximate). "
            f"**auto (the bandit): {met} of {len(cells)} (cell, method) rows meet both bars.**{earlier}", "",
            " ".join(provenance(ctx, DB_FILE)), "", *table(cols, rows)]


def _yes(v: bool | None) -> str:
    return "—" if v is None else ("yes" if v else "no")


EARLIER_LINES = ("1,539 lines at a81735d: engine/budget.py 702, engine/cost.py 524, decoding/drafts/acceptance.py "
                 "198, decoding/proposal.py 115")


def _budget_lines(ctx: Ctx) -> str:
    """The bandit's lines, as the matrix file records them (`lines`: file -> lines at the measured code)."""
    d = ctx.load(DB_FILE)
    n = d.get("lines") if isinstance(d, dict) else None
    if not n:
        return ""
    return f" The bandit's budget component: {sum(n.values())} lines ({', '.join(f'{f} {k}' for f, k in n.items())})."


def draft_budgets_headline(ctx: Ctx) -> str:
    cells = draft_cells(ctx)
    pay = [c for c in cells if c["drafts"] >= 0.3]
    best = max(pay, key=lambda c: c["auto"]) if pay else None
    tail = f"; where drafts pay, up to {x(best['auto'])} ({best['method']}, {best['cell']})" if best else ""
    earlier = [c["model_bars"] for c in cells if c["model"] is not None]
    beside = f" (the earlier chooser, in the same units: {sum(earlier)} of {len(earlier)})" if earlier else ""
    return (f"`draft_budget=\"auto\"`: {sum(c['bars'] for c in cells)} of {len(cells)} (cell, method) rows at ≥ 0.97x "
            f"vanilla and within 3 % of the best fixed budget{beside}{tail}")


COLD = "cold_start.json"


def cold_start(ctx: Ctx) -> list[str]:
    rows = [[r["config"].replace("@model", " (earlier chooser)"), f"{r['build']:.2f}", f"{r['first']:.2f}",
             x(r["x_vanilla"]), " ".join(f"{v:.2f}" for v in r["x_vanilla_all"]), yes(r["match"]),
             str(r["cache_files"]), ctx.link(COLD)] for r in ctx.load(COLD)["rows"]]
    return ["A model's first request: each configuration in a fresh process with an empty cache folder builds its "
            "engine and decodes 4 fresh problems at once (0.5B-width cost proxy, static rule, greedy, auto draft "
            "budgets). Process CPU seconds; \"×v\" the median over rounds of build + first batch against vanilla's "
            "in the same round (the issue's bound: 1.1). The earlier chooser calibrated its cost model at start and "
            "left a cache file.", "", *provenance(ctx, COLD), "",
            *table(["configuration", "build (s)", "first batch (s)", "×v (median)", "×v per round",
                    "tokens = vanilla's", "cache files", "result"], rows)]


def cold_start_headline(ctx: Ctx) -> str:
    r = {row["config"]: row for row in ctx.load(COLD)["rows"]}
    return (f"a model's first request with Spiffy costs {x(r['spiffy']['x_vanilla'])} and with SpecFold "
            f"{x(r['specfold']['x_vanilla'])} vanilla's first (no calibration, no cache file)")


def tiny_quality(ctx: Ctx) -> list[str]:
    d = ctx.load("tiny_quality.json")
    oracle = d.get("oracle", {})
    rows = []
    for name, r in d["rules"].items():
        o = oracle.get(name)
        rows.append([name, pct(r["accuracy"]), pct(r["format_rate"]), f2(r["tokens_per_forward"]),
                     f2(r["tokens_per_denoising_forward"]),
                     f"{pct(o['accuracy'])} / {o['tokens_per_forward']:.2f}" if o else "—", ctx.link("tiny_quality.json")])
    return [f"Vanilla greedy decoding of the shipped `tiny` model on its {d['problems']} held-out problems (chat "
            "template), per unmask rule: final-answer accuracy, worked-solution format, tokens per forward (prefill "
            "and commits included) and per denoising forward, beside the task's Bayes-optimal oracle (what a perfect "
            "model reaches; it counts denoising forwards). No timing.", "", *provenance(ctx, "tiny_quality.json"), "",
            *table(["rule", "accuracy", "format", "tok/fwd", "tok/denoising fwd", "oracle: accuracy / tok per denoising fwd",
                    "result"], rows)]


def tiny_quality_headline(ctx: Ctx) -> str:
    r = ctx.load("tiny_quality.json")["rules"]
    parts = [f"{k} {pct(v['accuracy'])} at {v['tokens_per_forward']:.2f} tokens per forward" for k, v in r.items()
             if k in ("static k=1", "sub_block threshold 0.9", "threshold 0.5")]
    return "the embedded tiny model's held-out accuracy: " + "; ".join(parts)


def engine_load(ctx: Ctx) -> list[str]:
    d = ctx.load("engine_load.json")
    by = {(r["method"], r["mode"], r["concurrency"]): r for r in d["rows"]}
    rate = {k: r["tokens_per_s"] for k, r in by.items()}

    def vs1(m: str, mode: str, c: int) -> str:  # against the same method and mode with one client
        return x(rate[(m, mode, c)] / rate[(m, mode, 1)]) if (m, mode, c) in rate and (m, mode, 1) in rate else "—"

    def vsv(m: str, mode: str, c: int) -> str:  # against vanilla batched at the same concurrency
        return x(rate[(m, mode, c)] / rate[("vanilla", "batched", c)]) \
            if (m, mode, c) in rate and ("vanilla", "batched", c) in rate else "—"

    rows = []
    for m, c in dict.fromkeys((m, c) for m, _, c in by):
        fwd = " / ".join(f2(by[(m, mode, c)]["tokens_per_forward"]) for mode in ("batched", "auto") if (m, mode, c) in by)
        match = min(r["token_match"] for (mm, _, cc), r in by.items() if (mm, cc) == (m, c))
        rows.append([m, str(c), vs1(m, "sequential", c), vs1(m, "batched", c), vs1(m, "auto", c), vsv(m, "batched", c),
                     vsv(m, "auto", c), fwd, f2(match), ctx.link("engine_load.json")])
    meta_ = d["meta"]
    return [f"The engine in process, closed loop: c clients each keep one request in it until {meta_['requests']} (or c) "
            f"requests of {meta_['max_new_tokens']} new tokens are done (`{meta_['model']}`, {meta_['dtype']}, the "
            f"model's rule{'' if meta_.get('rule') is None else ', rule ' + str(meta_['rule'])}). Modes: sequential = "
            "one request at a time (the others queue); batched = `max_num_seqs=c`, every draft verified (budget 64); "
            "auto = batched with `draft_budget=\"auto\"`. Tokens per process-CPU-second against the same method and "
            "mode with one client, and against vanilla batched at the same concurrency; match = the lowest share of "
            "requests with the one-at-a-time tokens.", "", *provenance(ctx, "engine_load.json"), "",
            *table(["method", "clients", "sequential vs 1 client", "batched vs 1 client", "auto vs 1 client",
                    "batched ×vanilla", "auto ×vanilla", "tok/fwd (batched / auto)", "match", "result"], rows)]


def engine_load_headline(ctx: Ctx) -> str:
    rows = ctx.load("engine_load.json")["rows"]
    b = {(r["method"], r["mode"], r["concurrency"]): r["tokens_per_s"] for r in rows}
    v = b.get(("vanilla", "batched", 16), 0) / b.get(("vanilla", "batched", 1), 1)
    autos = [b[(m, "auto", 16)] / b[("vanilla", "batched", 16)] for m, mode, c in b if mode == "auto" and c == 16]
    tail = f"; with auto draft budgets the speculative methods run at {span(min(autos), max(autos))} vanilla's" \
        if autos else ""
    return f"the engine at 16 concurrent requests: vanilla {x(v)} its one-request tokens per CPU-second{tail}"


def engine_overhead(ctx: Ctx) -> list[str]:
    d = ctx.load("engine_overhead.json")
    t = d["table"]
    old = (d.get("vs") or {}).get("commit") or "the old tree"
    rows = []
    for key in [k for k in t if k.endswith("/batch1")]:
        rule, method, _ = key.split("/")
        b1, c16 = t[key], t.get(f"{rule}/{method}/c16", {})
        rows.append([rule, method, f"{pct(b1['outside_old'])} → {pct(b1['outside_new'])}", x(b1["tok_s_ratio"]),
                     f"{pct(c16.get('outside_old'))} → {pct(c16.get('outside_new'))}", x(c16.get("tok_s_ratio")),
                     "yes" if b1["same_tokens"] and c16.get("same_tokens") else "no",
                     f"{b1['nfe_old']} → {b1['nfe_new']} / {c16.get('nfe_old')} → {c16.get('nfe_new')}",
                     ctx.link("engine_overhead.json")])
    return [f"The share of process CPU time outside the model's packed calls (`forward_many`, `verify_many`), this "
            f"tree against {old[:7]} (the engine before the batch-first program), each in its own process, "
            f"alternating, {d['rounds']} rounds (the best of each); `tiny`, {d['n']} held-out questions one at a time "
            f"(batch 1) and 16 at once (c16), {d['max_new_tokens']} new tokens, the default draft budget. tokens/s "
            "new/old: tokens per CPU-second. SpecFold runs at δ = 0.05 (approximate).", "",
            *provenance(ctx, "engine_overhead.json"), "",
            *table(["rule", "method", "batch 1 outside: old → new", "batch 1 tok/s new/old", "c16 outside: old → new",
                    "c16 tok/s new/old", "same tokens", "NFE old → new (b1 / c16)", "result"], rows)]


def engine_overhead_headline(ctx: Ctx) -> str:
    t = ctx.load("engine_overhead.json")["table"]
    b1 = [v["outside_new"] for k, v in t.items() if k.startswith("native/") and k.endswith("/batch1")]
    return (f"host work outside the model's forwards, `tiny` under its own rule, one request at a time: "
            f"{span(100 * min(b1), 100 * max(b1), '{:.0f}', ' %')} of the CPU time")


def static_shapes(ctx: Ctx) -> list[str]:
    d = ctx.load("static_shapes.json")
    a = d["args"]
    rows = [[r["method"], "1" if r["batch"] == "batch1" else "16", x(r["ratio"]), f2(r["rows_ratio"]), str(r["buckets"]),
             f"{'yes' if r['same_tokens'] else 'no'}, {'yes' if r['same_nfe'] else 'no'}", ctx.link("static_shapes.json")]
            for r in d["rows"]]
    return ["`EngineConfig(static_shapes=True)` (every forward padded to a bucket, what CUDA graphs need) against the "
            "default engine on the CPU, where padding is only extra compute: tokens per CPU-second on / off (best of "
            f"{a['rounds']} alternating rounds), packed rows computed per row asked, buckets used; `tiny`, fixed draft "
            f"budget {a['draft_budget']}, batch 1 = {a['n']} questions one at a time, 16 = 16 at once.", "",
            *provenance(ctx, "static_shapes.json"), "",
            *table(["method", "batch", "on / off", "rows", "buckets", "same tokens, NFE", "result"], rows)]


def fold_layer(ctx: Ctx) -> list[str]:
    d = ctx.load("fold_layer.json")
    s = d["settings"]
    rows = [[r["width"], f2(r["fold"]), f2(r["ffn_fold"]), x(r["fold_ms"] / r["dense_ms"]), f2(r["bound"]),
             f2(r["fold_ms"] / r["dense_ms"] / r["bound"]), f2(r["in_stack_ms"] / r["dense_ms"] / r["bound"]),
             f2(r["rows_ms"] / r["dense_ms"]), f2(r["fold_ms"] / r["rows_ms"]), f"{r['max_abs_diff']:.1e}",
             ctx.link("fold_layer.json")] for r in d["rows"]]
    return ["One folded decoder layer against the dense layer (torch backend), **random weights** (a proxy) at "
            f"0.5B width (d 896, FFN 4864, 14/2 heads), B = {s['B']} drafts, N = {s['N']}, P = {s['prefix']}, "
            f"δ = {s['delta']}, medians of {s['reps']} interleaved calls on the thread's CPU clock. bound = the "
            "share of rows folding leaves; floor = the dense layer on only those rows; in-stack = the layer as it "
            "runs inside a verification (one gate, one sync).", "", *provenance(ctx, "fold_layer.json"), "",
            *table(["width", "fold ratio", "FFN fold", "fold / dense", "bound", "fold / bound", "in-stack / bound",
                    "floor", "fold / floor", "max abs diff", "result"], rows)]


def fold_layer_headline(ctx: Ctx) -> str:
    rows = ctx.load("fold_layer.json")["rows"]
    r = min(rows, key=lambda r: abs(r["fold"] - 0.46))
    return (f"one folded 0.5B-width layer (random weights) at fold ratio {r['fold']:.2f} costs "
            f"{r['in_stack_ms'] / r['dense_ms'] / r['bound']:.2f}x the dense cost of the rows it recomputes, in a stack")


def fold_verify(ctx: Ctx) -> list[str]:
    d = ctx.load("specfold_verify.json")["parts"]["tiny"]
    rows = []
    for r in d["rows"]:
        f = r["fold"] or {}
        rows.append([f2(r["delta"]), f"{r['batches']} ({r['n']})", x(r["fold_ms"] / r["dense_ms"]),
                     f"{f2(f.get('fold_ratio'))} ({f2(f.get('fold_ratio_excl_layer0'))})", f2(f.get("ffn_fold_ratio")),
                     f"{r['max_abs_logit_diff']:.1e}", ctx.link("specfold_verify.json")])
    return [f"SpecFold's folded verification against dense verification on the verification batches the decode loop "
            f"makes on `tiny` (Spiffy drafts, {d['rule']} rule, {d['prompts']} held-out prompts, {d['batches']} batches, "
            f"mean B + 1 = {d['mean_branches']:.2f}), each replayed through both, the minimum of {d['reps']} per batch "
            "on the thread's CPU clock. At δ = 0 folding is exact (the logit difference is float32 rounding).", "",
            *provenance(ctx, "specfold_verify.json"), "",
            *table(["δ", "batches", "fold / dense", "fold ratio (excl. layer 0)", "FFN fold ratio", "max abs logit diff",
                    "result"], rows)]


def fold_verify_headline(ctx: Ctx) -> str:
    rows = ctx.load("specfold_verify.json")["parts"]["tiny"]["rows"]
    r = next(r for r in rows if r["delta"] == 0 and r["batches"] == "all")
    return f"SpecFold at δ = 0 (exact) costs {x(r['fold_ms'] / r['dense_ms'])} dense verification on the tiny model's batches"


def serve_load(ctx: Ctx) -> list[str]:
    d = ctx.load("serve_load.json")
    rows_in = d["rows"]
    one = {r["server"]: r["req_per_s"] for r in rows_in if r["concurrency"] == 1}
    eng = {r["concurrency"]: r["req_per_s"] for r in rows_in if r["server"] == "in-process engine"}
    p95 = {r["server"]: r["p95_s"] for r in rows_in if r["concurrency"] == 1}
    rows = [[r["server"], str(r["concurrency"]), f"{r['errors']} of {r['requests']}", x(r["req_per_s"] / one[r["server"]]),
             x(r["req_per_s"] / eng[r["concurrency"]]) if r["server"] != "in-process engine" else "—",
             x(r["p95_s"] / p95[r["server"]]) if r["server"] != "in-process engine" else "—", ctx.link("serve_load.json")]
            for r in rows_in]
    s = d["settings"]
    return ["`specfold serve --model tiny` under loopback load: c closed-loop clients send chat requests (held-out "
            f"questions, greedy, max_tokens {s['max_tokens']}), {s['requests']} per level, the clients on the same core "
            "as the server; beside it the same requests through an in-process engine (no HTTP, all queued at once: "
            "only its throughput compares). Requests per second against one client, and against the in-process engine "
            "at the same concurrency; p95 latency against one client. Wall-clock rates: on a shared core they move with the "
            "other jobs' load (the machine note says what ran beside).", "", *provenance(ctx, "serve_load.json"), "",
            *table(["server", "clients", "errors", "req/s vs 1 client", "req/s vs in-process engine", "p95 vs 1 client",
                    "result"], rows)]


def sandbox_cost(ctx: Ctx) -> list[str]:
    d = ctx.load("sandbox_cost.json")
    rows = [[d["isolation"], f"{d['passed']} of {d['programs']}", x(d["ratio"]), x(d["p90_s"] / d["bare_median_s"]),
             ctx.link("sandbox_cost.json")]]
    return ["The code sandbox's cost per program: every canonical HumanEval solution run through `HumanEval.score` "
            "(bubblewrap, seccomp, interpreter start, guard, the program, teardown), one at a time, next to a bare "
            "`python -I -S -c pass` start-up in the same loop. Wall time, so the ratio is the figure.", "",
            *provenance(ctx, "sandbox_cost.json"), "",
            *table(["isolation", "passed", "median / bare start-up median", "p90 / bare start-up median", "result"], rows)]


LLADA2 = "llada2_speculation.json"


def llada2(ctx: Ctx) -> list[str]:
    d = ctx.load(LLADA2)
    rows = []
    for rule, entry in d["rules"].items():
        van = entry["vanilla"]["nfe"]
        for m, r in entry.items():
            if isinstance(r, dict):
                rows.append([rule, m, str(r["nfe"]), str(r["verify"]), str(r["drafts"]), str(r["hits"]),
                             x(r["nfe"] / van), "yes" if r["equal"] else "**no**", ctx.link(LLADA2)])
    sh = d["shape"]
    return [f"Lossless speculation on a **random-weight** LLaDA2-shaped checkpoint (a proxy: {sh['num_hidden_layers']} "
            f"layers, {sh['num_experts']} experts of width {sh['moe_intermediate_size']}, top-{sh['num_experts_per_tok']}; "
            f"{d['dtype']}), {d['n']} random prompts, {d['max_new_tokens']} new tokens, every draft verified; Spiffy's "
            f"graphs calibrated per rule on {d['calib']} other prompts. Forwards only (no timing): NFE = prefill + "
            "verifications + commits; hits = verified drafts the trajectory reached. Random weights say nothing "
            "about a trained model's acceptance (docs/LLADA2.md).", "", *provenance(ctx, LLADA2), "",
            *table(["rule", "method", "NFE", "verifications", "drafts verified", "hits", "NFE ×v", "tokens = vanilla's",
                    "result"], rows)]


def llada2_fold(ctx: Ctx) -> list[str]:
    d = ctx.load(LLADA2)
    rows = []
    for delta, r in d["fold"].items():
        rows.append([delta, *[f2(v) for v in r["ffn_fold_ratio_per_layer"]], f2(r["match"]), str(r["nfe"]), ctx.link(LLADA2)])
    n = len(next(iter(d["fold"].values()))["ffn_fold_ratio_per_layer"])
    cols = ["δ"] + [f"layer {i}" + (" (dense)" if i == 0 else " (MoE)") for i in range(n)] + ["match", "NFE", "result"]
    return ["The same run: per layer, the share of verified draft positions whose FFN (routed and shared experts) "
            "was inherited from their source instead of computed (llada2 rule, FreeDave depth 4 drafts), and the "
            "share of outputs equal to vanilla's (δ > 0 is approximate).", "", *provenance(ctx, LLADA2), "",
            *table(cols, rows)]


def moe_layer(ctx: Ctx) -> list[str]:
    d = ctx.load("moe_layer.json")
    sh = d["settings"]["shape"]
    ref = {r["rows"]: r["cpu_s"] for r in d["rows"] if r["method"] == "routed-grouped"}
    rows = [[str(r["rows"]), r["method"], x(r["cpu_s"] / ref[r["rows"]], 1) if r["rows"] in ref else "—",
             f"{r['peak_mib']:.0f}", str(r["experts_touched"]), f"{r['max_abs_diff']:.1e}", ctx.link("moe_layer.json")]
            for r in d["rows"]]
    return [f"One MoE layer at LLaDA2-mini shape (hidden {sh['hidden']}, {sh['experts']} experts of width "
            f"{sh['expert_width']}, top-{sh['top_k']} in {sh['groups_kept']} of {sh['groups']} groups, one shared "
            "expert), **random weights** (a cost proxy: trained routing touches experts less uniformly), float32: the "
            "routed experts (one GEMM per expert, or torch's grouped GEMM, the default) against evaluating every expert "
            "on every row. CPU seconds of the call against the grouped GEMM's at the same row count (one call after a "
            "warm-up); peak memory above the resident weights.", "", *provenance(ctx, "moe_layer.json"), "",
            *table(["rows", "method", "CPU time ÷ routed-grouped", "peak MiB", "experts touched", "max abs diff",
                    "result"], rows)]


def paged_kv(ctx: Ctx) -> list[str]:
    d = ctx.load("paged_kv.json")
    runs = d["runs"]
    conc, pre = runs["concurrency"], runs["prefix"]
    main = next(iter(conc.values()))
    off = pre.get("paged, prefix caching off")
    rows = []
    for section, group, ref in (("concurrency", conc, main), ("prefix caching", pre, off)):
        for label, r in group.items():
            rows.append([section, label, f2(r["requests_per_s"], 3), x(r["requests_per_s"] / ref["requests_per_s"]),
                         f2(r["median_ttft_s"]), x(ref["median_ttft_s"] / r["median_ttft_s"]), str(r["preemptions"]),
                         f"{r['peak_kv_bytes'] / 2**20:.1f}", f"{r['reservation_bytes'] / 2**20:.1f}",
                         "yes" if r["tokens"] == ref["tokens"] else "no", ctx.link("paged_kv.json")])
    return ["The paged KV cache (issue 41) on the tiny model widened to 0.5B width (a cost proxy, float32, one "
            f"thread), vanilla under its native rule, all {d['requests']} requests added at t = 0. Concurrency: "
            "prompts of 16-256 random tokens, 16-48 new; `main` is the engine before paging (a checkout of its "
            "commit, run in its own process), which reserves prompt + max_new_tokens + a block per request "
            "(`reserved MiB`); the paged rows have that memory or a quarter of it (kv_cache_memory). Prefix "
            f"caching: a shared {d['system']}-token system prompt + 8-40 own tokens, 16 new. Requests/s and the "
            "median time to first token on the process CPU clock (from t = 0); ratios against the first row of "
            "each section (TTFT: first row / this row); peak KV = blocks held at most at once.", "",
            *provenance(ctx, "paged_kv.json"), "",
            *table(["section", "engine", "requests/s", "ratio", "median TTFT s", "TTFT ratio", "preemptions",
                    "peak KV MiB", "reserved MiB", "same tokens", "result"], rows)]


@dataclass(frozen=True)
class Area:
    """One section of BENCHMARKS.md: its title, the result files it reads (left out when the first is
    absent), the body (a few lines and one table), an optional README headline, where its history is."""
    title: str
    files: tuple[str, ...]
    render: Callable[[Ctx], list[str]]
    headline: Callable[[Ctx], str] | None = None
    history: tuple[str, ...] = ()


AREAS: list[Area] = [
    Area("Draft budgets", (DB_FILE,), draft_budgets, draft_budgets_headline,
         ("Draft budgets (issue 23): auto against vanilla and the best fixed budget",)),
    Area("Cold start: a model's first request", (COLD,), cold_start, cold_start_headline,
         ("Draft budgets (issue 23): auto against vanilla and the best fixed budget",)),
    Area("Tensor parallelism", ("tensor_parallel.json",), tensor_parallel, tensor_parallel_headline,
         ("Tensor parallelism (issue 40): `-tp 2` against one rank on the 2-core CPU",)),
    Area("The engine under load", ("engine_load.json",), engine_load, engine_load_headline,
         ("The engine under load (issue 10): concurrency, sequential vs batched, fixed vs adaptive drafts",
          "Fresh problems (issue 23): Table 1 and the engine table again, on problems no split has seen")),
    Area("Host overhead of the engine", ("engine_overhead.json",), engine_overhead, engine_overhead_headline,
         ("The batch-first decode program (issue 19): host overhead and throughput, side by side with d696ee3",)),
    Area("The paged KV cache: a memory budget and prefix caching", ("paged_kv.json",), paged_kv, None),
    Area("Static shapes on the CPU", ("static_shapes.json",), static_shapes, None,
         ("Static shapes on the CPU (issue 19): the price of padding, with no graph to pay for it",)),
    Area("Folded verification on the tiny model", ("specfold_verify.json",), fold_verify, fold_verify_headline,
         ("Issue 14, continued: one host sync per layer, cheaper folded attention, fused weights once per model",
          "SpecFold: folded verification whose cost tracks what it computes (issue 14)")),
    Area("One folded layer at 0.5B width", ("fold_layer.json",), fold_layer, fold_layer_headline,
         ("Issue 14, continued: one host sync per layer, cheaper folded attention, fused weights once per model",
          "SpecFold: one folded layer against the dense layer (PyTorch twin, CPU)")),
    Area("The tiny model's held-out quality", ("tiny_quality.json",), tiny_quality, tiny_quality_headline,
         ("The embedded model with realistic entropy (issue 11, part 2): the bar is met, shipped as `tiny`",)),
    Area("OpenAI server under loopback load", ("serve_load.json",), serve_load, None,
         ("OpenAI server under loopback load (issue 10)",)),
    Area("LLaDA2: lossless speculation", (LLADA2,), llada2, None,
         ("LLaDA2: lossless speculation under both rules, and SpecFold's fold ratio on MoE layers (issue 20)",)),
    Area("LLaDA2: SpecFold's fold ratio on MoE layers", (LLADA2,), llada2_fold, None,
         ("LLaDA2: lossless speculation under both rules, and SpecFold's fold ratio on MoE layers (issue 20)",)),
    Area("LLaDA2: one MoE layer, routed against dense", ("moe_layer.json",), moe_layer, None,
         ("LLaDA2 MoE layer: routed grouped GEMMs against a dense all-experts evaluation (issue 20)",)),
    Area("Code sandbox: cost per program", ("sandbox_cost.json",), sandbox_cost, None,
         ("Code sandbox: cost per program (issue 12)",)),
]

NOT_CURRENT = [  # (log section, why it has no current result file): its latest figures stay in the log
    ("Model core: vanilla decoding on a random-weight Qwen2.5-0.5B-shaped checkpoint",
     "not re-run: 24 layers and a 151,936-word head decode at about 0.5 tokens/s here, most of an hour for the table"),
    ("Table 1: the new `tiny` at native, 0.5B and 1.5B widths (issues 11 and 14)", "not re-run: hours of CPU"),
    ("Fresh problems (issue 23): Table 1 and the engine table again, on problems no split has seen",
     "not re-run: hours of CPU (Table 1 and the engine table, SpecFold's token match, accuracy on 500 problems)"),
    ("Speculation under the native rule (issue 14): drafts that reach the next sub-block",
     "not re-run: forwards only, superseded by the forwards of the fresh-problem tables"),
    ("Nemotron-Labs-Diffusion causal modes (issue 13): random weights, equivalence and cost only",
     "benchmarks/nld_causal.py no longer runs (it imports specfold.decoding.causal.driver, which is gone)"),
    ("Ray Serve replicas (issue 21)", "not re-run: two replicas need both cores"),
    ("`specfold --help` start-up (issue 9)", "no script writes it (a shell loop against a tree of 45c5eb5)"),
]
DB_PENDING = ("Draft budgets (issue 23): auto against vanilla and the best fixed budget",
              f"being re-measured; the section appears when benchmarks/results/{DB_FILE} is committed")


# ---------------------------------------------------------------- the page and the README block

def present(ctx: Ctx) -> list[Area]:
    return [a for a in AREAS if ctx.has(a.files[0])]


def history(ctx: Ctx, area: Area) -> str:
    log = ctx.page.parent / LOG
    links = [f"[{t}]({ctx.href(log)}#{slug(t)})" for t in area.history]
    return "Earlier measurements: " + "; ".join(links) + "." if links else ""


def render_page(results: Path, page: Path) -> str:
    """BENCHMARKS.md (`page` sits at the repository root: the log's links are relative to it)."""
    ctx = Ctx(results, page)
    areas = present(ctx)
    out = ["# Benchmarks", "",
           f"*Generated by `python benchmarks/report.py` from the result files in [{ctx.href(results)}/]"
           f"({ctx.href(results)}/): do not edit it by hand. To change a figure, rerun its benchmark (each section "
           "names the command) and regenerate; CI runs `python benchmarks/report.py --check`, which fails when this "
           "page or the README's headline block is out of date. The chronological notes, with every earlier "
           "measurement and what was learnt from it, are in [docs/bench-log/](docs/bench-log/).*",
           "",
           "Machine: the project's 2-core x86_64 CPU, no GPU (none has been measured), one torch thread unless a "
           "section says otherwise. Each figure is a ratio of two configurations measured side by side in one run, "
           "or a count (forwards, accuracy) that does not depend on the machine. A proxy (random weights, or a "
           "widened copy of the tiny model that computes its function at a larger width) is named as one.", "",
           "Not on this page (no current result file; the latest figures are in the log):", ""]
    missing = NOT_CURRENT + ([] if ctx.has(DB_FILE) else [DB_PENDING])
    out += [f"- [{t}]({ctx.href(ctx.page.parent / LOG)}#{slug(t)}): {why}." for t, why in missing] + [""]
    out += ["Current figures:", ""]
    out += [f"- [{a.title}](#{slug(a.title)}): {', '.join(dict.fromkeys(a.files))}" for a in areas] + [""]
    for a in areas:
        body, h = a.render(ctx), history(ctx, a)
        out += [f"## {a.title}", "", body[0], *([h] if h else []), *body[1:], ""]  # the history ends the intro
    text = "\n".join(out).rstrip("\n") + "\n"
    if text.count("\n") > LIMIT:
        raise SystemExit(f"report.py: the page would be {text.count(chr(10))} lines, over {LIMIT}: shorten an area's table")
    return text


def render_block(results: Path, page: Path, readme: Path) -> str:
    """The README's headline block (markers included)."""
    ctx = Ctx(results, readme)
    pctx = Ctx(results, page)
    lines = [START, f"Headlines, generated from `benchmarks/results/` by `benchmarks/report.py` (every figure with its "
                    f"command, commit and machine in [{page.name}]({ctx.href(page)})):", ""]
    for a in present(ctx):
        if a.headline is None:
            continue
        h = headers(pctx.load(a.files[0]))[0]
        lines.append(f"- {a.headline(pctx)} ([{a.title}]({ctx.href(page)}#{slug(a.title)}), "
                     f"`{a.files[0]}`, commit {(h['commit'] or '?')[:7]}).")
    return "\n".join(lines + [END])


def splice(text: str, block: str) -> str:
    i, j = text.find(START), text.find(END)
    if i < 0 or j < i:
        raise SystemExit(f"report.py: README has no {START} ... {END} block to fill")
    return text[:i] + block + text[j + len(END):]


def outputs(results: Path, page: Path, readme: Path) -> dict[Path, str]:
    """What the two files should hold."""
    return {page: render_page(results, page),
            readme: splice(readme.read_text(), render_block(results, page, readme))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if regenerating would change BENCHMARKS.md or README.md")
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--page", type=Path, default=ROOT / "BENCHMARKS.md")
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md")
    a = ap.parse_args(argv)
    want = outputs(a.results, a.page, a.readme)
    if a.check:
        stale = [p.name for p, text in want.items() if not p.is_file() or p.read_text() != text]
        if stale:
            print(f"report.py --check: {' and '.join(stale)} out of date with benchmarks/results/: run "
                  "`python benchmarks/report.py` and commit the result", file=sys.stderr)
            return 1
        return 0
    for p, text in want.items():
        if not p.is_file() or p.read_text() != text:
            p.write_text(text)
            print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
