"""PNG plots of bench table rows (matplotlib, Agg backend: no display needed).

- `accuracy_vs_speed.png`: one panel per task, one point per (method, setting): accuracy against
  tokens/s.
- `speed_vs_vanilla.png`: one bar pair per (task, method, setting) other than vanilla: tokens per
  forward and tokens/s as ratios to vanilla (1 = no gain), the figures the tables call (×v).
- `speed_vs_batch.png` (rows at several batch sizes, `bench --batch-sizes`): one panel per (task,
  method), tokens/s against the batch size, one line per setting (fixed or auto draft budget; auto
  bold), vanilla as the dashed black reference line in every panel.
- `gain_vs_branches.png`, `gain_vs_graph_depth.png`, `gain_vs_draft_depth.png`: each written only
  when rows carry that sweep field: tokens/s as a ratio to vanilla against the number of branches B,
  the Spiffy graph depth D or the FreeDave chain depth d, one line per (task, method, other settings).

Readability invariants: points and lines are named in a legend outside the axes (never by text
beside the points, which overlaps when points are close); each series has its own colour (and a
marker per method), the same in every panel; accuracy axes show [0, 1] (ticks 0 to 1) with a
margin beyond both ends, and the speed axis one beyond the fastest point, so that every marker is
drawn whole inside its axes (a point at accuracy 1 is not cut by the top edge).
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
    fig.savefig(out, dpi=120, bbox_inches="tight")  # keeps the outside legend in the picture
    plt.close(fig)
    return out


MARKERS = "osD^vP*Xhp<>"


def _colours(plt, n: int) -> list:
    """`n` distinct colours: tab10 up to 10, tab20 up to 20, else evenly spaced on turbo."""
    if n <= 10:
        return [plt.get_cmap("tab10")(i) for i in range(n)]
    if n <= 20:
        return [plt.get_cmap("tab20")(i) for i in range(n)]
    return [plt.get_cmap("turbo")(i / (n - 1)) for i in range(n)]


def _styles(plt, keys: Sequence[tuple]) -> dict[tuple, dict]:
    """Colour per key, marker per key's first element (the method)."""
    methods = list(dict.fromkeys(k[0] for k in keys))
    cols = _colours(plt, len(keys))
    return {k: {"color": cols[i], "marker": MARKERS[methods.index(k[0]) % len(MARKERS)]}
            for i, k in enumerate(keys)}


ACC_MARGIN = 0.05  # accuracy units beyond [0, 1]: more than a marker's radius at the figure's size


def plot_accuracy_speed(rows: Sequence[dict[str, Any]], path: str | os.PathLike) -> Path:
    plt = _pyplot()
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    keys = list(dict.fromkeys((r["method"], r["setting"]) for r in rows))
    style = _styles(plt, keys)
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4.2), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        mine = [r for r in rows if r["task"] == task]
        for r in mine:
            vanilla = r["method"] == "vanilla"
            if vanilla:  # a reference line: methods as fast as vanilla would hide its marker
                ax.axvline(r["tokens_per_second"], color="grey", ls="--", lw=0.8, zorder=1)
            ax.scatter(r["tokens_per_second"], r["accuracy"], s=70 if vanilla else 45,
                       zorder=4 if vanilla else 3, edgecolors="black", linewidths=0.4,
                       **style[(r["method"], r["setting"])])
        ax.set_title(task)
        ax.set_xlabel("tokens/s (dashed: vanilla)")
        ax.set_ylabel("accuracy")
        ax.set_ylim(-ACC_MARGIN, 1.0 + ACC_MARGIN)  # a point at 0 or 1 shows whole, not cut by the edge
        ax.set_yticks([i / 5 for i in range(6)])
        ax.set_xlim(0.0, 1.08 * max((r["tokens_per_second"] for r in mine), default=1.0))
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], ls="", markersize=7, markeredgecolor="black", markeredgewidth=0.4,
                          label=m if st == "default" else f"{m} {st}", **style[(m, st)]) for m, st in keys]
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    return _save(plt, fig, path)


