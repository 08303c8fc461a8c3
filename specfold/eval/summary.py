"""Bench records -> table rows -> markdown table.

One row per (task, method, setting). Speed figures are pooled over the samples (tokens/s = total
tokens / total seconds; tokens per forward = total tokens / total NFE); NFE is per sample. Each
figure is also given as a ratio to the row of vanilla on the same task at the record's
`ref_setting` (value / vanilla value: above 1 means more, so NFE below 1 is better); rows run at a
batch size above 1 pool each batch's wall time (`throughput_seconds`), so their tokens/s is the
engine's throughput. `drafts/verif.` = drafts verified per verification (the chosen budgets).
`match` is the
mean, over samples, of the fraction of token positions equal to vanilla's (over the longer of the
two outputs); `exact` the fraction of samples with identical tokens.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Sequence

from specfold.eval.tasks import get_task

REFERENCE = "vanilla"
RATIO_FIELDS = ("accuracy", "nfe_per_sample", "tokens_per_forward", "tokens_per_second")


def token_match(ids: Sequence[int], ref: Sequence[int]) -> tuple[float, bool]:
    """(fraction of positions where `ids` equals `ref`, over the longer length; identical?)."""
    n = max(len(ids), len(ref))
    if n == 0:
        return 1.0, True
    same = sum(a == b for a, b in zip(ids, ref))
    return same / n, list(ids) == list(ref)


def _mean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def summarize(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Table rows, in first-seen order of (task, method, setting)."""
    groups: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for r in records:
        groups[(r["task"], r["method"], r["setting"])].append(r)
    rows = []
    for (task, method, setting), recs in groups.items():
        tokens = sum(r["tokens"] for r in recs)
        nfe = sum(r["nfe"] for r in recs)
        secs = sum(r.get("throughput_seconds", r["seconds"]) for r in recs)  # a batch's wall time, shared
        metrics = get_task(task).aggregate([r["score"] for r in recs])
        rows.append({
            "task": task, "method": method, "setting": setting, "sweep": recs[0].get("sweep", {}),
            "ref_setting": recs[0].get("ref_setting", "default"), "n": len(recs),
            "accuracy": sum(bool(r["correct"]) for r in recs) / len(recs), "metrics": metrics,
            "nfe_per_sample": nfe / len(recs), "tokens_per_forward": tokens / nfe if nfe else 0.0,
            "tokens_per_second": tokens / secs if secs > 0 else 0.0, "seconds": secs,
            "fold_ratio": _mean([r.get("fold_ratio") for r in recs]),
            "fold_ratio_excl_layer0": _mean([r.get("fold_ratio_excl_layer0") for r in recs]),
            "match": _mean([r.get("match") for r in recs]),
            "exact": _mean([None if r.get("exact") is None else float(r["exact"]) for r in recs]),
            "outside_forward": _outside(recs, sum(r["seconds"] for r in recs)),
            "batch": recs[0].get("batch", 1), **_budgets(recs),
            "approximate": _approximate(method, recs[0].get("params") or {}),
        })
    by_key = {(r["task"], r["method"], r["setting"]): r for r in rows}
    for row in rows:
        ref = by_key.get((row["task"], REFERENCE, row["ref_setting"]))
        for f in RATIO_FIELDS:
            row[f + "_x"] = row[f] / ref[f] if ref is not None and ref[f] else None
    return rows


def _budgets(recs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Drafts verified per verification: the mean and distribution of the chosen budgets."""
    dist: dict[int, int] = defaultdict(int)
    for r in recs:
        for k, n in (r.get("extra", {}).get("draft_budgets") or {}).items():
            dist[int(k)] += n
    n = sum(dist.values())
    return {"budgets": dict(sorted(dist.items())), "mean_budget": sum(k * v for k, v in dist.items()) / n if n else None}


FOLDING = ("specfold", "linear_specfold")  # methods whose verification folds rows at delta > 0


def _approximate(method: str, params: dict) -> bool:
    return method in FOLDING and float(params.get("delta", 0) or 0) > 0


def _outside(recs: Sequence[dict[str, Any]], secs: float) -> float | None:
    """Share of the decode time spent outside the runner's model call (drafting, store, rules, loop;
    the call itself includes building the step's device inputs and reading its scores back):
    1 - model seconds / seconds, over the group; None for records without the engine's timing."""
    model = [r.get("extra", {}).get("model_seconds") for r in recs]
    if secs <= 0 or any(m is None for m in model):
        return None
    return max(0.0, 1.0 - sum(model) / secs)


def _fmt(v: Any, spec: str = ".3f") -> str:
    return "—" if v is None else format(v, spec)


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:.1f}%"


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown table; extra task metrics (IFEval's four accuracies ...) listed under it."""
    head = ["task", "method", "setting", "n", "accuracy", "(×v)", "NFE/sample", "(×v)", "tok/fwd", "(×v)",
            "tok/s", "(×v)", "match", "exact", "fold ratio", "excl. layer 0", "drafts/verif.", "outside fwd"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * len(head)) + "|"]
    extra = []
    for r in rows:
        cells = [r["task"], r["method"], r["setting"], str(r["n"]), _fmt(r["accuracy"]),
                 _fmt(r["accuracy_x"], ".2f"), _fmt(r["nfe_per_sample"], ".1f"), _fmt(r["nfe_per_sample_x"], ".2f"),
                 _fmt(r["tokens_per_forward"], ".2f"), _fmt(r["tokens_per_forward_x"], ".2f"),
                 _fmt(r["tokens_per_second"], ".1f"), _fmt(r["tokens_per_second_x"], ".2f"),
                 _fmt(r["match"]), _fmt(r["exact"]), _fmt(r["fold_ratio"], ".2f"),
                 _fmt(r["fold_ratio_excl_layer0"], ".2f"), _fmt(r.get("mean_budget"), ".2f"),
                 _pct(r.get("outside_forward"))]
        lines.append("| " + " | ".join(cells) + " |")
        more = {k: v for k, v in r["metrics"].items() if k != "accuracy"}
        if more:
            extra.append(f"- {r['task']} {r['method']} {r['setting']}: "
                         + ", ".join(f"{k} {v:.3f}" for k, v in more.items()))
    approx = [f"{r['method']} {r['setting']}" for r in rows if r.get("approximate")]
    if approx:
        extra.append(f"- approximate (folded verification at delta > 0, tokens may differ from vanilla's: "
                     f"see match and exact): {', '.join(approx)}; every other method is lossless")
    return "\n".join(lines + ([""] + extra if extra else []))
