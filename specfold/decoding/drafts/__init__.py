"""Draft policies: guess future block states from the parent step's scores.

- graph.py: draft graphs (Spiffy) and their realization; FreeDave's chain is a graph too;
- freedave.py: FreeDave / FreeDave++ chain drafts (and eager windows);
- calibrate.py: Spiffy graph calibration by replaying vanilla decoding.
"""
from __future__ import annotations

from specfold.outputs import DecodeStats


def summarize(stats: DecodeStats) -> None:
    """Per-request speculative statistics from the loop's counters (stats.extra)."""
    ex = stats.extra
    vf = stats.verify_forwards
    ex.setdefault("reused_states", 0)
    ex["accepted_per_verify"] = ex["reused_states"] / vf if vf else 0.0
    hits, seen = ex.get("node_hits", {}), ex.get("node_drafts", {})
    ex["node_hit_rate"] = {n: hits.get(n, 0) / c for n, c in sorted(seen.items())}
    model, draft = ex.get("model_seconds", 0.0), ex.get("draft_seconds", 0.0)
    ex["other_seconds"] = max(0.0, stats.seconds - model - draft)