def plot_speed_ratios(rows: Sequence[dict[str, Any]], path: str | os.PathLike) -> Path | None:
    bars = [r for r in rows if r.get("tokens_per_forward_x") is not None and r["method"] != "vanilla"]
    if not bars:
        return None
    plt = _pyplot()
    keys = list(dict.fromkeys((r["method"], r["setting"]) for r in rows))
    style = _styles(plt, keys)
    multi = len({r["task"] for r in bars}) > 1
    labels = [(f"{r['task']} " if multi else "") + (r["method"] if r["setting"] == "default"
                                                    else f"{r['method']} {r['setting']}") for r in bars]
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.9 + 0.32 * len(bars)), sharey=True, squeeze=False)
    for ax, field, title in zip(axes[0], ("tokens_per_forward_x", "tokens_per_second_x"),
                                ("tokens per forward (× vanilla)", "tokens/s (× vanilla)")):
        ys = range(len(bars))
        ax.barh(list(ys), [r[field] or 0.0 for r in bars],
                color=[style[(r["method"], r["setting"])]["color"] for r in bars], edgecolor="black", lw=0.4)
        ax.axvline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_title(title, fontsize=10)
        ax.set_xlim(left=0.0)
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks(list(range(len(bars))), labels, fontsize=8)
    axes[0][0].invert_yaxis()
    return _save(plt, fig, path)


GAIN_FIELDS = {"branches": "branches B", "graph_depth": "graph depth D", "draft_depth": "chain depth d"}


def plot_gain(rows: Sequence[dict[str, Any]], field: str, path: str | os.PathLike) -> Path | None:
    """tokens/s gain over vanilla against an integer swept field (one line per method and setting)."""
    lines: dict[tuple, list[tuple[int, float]]] = defaultdict(list)
    for r in rows:
        b = r.get("sweep", {}).get(field)
        if b is None or r.get("tokens_per_second_x") is None:
            continue
        rest = ",".join(f"{k}={v}" for k, v in r["sweep"].items() if k != field)
        lines[(r["method"], r["task"], rest)].append((int(b), r["tokens_per_second_x"]))
    if not lines:
        return None
    plt = _pyplot()
    style = _styles(plt, list(lines))
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for (method, task, rest), pts in lines.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=" ".join(x for x in (task, method, rest) if x),
                **style[(method, task, rest)])
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel(GAIN_FIELDS.get(field, field))
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("tokens/s gain over vanilla")
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=8, frameon=False)
    return _save(plt, fig, path)


def plot_batch(rows: Sequence[dict[str, Any]], path: str | os.PathLike) -> Path | None:
    """tokens/s against the batch size: one panel per (task, method), a line per setting of that
    method without the batch (e.g. each draft budget; "auto" drawn bold), vanilla dashed in each."""
    if len({r.get("batch", 1) for r in rows}) < 2:
        return None
    strip = lambda st: ",".join(x for x in st.split(",") if not x.startswith("batch=")) or "default"  # noqa: E731
    panels = list(dict.fromkeys((r["task"], r["method"]) for r in rows if r["method"] != "vanilla")) \
        or list(dict.fromkeys((r["task"], r["method"]) for r in rows))
    batches = sorted({r.get("batch", 1) for r in rows})
    plt = _pyplot()
    cols = min(3, len(panels))
    nrow = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrow, cols, figsize=(4.6 * cols, 3.8 * nrow), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (task, method) in zip(axes.flat, panels):
        lines: dict[str, list] = defaultdict(list)
        ref: list = []
        for r in rows:
            if r["task"] != task:
                continue
            if r["method"] == "vanilla":
                ref.append((r.get("batch", 1), r["tokens_per_second"]))
            elif r["method"] == method:
                lines[strip(r["setting"])].append((r.get("batch", 1), r["tokens_per_second"]))
        colours = _colours(plt, len(lines))
        if ref:
            ref.sort()
            ax.plot([p[0] for p in ref], [p[1] for p in ref], color="black", ls="--", lw=1.6, zorder=5,
                    label="vanilla")
        for i, (setting, pts) in enumerate(lines.items()):
            pts.sort()
            auto = "auto" in setting
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colours[i], marker="o" if auto else ".",
                    lw=2.6 if auto else 1.0, markersize=6 if auto else 5, zorder=6 if auto else 3,
                    label=setting.replace("draft_budget=", "budget "))
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set_title(f"{method} ({task})", fontsize=10)
        ax.set_xlabel("batch size (concurrent requests)")
        ax.set_ylabel("tokens/s")
        ax.set_ylim(bottom=0.0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, frameon=False)
    return _save(plt, fig, path)


def write_plots(rows: Sequence[dict[str, Any]], folder: str | os.PathLike) -> list[Path]:
    """Write every plot that the rows support into `folder`; return the written paths."""
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    written = [plot_accuracy_speed(rows, d / "accuracy_vs_speed.png"),
               plot_speed_ratios(rows, d / "speed_vs_vanilla.png"),
               plot_batch(rows, d / "speed_vs_batch.png"),
               *(plot_gain(rows, f, d / f"gain_vs_{f}.png") for f in GAIN_FIELDS)]
    return [p for p in written if p is not None]
