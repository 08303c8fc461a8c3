"""PNG plots of bench table rows (matplotlib, Agg backend: no display needed).

- `accuracy_vs_speed.png`: one panel per task, one point per (method, setting): accuracy against
  tokens/s.
- `gain_vs_branches.png`: written only when rows carry a `branches` sweep value: tokens/s as a
  ratio to vanilla against the number of branches B, one line per (task, method, other settings).
"""
from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(plt, fig, path: str | os.PathLike) -> Path:
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def plot_accuracy_speed(rows: Sequence[dict[str, Any]], path: str | os.PathLike) -> Path:
    plt = _pyplot()
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4.5), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for r in (r for r in rows if r["task"] == task):
            ax.scatter(r["tokens_per_second"], r["accuracy"], s=30)
            label = r["method"] if r["setting"] == "default" else f"{r['method']} {r['setting']}"
            ax.annotate(label, (r["tokens_per_second"], r["accuracy"]), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
        ax.set_title(task)
        ax.set_xlabel("tokens/s")
        ax.set_ylabel("accuracy")
        ax.grid(alpha=0.3)
    return _save(plt, fig, path)


def plot_branch_gain(rows: Sequence[dict[str, Any]], path: str | os.PathLike) -> Path | None:
    lines: dict[tuple, list[tuple[int, float]]] = defaultdict(list)
    for r in rows:
        b = r.get("sweep", {}).get("branches")
        if b is None or r.get("tokens_per_second_x") is None:
            continue
        rest = ",".join(f"{k}={v}" for k, v in r["sweep"].items() if k != "branches")
        lines[(r["task"], r["method"], rest)].append((int(b), r["tokens_per_second_x"]))
    if not lines:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for (task, method, rest), pts in lines.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                label=" ".join(x for x in (task, method, rest) if x))
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("branches B")
    ax.set_ylabel("tokens/s gain over vanilla")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(plt, fig, path)


def write_plots(rows: Sequence[dict[str, Any]], folder: str | os.PathLike) -> list[Path]:
    """Write every plot that the rows support into `folder`; return the written paths."""
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    written = [plot_accuracy_speed(rows, d / "accuracy_vs_speed.png")]
    gain = plot_branch_gain(rows, d / "gain_vs_branches.png")
    if gain is not None:
        written.append(gain)
    return written
