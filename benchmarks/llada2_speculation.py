"""Lossless speculation and SpecFold on LLaDA2 (issue 20), on a random LLaDA2-shaped checkpoint.

    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python benchmarks/llada2_speculation.py [--n 8] \
        [--max-new-tokens 64] [--out benchmarks/results/llada2_speculation.json]

Random weights are a proxy: they show what the machinery does (lossless, forwards saved where the
rule's next state is predictable from the parent's scores), not what a trained LLaDA2 gains. In
particular a random model's argmax at a position moves whenever any other token of its block
changes, so under llada2_edit almost every step edits tokens, which no draft built from the parent's
scores predicts; trained models edit rarely.

Part 1, forwards: per rule setting (llada2 with the family's defaults; llada2_edit in the family's
quality setting and SGLang's fast setting), vanilla against FreeDave (depth 4, 8), Spiffy (a graph of
7 nodes calibrated per rule with `calibrate` on prompts disjoint from the evaluated ones) and SpecFold
at delta = 0 (both draft policies): total forwards (NFE: prefill + verifications + commits),
verifications, drafts verified, hits (a verified draft state the trajectory reached), and whether
every output equals vanilla's. Under llada2_edit also: the official loop's forwards for the same
prompts (tests/llada2_reference.py), so the states it revisits (which the engine reuses) show, and the
drafts with the parent's suggested edits switched off (ablation of graph.fillable's edits).

Part 2, SpecFold's fold ratio on the MoE layers (llada2 rule, FreeDave depth 4 drafts) at several
delta: per layer, the share of draft positions whose FFN (routed + shared experts) output was
inherited from their source, i.e. expert rows not computed; token match with vanilla (delta > 0 is
lossy by design).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from provenance import header, write_result  # noqa: E402 (benchmarks/, this script's folder)
from specfold import LLM, DecodeParams  # noqa: E402
from specfold.decoding.drafts import graph as G  # noqa: E402
from specfold.decoding.drafts.calibrate import calibrate  # noqa: E402
from tests import llada2_checkpoint as C  # noqa: E402 (random checkpoints with the public names)
from tests.llada2_reference import reference_decode  # noqa: E402

SHAPE = dict(num_hidden_layers=4, hidden_size=64, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, vocab_size=128, num_experts=16, num_experts_per_tok=4,
             n_group=4, topk_group=2, moe_intermediate_size=32, num_shared_experts=1, first_k_dense_replace=1)
SETTINGS = {  # name -> rule settings (block 32: the family's)
    "llada2 (0.95, steps 32)": dict(rule="llada2"),
    "llada2_edit quality (0.7 / 0.5 / 16)": dict(rule="llada2_edit", threshold=0.7, edit_threshold=0.5,
                                                max_post_steps=16),
    "llada2_edit fast (0.5 / 0.0 / 16)": dict(rule="llada2_edit", threshold=0.5, edit_threshold=0.0,
                                             max_post_steps=16),
}


def prompts(n: int, V: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(5, 48, (n,), generator=g).tolist()
    return [torch.randint(0, V - 2, (L,), generator=g).tolist() for L in lens]


def run(llm, ps, params) -> dict:
    t0 = time.perf_counter()
    outs = llm.generate(ps, params)
    ex = [o.stats.extra for o in outs]
    return dict(ids=[o.token_ids for o in outs], nfe=sum(o.stats.nfe for o in outs),
                verify=sum(o.stats.verify_forwards for o in outs), tokens=sum(len(o.token_ids) for o in outs),
                drafts=sum(e.get("drafts_verified", 0) for e in ex),
                hits=sum(sum(e.get("node_hits", {}).values()) for e in ex),
                reused=sum(e.get("reused_states", 0) for e in ex), seconds=time.perf_counter() - t0,
                ffn=[e.get("ffn_fold_ratio_per_layer") for e in ex], fold=[e.get("fold_ratio") for e in ex])


class _NoEdits:
    """graph.fillable with the parent's suggested edits switched off (the monotone drafts)."""

    def __enter__(self):
        self.orig = G.fillable
        G.fillable = lambda order, src, base, M, edits=False: self.orig(order, src, base, M, False)

    def __exit__(self, *exc):
        G.fillable = self.orig


