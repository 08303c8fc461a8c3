"""Tables of a `benchmarks/fresh_claims.sh` run: Table 1 (batch 1) and the engine table (batch 1 against
16 concurrent requests), per rule, over the problems every configuration has finished.

    python benchmarks/fresh_report.py OUTDIR [--out FILE.md]

Per configuration: accuracy, NFE per problem, tokens per forward and tokens/s (each also as a ratio to
vanilla at the same batch size), the problems whose tokens differ from vanilla's (k of N) and among
them the answers vanilla got right and this configuration got wrong, the fold ratio and the drafts
verified per verification. The engine table adds each configuration's batch-16 tokens/s over its own
batch-1 one on the same problems (the gain from batching), in tokens per process-CPU-second: on a
shared machine wall-clock tokens/s swings with the other jobs' load.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specfold.eval.records import load_records  # noqa: E402
from specfold.eval.summary import summarize  # noqa: E402


def common(records: list[dict]) -> list[dict]:
    """The records of the problems that every (method, setting) of their batch size has finished (the
    batch-16 runs may be a chunk behind), vanilla at batch 1 kept for every problem either needs."""
    ids: dict[int, dict[tuple, set]] = defaultdict(lambda: defaultdict(set))
    for r in records:
        ids[r.get("batch", 1)][(r["method"], r["setting"])].add(r["id"])
    keep = {b: set.intersection(*d.values()) for b, d in ids.items()}
    need = set.union(*keep.values()) if keep else set()
    return [r for r in records if r["id"] in keep[r.get("batch", 1)]
            or (r["method"] == "vanilla" and r.get("batch", 1) == 1 and r["id"] in need)]


def label(method: str, setting: str) -> str:
    s = setting.replace(",batch=16", "").replace("batch=16", "")
    return f"{method} {s}".strip() if s not in ("", "default") else method


def cpu_rates(records: list[dict]) -> dict[tuple, float]:
    """(method, setting) -> tokens per process-CPU-second (None-free records only)."""
    tok: dict[tuple, float] = defaultdict(float)
    cpu: dict[tuple, float] = defaultdict(float)
    for r in records:
        if r.get("cpu_seconds"):
            tok[(r["method"], r["setting"])] += r["tokens"]
            cpu[(r["method"], r["setting"])] += r["cpu_seconds"]
    return {k: tok[k] / cpu[k] for k in cpu if cpu[k] > 0}


def changed(records: list[dict], row: dict) -> tuple[int, int]:
    """(problems whose tokens differ from vanilla's, answers right under vanilla and wrong here)."""
    van = {(r["id"], r["setting"]): r for r in records if r["method"] == "vanilla"}
    k = lost = 0
    for r in records:
        if (r["method"], r["setting"]) != (row["method"], row["setting"]) or r.get("exact") is None:
            continue
        ref = van[(r["id"], row["ref_setting"])]
        if not r["exact"]:
            k += 1
            lost += bool(ref["correct"]) and not r["correct"]
    return k, lost


def f(v, spec=".2f") -> str:
    return "—" if v is None else format(v, spec)


def cpu_x(cpu: dict, r: dict) -> tuple[float | None, float | None]:
    """(tokens per CPU-second, its ratio to vanilla's at the row's reference setting)."""
    mine, ref = cpu.get((r["method"], r["setting"])), cpu.get(("vanilla", r["ref_setting"]))
    return mine, (mine / ref if mine and ref else None)


def table1(rows: list[dict], records: list[dict]) -> str:
    cpu = cpu_rates(records)
    out = ["| method | n | accuracy | NFE/problem | (×v) | tok/fwd | tok/s | (×v) | tok/CPU-s | (×v) "
           "| tokens ≠ vanilla's | right → wrong | fold ratio | drafts/verif. | outside fwd |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["batch"] != 1:
            continue
        k, lost = changed(records, r) if r["method"] != "vanilla" else (0, 0)
        c, cx = cpu_x(cpu, r)
        out.append(f"| {label(r['method'], r['setting'])} | {r['n']} | {r['accuracy']:.3f} | {r['nfe_per_sample']:.1f} "
                   f"| {f(r['nfe_per_sample_x'])} | {r['tokens_per_forward']:.2f} | {r['tokens_per_second']:.1f} "
                   f"| {f(r['tokens_per_second_x'])} | {f(c, '.1f')} | {f(cx)} | {k} of {r['n']} | {lost} "
                   f"| {f(r['fold_ratio'])} | {f(r.get('mean_budget'))} "
                   f"| {f(r['outside_forward'] and 100 * r['outside_forward'], '.1f')}% |")
    return "\n".join(out)


def same_as_alone(records: list[dict], row: dict, alone: dict) -> int:
    """Problems whose tokens at batch 16 equal the same configuration's tokens one at a time."""
    ids = {r["id"]: r["token_ids"] for r in records if (r["method"], r["setting"]) == (alone["method"], alone["setting"])}
    return sum(r["token_ids"] == ids.get(r["id"]) for r in records
               if (r["method"], r["setting"]) == (row["method"], row["setting"]))


def engine(rows: list[dict], records: list[dict]) -> str:
    one = {label(r["method"], r["setting"]): r for r in rows if r["batch"] == 1}
    cpu = cpu_rates(records)
    out = ["| method | tok/CPU-s, 1 at a time | (×v) | tok/CPU-s, 16 concurrent | (×v) | 16 vs 1 "
           "| drafts/verif. at 16 | tokens = 1 at a time | tokens ≠ vanilla's at 16 |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["batch"] != 16:
            continue
        name = label(r["method"], r["setting"])
        a = one.get(name) or one.get(name.replace("draft_budget=7", "draft_budget=7,eager=False"))
        if a is None and r["method"] == "specfold":  # batch-1 SpecFold at δ = 0.05 and budget 7
            a = one.get(f"specfold {r['setting'].split(',batch')[0]},delta=0.05")
        c16, x16 = cpu_x(cpu, r)
        ids = {x["id"] for x in records if (x["method"], x["setting"]) == (r["method"], r["setting"])}
        c1, x1 = cpu_x(cpu_rates([x for x in records if x["id"] in ids]), a) if a else (None, None)
        out.append(f"| {name} | {f(c1, '.1f')} | {f(x1)} | {f(c16, '.1f')} | {f(x16)} "
                   f"| {f(c16 / c1 if c16 and c1 else None)} | {f(r.get('mean_budget'))} "
                   f"| {same_as_alone(records, r, a) if a else '—'} of {r['n']} "
                   f"| {f(r['n'] * (1 - r['exact']), '.0f') if r['exact'] is not None else '—'} of {r['n']} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--out", default=None, help="also write the tables to this markdown file")
    a = ap.parse_args(argv)
    parts = []
    for rule in ("native", "static"):
        path = Path(a.outdir) / f"{rule}.jsonl"
        if not path.is_file():
            continue
        records = common(list(load_records(path).values()))
        rows = summarize(records)
        parts += [f"### {rule} rule: Table 1 (one request at a time)\n", table1(rows, records), "",
                  f"### {rule} rule: the engine, 16 concurrent requests\n", engine(rows, records), ""]
    text = "\n".join(parts)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
