"""Folded verification against dense verification, per verification and end to end (one thread, CPU).

Three parts (`--parts`):

- `tiny`: verification batches exactly as the decode loop produces them on the embedded tiny model
  (root + Spiffy drafts, block 16, recorded with `verify_batches.record`, static one-token rule where
  drafts are accepted, or `--rule`), replayed through DenseVerifier and FoldVerifier: each batch is
  timed for every verifier in turn, `--reps` times, and the per-batch minimum summed. Times are CPU
  seconds of the one compute thread (`time.thread_time`): the core is shared, and wall time would
  count other jobs' time slices; interleaving and minima keep the rest of their load out.
- `e2e`: SpecFold end to end on the tiny model under `--e2e-rule` (default: the model's sub-block
  rule), vanilla / dense Spiffy / SpecFold side by side, prompt by prompt in turn.
- `0.5b`: one whole verification of a random-weight Qwen2.5-0.5B-shaped checkpoint (a proxy:
  random weights say nothing about accuracy), root + 7 chain drafts of a 32-block with 16 masks.

`--baseline REV` adds the FoldVerifier of git revision REV to every part, in the same run: the
script extracts that revision's `specfold/` into a temporary folder as package `specfold_base`
(imports rewritten) and builds the old verifier on the same model object.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/specfold_verify.py --baseline 45c5eb5 [--out F.json]

`--out` writes every part's rows as JSON, with the run's header (benchmarks/provenance.py).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import baseline  # noqa: E402
from model_core import QWEN25_05B, random_checkpoint  # noqa: E402
from verify_batches import record  # noqa: E402

from specfold import LLM, DecodeParams  # noqa: E402
from specfold.decoding.verify.dense import DenseVerifier  # noqa: E402
from specfold.decoding.verify.fold import FoldStats, FoldVerifier  # noqa: E402


def baseline_verifier(rev: str):
    """FoldVerifier class of git revision `rev` (imported as package `specfold_base`)."""
    baseline.load(rev)
    from specfold_base.decoding.verify.fold import FoldVerifier as Old  # type: ignore
    return Old


CLOCK = time.thread_time  # CPU seconds of this thread: time-slicing by other jobs on the core is not counted


def replay(batches, verifiers: dict, reps: int) -> tuple[dict, dict]:
    """Sum over batches of the per-batch minimum CPU seconds, verifiers interleaved per batch; and
    the fold ratios of every folded verifier over the batches (its per-call statistics summed)."""
    tot = {k: 0.0 for k in verifiers}
    folds: dict = {}
    with torch.inference_mode():
        for b in batches:
            best = {k: float("inf") for k in verifiers}
            for _ in range(reps):
                for k, v in verifiers.items():
                    t0 = CLOCK()
                    v(*b.args())
                    best[k] = min(best[k], CLOCK() - t0)
            for k, v in verifiers.items():
                tot[k] += best[k]
                if hasattr(v, "report"):  # a baseline revision's verifier keeps running totals itself
                    folds[k] = v
                elif getattr(v, "last_stats", None):
                    folds[k] = folds.get(k) or FoldStats.zeros(len(v.last_stats[0].folded))
                    folds[k].add(v.last_stats[0])
    return tot, {k: f.report(verifiers[k].delta) if isinstance(f, FoldStats) else f.report() for k, f in folds.items()}


def max_diff(batches, a, b) -> float:
    with torch.inference_mode():
        return max(((a(*x.args()) - b(*x.args())).abs().max().item() for x in batches), default=0.0)


def part_tiny(a, Old) -> None:
    llm = LLM("tiny", dtype="float32")
    from specfold.api import tiny_path
    rows = [json.loads(x) for x in (Path(tiny_path()) / "heldout.jsonl").read_text().splitlines()[: a.prompts]]
    qs = [r["question"] for r in rows]
    kw = dict(rule=a.rule) if a.rule != "static" else dict(rule="static", tokens_per_step=1)
    p = DecodeParams(method="specfold", delta=0.0, chat_template=True, max_new_tokens=96, **kw)
    batches = record(llm, qs, p)
    with_drafts = [b for b in batches if b.tokens.shape[0] > 1]
    mean_b = statistics.mean(b.tokens.shape[0] for b in batches)
    print(f"\n## tiny: {len(batches)} loop verification batches ({len(with_drafts)} with drafts, mean B+1 "
          f"{mean_b:.2f}), rule {a.rule}, block 16, {a.prompts} prompts, min of {a.reps} per batch\n")
    m = llm.model
    print("| δ | batches | dense ms | new fold ms | new/dense | old fold ms | old/dense | new fold ratio "
          "(excl. layer 0) / FFN | old fold ratio (excl. layer 0) / FFN | max abs logit diff new vs dense |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    out = {"batches": len(batches), "with_drafts": len(with_drafts), "mean_branches": mean_b, "rule": a.rule,
           "prompts": a.prompts, "reps": a.reps, "rows": []}
    for delta in (float(x) for x in a.deltas.split(",")):
        for label, bs in (("all", batches), ("with drafts", with_drafts)):
            vs = {"dense": DenseVerifier(m), "new": FoldVerifier(m, delta)}
            if Old is not None:
                vs["old"] = Old(m, delta)
            t, reports = replay(bs, vs, a.reps)
            old = (f"{t['old'] * 1e3 / len(bs):.2f} | {t['old'] / t['dense']:.2f}x" if "old" in t else "- | -")
            ratios = " | ".join(_ratios(reports[k]) if k in reports else "-" for k in ("new", "old"))
            diff = max_diff(bs[:20], vs["new"], vs["dense"])
            print(f"| {delta} | {label} ({len(bs)}) | {t['dense'] * 1e3 / len(bs):.2f} | {t['new'] * 1e3 / len(bs):.2f} "
                  f"| {t['new'] / t['dense']:.2f}x | {old} | {ratios} | {diff:.1e} |", flush=True)
            out["rows"].append({"delta": delta, "batches": label, "n": len(bs), "dense_ms": t["dense"] * 1e3 / len(bs),
                                "fold_ms": t["new"] * 1e3 / len(bs),
                                "old_ms": t["old"] * 1e3 / len(bs) if "old" in t else None,
                                "fold": reports.get("new"), "old_fold": reports.get("old"), "max_abs_logit_diff": diff})
    return out


def _ratios(rep: dict) -> str:
    """QKV fold ratio (excl. layer 0) / FFN fold ratio."""
    def f(x):
        return "-" if x is None else f"{x:.2f}"
    return f"{f(rep['fold_ratio'])} ({f(rep['fold_ratio_excl_layer0'])}) / {f(rep['ffn_fold_ratio'])}"


def part_e2e(a, Old) -> None:
    llm = LLM("tiny", dtype="float32")
    from specfold.api import tiny_path
    rows = [json.loads(x) for x in (Path(tiny_path()) / "heldout.jsonl").read_text().splitlines()[: a.e2e_prompts]]
    qs = [r["question"] for r in rows]
    base = dict(rule=a.e2e_rule, chat_template=True, max_new_tokens=96)
    m = llm.model
    decs = {"vanilla": llm.decoder(DecodeParams(method="vanilla", **base)),
            "spiffy (dense)": llm.decoder(DecodeParams(method="spiffy", **base))}
    sf = DecodeParams(method="specfold", delta=a.e2e_delta, **base)
    decs["specfold new"] = llm.decoder(sf)
    if Old is not None:
        decs["specfold old"] = llm.decoder(sf)
        decs["specfold old"].verifier = Old(m, a.e2e_delta)
    secs = {k: 0.0 for k in decs}
    toks = {k: 0 for k in decs}
    nfe = {k: 0 for k in decs}
    out = {k: [] for k in decs}
    root_only = ver = 0
    for _ in range(a.e2e_reps):
        for q in qs:
            ids = llm.encode(q, sf)
            for k, d in decs.items():
                getattr(d.verifier, "reset", lambda: None)()
                t0 = CLOCK()
                gen, _fin, st = d.run(ids)
                secs[k] += CLOCK() - t0
                toks[k] += st.tokens
                nfe[k] += st.nfe
                out[k].append(gen)
                if k == "specfold new":  # the request's own fold counters (the engine sums them)
                    root_only += st.extra["fold_root_only"]
                    ver += st.extra["fold_verifications"]
    print(f"\n## tiny end to end: rule {a.e2e_rule}, δ={a.e2e_delta}, {len(qs)} held-out prompts x {a.e2e_reps}, "
          f"max_new_tokens 96, methods interleaved prompt by prompt, CPU seconds of the thread\n")
    print(f"SpecFold verifications with no drafts (dense forward): {root_only} of {ver}\n")
    print("| method | NFE | tokens/s | × vanilla | tokens match vanilla |")
    print("|---|---|---|---|---|")
    v = toks["vanilla"] / secs["vanilla"]
    rows = []
    for k in decs:
        match = sum(x == y for x, y in zip(out[k], out["vanilla"])) / len(out[k])
        print(f"| {k} | {nfe[k]} | {toks[k] / secs[k]:.1f} | {toks[k] / secs[k] / v:.2f} | {match:.3f} |", flush=True)
        rows.append({"method": k, "nfe": nfe[k], "tokens_per_s": toks[k] / secs[k], "x_vanilla": toks[k] / secs[k] / v,
                     "match": match})
    return {"rule": a.e2e_rule, "delta": a.e2e_delta, "prompts": len(qs), "reps": a.e2e_reps,
            "root_only": root_only, "verifications": ver, "rows": rows}


def part_05b(a, Old) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        llm = LLM(random_checkpoint(Path(tmp) / "m", QWEN25_05B), dtype="float32")
    m, M = llm.model, llm.spec.mask_token_id
    g = torch.Generator().manual_seed(0)
    P, N = 100, 32
    cache = m.new_cache(P + N)
    with torch.inference_mode():
        m(torch.randint(0, 50000, (1, P), generator=g), torch.arange(P), cache=cache, write_cache=True,
          logits_at=torch.tensor([P - 1]))
    root = torch.randint(0, 50000, (N,), generator=g)
    root[16:] = M
    branches, parents = [root], [-1]
    for j in range(7):
        d = branches[-1].clone()
        d[16 + j] = int(torch.randint(0, 50000, (1,), generator=g))
        branches.append(d)
        parents.append(j)
    toks = torch.stack(branches)
    pos, mask, outi = torch.arange(P, P + N), torch.ones(N, N, dtype=torch.bool), torch.arange(16, 32)
    print("\n## one verification, random Qwen2.5-0.5B shape (proxy), root + 7 chain drafts, N=32, P=100\n")
    print("| verifier | ms | vs dense | fold ratio (excl. layer 0) | ffn fold ratio | max abs logit diff |")
    print("|---|---|---|---|---|---|")

    def timed(fn):
        ts = []
        with torch.inference_mode():
            r = fn()
            for _ in range(a.reps):
                t0 = CLOCK()
                fn()
                ts.append(CLOCK() - t0)
        return min(ts), r

    dense = DenseVerifier(m)
    t_dense, ref = timed(lambda: dense(toks, parents, pos, cache, mask, outi))
    print(f"| dense (B+1 = 8) | {t_dense * 1e3:.0f} | 1.00x | - | - | 0 |")
    rows = [{"verifier": "dense", "delta": None, "ms": t_dense * 1e3}]
    for delta in (float(x) for x in a.deltas.split(",")):
        for label, cls in (("new", FoldVerifier), ("old", Old)):
            if cls is None:
                continue
            fv = cls(m, delta)
            t, r = timed(lambda: fv(toks, parents, pos, cache, mask, outi))
            fv.reset()
            with torch.inference_mode():
                fv(toks, parents, pos, cache, mask, outi)
            rep = fv.report()
            fx = rep.get("fold_ratio_excl_layer0")
            fx = "" if fx is None else f" ({fx:.2f})"
            print(f"| {label} folded δ={delta} | {t * 1e3:.0f} | {t_dense / t:.2f}x | {rep['fold_ratio']:.2f}{fx} | "
                  f"{rep['ffn_fold_ratio']:.2f} | {(r - ref).abs().max().item():.1e} |", flush=True)
            rows.append({"verifier": label, "delta": delta, "ms": t * 1e3, "fold": rep,
                         "max_abs_logit_diff": (r - ref).abs().max().item()})
    return {"rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="tiny,e2e,0.5b")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--deltas", default="0,0.1")
    ap.add_argument("--rule", default="static", help="rule of the recorded tiny batches")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--e2e-rule", default="sub_block")
    ap.add_argument("--e2e-delta", type=float, default=0.1)
    ap.add_argument("--e2e-prompts", type=int, default=20)
    ap.add_argument("--e2e-reps", type=int, default=1)
    ap.add_argument("--baseline", default=None, help="git revision whose FoldVerifier runs alongside")
    ap.add_argument("--out", default=None, help="write every part's rows here as JSON (with the run's header)")
    ap.add_argument("--note", default="", help="what the run shared the machine with (the result's machine note)")
    a = ap.parse_args()
    from provenance import header, write_result  # benchmarks/ (this script's folder)
    head = header(a.note)
    torch.set_num_threads(a.threads)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "specfold", "benchmarks"], capture_output=True,
                                text=True).stdout.strip())
    Old = baseline_verifier(a.baseline) if a.baseline else None
    print(f"# specfold_verify: commit {commit}{' (+ uncommitted changes)' if dirty else ''}, baseline "
          f"{a.baseline or '-'}, float32, {a.threads} thread(s), torch {torch.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    parts = {"tiny": part_tiny, "e2e": part_e2e, "0.5b": part_05b}
    results = {name: parts[name](a, Old) for name in a.parts.split(",")}
    if a.out:
        write_result(a.out, head, {"settings": {"threads": a.threads, "baseline": a.baseline, "dtype": "float32"},
                                   "parts": results})


if __name__ == "__main__":
    main()