def official_forwards(w, cfg, ps, spec, n, kw) -> int:
    M, eos = spec.mask_token_id, spec.stop_token_ids[0]
    rk = dict(steps=kw.get("steps", 32), threshold=kw.get("threshold", 0.95), edit_threshold=kw.get("edit_threshold", 0.0),
              max_post_steps=kw.get("max_post_steps", 16))
    return sum(reference_decode(w, cfg, p, rule=kw["rule"], max_new_tokens=n, mask_id=M, eos_id=eos, block=32,
                                **rk)[1] for p in ps)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--calib", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--deltas", type=float, nargs="*", default=[0.0, 0.05, 0.2, 0.5])
    ap.add_argument("--out", default=None, help="write the report here as JSON (with the run's header)")
    ap.add_argument("--note", default="", help="what the run shared the machine with (the result's machine note)")
    a = ap.parse_args()
    head = header(a.note)
    tmp = Path(tempfile.mkdtemp())
    folder, cfg, w = C.make(tmp / "ckpt", seed=0, head_scale=4.0, eos_boost=1.0, **SHAPE)
    llm = LLM(folder, dtype="float64", overrides=C.overrides(cfg))
    V = cfg["vocab_size"]
    ev, cal = prompts(a.n, V, 1), prompts(a.calib, V, 2)
    n = a.max_new_tokens
    report = {"shape": SHAPE, "n": a.n, "calib": a.calib, "max_new_tokens": n, "dtype": "float64",
              "weights": "random", "rules": {}, "fold": {}}
    for name, kw in SETTINGS.items():
        base = DecodeParams(max_new_tokens=n, draft_budget=64, **kw)
        graph = calibrate(llm, cal, base, branches=7)
        methods = {"vanilla": {}, "freedave d4": dict(method="freedave", draft_depth=4),
                   "freedave d8": dict(method="freedave", draft_depth=8),
                   "spiffy B7 (calibrated)": dict(method="spiffy", branches=7, graph=graph),
                   "specfold d0 freedave d4": dict(method="specfold", delta=0.0, drafts="freedave", draft_depth=4),
                   "specfold d0 spiffy B7": dict(method="specfold", delta=0.0, drafts="spiffy", branches=7, graph=graph)}
        rows = {}
        for m, extra in methods.items():
            rows[m] = run(llm, ev, base.replace(**extra))
            if kw["rule"] == "llada2_edit" and m in ("freedave d8", "spiffy B7 (calibrated)"):
                with _NoEdits():
                    g2 = calibrate(llm, cal, base, branches=7) if m.startswith("spiffy") else None
                    rows[m + ", no suggested edits"] = run(llm, ev, base.replace(**(extra | ({"graph": g2} if g2 else {}))))
        van = rows["vanilla"]["ids"]
        entry = {m: {k: v for k, v in r.items() if k not in ("ids", "ffn", "fold")} | {"equal": r["ids"] == van}
                 for m, r in rows.items()}
        if kw["rule"] == "llada2_edit":
            entry["official loop forwards (denoising)"] = official_forwards(w, cfg, ev, llm.spec, n, kw)
        report["rules"][name] = entry
        print(name, json.dumps(entry, indent=1), flush=True)
    base = DecodeParams(max_new_tokens=n, draft_budget=64, rule="llada2", method="specfold", drafts="freedave",
                        draft_depth=4)
    van = run(llm, ev, DecodeParams(max_new_tokens=n, rule="llada2"))["ids"]
    for d in a.deltas:
        r = run(llm, ev, base.replace(delta=d))
        per = [sum(x[i] or 0.0 for x in r["ffn"]) / max(1, sum(x[i] is not None for x in r["ffn"]))
               for i in range(SHAPE["num_hidden_layers"])]
        report["fold"][str(d)] = dict(ffn_fold_ratio_per_layer=per, moe_layers=list(range(1, SHAPE["num_hidden_layers"])),
                                      match=sum(x == y for x, y in zip(r["ids"], van)) / len(van), nfe=r["nfe"])
        print("delta", d, report["fold"][str(d)], flush=True)
    if a.out:
        write_result(a.out, head, report)


if __name__ == "__main__":
    main()
