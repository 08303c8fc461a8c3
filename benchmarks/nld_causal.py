"""Nemotron-Labs-Diffusion's causal modes on a RANDOM-weight NLD-layout model: equivalence and cost.

    PYTHONPATH=. python benchmarks/nld_causal.py [--shape small|nld3b] [--device cpu] [--dtype float32]

There are no NLD weights here, so this measures only what random weights can show:
1. side by side through the engine, per method: forwards (prefill / draft / verify), token rows
   computed, wall time, and whether the tokens equal `ar` (lossless); never accuracy, and no tokens
   per forward (on random weights acceptance says nothing about a trained model);
2. the cost of one verification batch: the B-branch causal verify batches recorded from a real
   multi-branch run, timed dense (one batched forward) against folded (SpecFold, δ = 0 and 0.1),
   against the single-branch verify and one draft forward.
Proxy: the head rows of a few tokens are scaled, the mask embedding is pulled towards one of them and
the layers' output projections are scaled down, so that bidirectional drafts are sometimes accepted
(with plain random weights every round accepts only its bonus token). This is a cost proxy, named as
one wherever its figures are used.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import time
from types import SimpleNamespace

import torch

from specfold.decoding.causal import driver
from specfold.decoding.causal.methods import build
from specfold.decoding.verify.fold import FoldVerifier
from specfold.engine.engine import Engine
from specfold.models.spec import ModelSpec
from specfold.models.transformer import Transformer
from specfold.params import DecodeParams, EngineConfig, SamplingParams

SHAPES = {  # Ministral-3 3B is NLD-3B's base (hidden 3072, 26 layers, GQA 32/8, head_dim 128)
    "small": dict(hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=2, head_dim=32,
                  intermediate_size=768, vocab_size=4096),
    "nld3b": dict(hidden_size=3072, num_layers=26, num_heads=32, num_kv_heads=8, head_dim=128,
                  intermediate_size=9216, vocab_size=131072),
}
MASK, FOCUS, LIKE = 100, list(range(200, 206)), 203


def random_nld(shape: str, device: str, dtype: torch.dtype, seed: int = 0) -> Transformer:
    spec = ModelSpec(family="nemotron_labs_diffusion", model_type="nemotron_labs_diffusion",
                     **SHAPES[shape], rope_theta=1e6, max_position_embeddings=8192, weight_layout="nemotron",
                     mask_token_id=MASK, stop_token_ids=(11,), attention="causal_prefix",
                     alignment="after_prompt", seed_token=True, block_size=32, threshold=0.9, threshold_ge=True,
                     max_new_tokens_multiple_of_block=True)
    torch.manual_seed(seed)
    with torch.device(device):
        m = Transformer(spec).to(dtype)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0, 0.02 if p.dim() > 1 else 0.0)
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.mul_(0.6)
        m.lm_head.weight[FOCUS] *= 2.0
        m.embed.weight[MASK] = 0.3 * m.embed.weight[MASK] + 0.7 * m.embed.weight[LIKE]
    return m.eval().requires_grad_(False)


METHODS = [  # (label, EngineConfig fields)
    ("ar", dict(method="ar")),
    ("diffusion threshold 0.9", dict(method="vanilla", rule="threshold", threshold=0.9)),
    ("linear_spec τ=0", dict(method="linear_spec", threshold=0.0)),
    ("linear_spec τ=0.9", dict(method="linear_spec", threshold=0.9)),
    ("multi B=4 τ=0 dense", dict(method="linear_spec_multi", threshold=0.0, branches=4)),
    ("multi B=7 τ=0 dense", dict(method="linear_spec_multi", threshold=0.0, branches=7)),
    ("multi B=7 τ=0 folded δ=0", dict(method="linear_specfold", threshold=0.0, branches=7, delta=0.0)),
    ("multi B=7 τ=0 folded δ=0.1", dict(method="linear_specfold", threshold=0.0, branches=7, delta=0.1)),
]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def side_by_side(model, prompts, n: int, device: str, emit=print) -> None:
    llm = SimpleNamespace(model=model, spec=model.spec, tokenizer=None)
    emit("| method | forwards (prefill+draft+verify) | token rows | seconds | tokens | match with ar | fold ratio |")
    emit("|---|---|---|---|---|---|---|")
    ref = None
    for label, kw in METHODS:
        eng = Engine(llm, EngineConfig(**kw))
        outs = []
        sync(device)
        t0 = time.perf_counter()
        for p in prompts:
            outs.append(eng.run_one(p, SamplingParams(max_new_tokens=n)))
        sync(device)
        secs = time.perf_counter() - t0
        ref = ref or outs
        nfe = sum(o.stats.nfe for o in outs)
        ex = [o.stats.extra for o in outs]
        parts = "+".join(str(sum(e.get(k, 0) for e in ex)) for k in ("prefill_forwards", "draft_forwards",
                                                                      "verify_forwards"))
        if kw["method"] == "vanilla":
            parts = "(diffusion: prefill, denoise, commit)"
        rows = sum(e.get("rows", 0) for e in ex) or "-"
        toks = sum(o.stats.tokens for o in outs)
        match = sum(o.token_ids == r.token_ids for o, r in zip(outs, ref)) / len(outs)
        folds = [e["fold_ratio"] for e in ex if "fold_ratio" in e]
        fr = f"{sum(folds) / len(folds):.2f}" if folds else "-"
        emit(f"| {label} | {nfe} {parts} | {rows} | {secs:.2f} | {toks} | {match:.2f} | {fr} |")


def record_verifies(model, prompt, n: int, branches: int, k: int) -> list:
    """The first `k` multi-branch verify Forwards of a real linear_spec_multi run."""
    method = build("linear_spec_multi", model, model.spec, DecodeParams(method="linear_spec_multi",
                                                                        threshold=0.0, branches=branches))
    got = []
    real = driver.execute

    def spy(m, f, verifier=None):
        if f.kind == "verify" and f.tokens.shape[0] > 1 and len(got) < k:
            got.append(f)
        return real(m, f, verifier)

    driver.execute = spy
    try:
        st = method.new_state(prompt, n, model.spec.stop_token_ids)
        driver.run(method.program, st, model)
    finally:
        driver.execute = real
    return got, st


def verify_costs(model, prompt, n: int, device: str, reps: int, emit=print) -> None:
    emit("\n| forward | rows | ms (median) | vs single-branch verify | fold ratio |")
    emit("|---|---|---|---|---|")
    for B in (4, 7):
        fws, st = record_verifies(model, prompt, n, B, k=6)
        if not fws:
            emit(f"| B={B}: no multi-branch verify recorded | | | | |")
            continue
        f = fws[len(fws) // 2]
        cache = st.cache  # the recorded forwards' prefix: crop the final cache back to it
        P = int(f.positions[0])
        cache.truncate(P)

        def t(fn):
            fn()
            sync(device)
            ts = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                sync(device)
                ts.append(time.perf_counter() - t0)
            return statistics.median(ts) * 1000

        with torch.inference_mode():
            one = t(lambda: model(f.tokens[:1], f.positions, cache=cache, mask=f.mask, logits_at=f.logits_at))
            M = torch.full_like(f.tokens[:1], MASK)
            M[0, 0] = f.tokens[0, 0]
            draft = t(lambda: model(M, f.positions, cache=cache, mask=None, logits_at=f.logits_at))
            dense = t(lambda: model(f.tokens, f.positions, cache=cache, mask=f.mask, logits_at=f.logits_at))
            W = f.tokens.shape[1]
            if B == 4:
                emit(f"| draft forward (1 branch, bidirectional) | {W} | {draft:.2f} | {draft / one:.2f}x | - |")
                emit(f"| single-branch causal verify | {W} | {one:.2f} | 1.00x | - |")
            emit(f"| B={f.tokens.shape[0]} causal verify, dense | {f.rows} | {dense:.2f} | {dense / one:.2f}x | - |")
            for delta in (0.0, 0.1):
                fv = FoldVerifier(model, delta)
                ms = t(lambda: fv(f.tokens, f.parents, f.positions, cache, f.mask, f.logits_at))
                fv(f.tokens, f.parents, f.positions, cache, f.mask, f.logits_at)
                emit(f"| B={f.tokens.shape[0]} causal verify, folded δ={delta} | {f.rows} | {ms:.2f} | "
                     f"{ms / one:.2f}x | {fv.last_stats[0].report()['fold_ratio']:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="small", choices=sorted(SHAPES))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dev = torch.cuda.get_device_name() if a.device == "cuda" else platform.processor() or platform.machine()
    print(f"# nld_causal: random-weight NLD-layout model ({a.shape}, {a.dtype}), {dev}, {a.threads} thread(s), "
          f"torch {torch.__version__}, commit {commit}, {time.strftime('%Y-%m-%d %H:%M')}\n")
    model = random_nld(a.shape, a.device, getattr(torch, a.dtype))
    g = torch.Generator().manual_seed(1)
    V = model.spec.vocab_size
    prompts = [torch.randint(300, V, (a.prompt_len,), generator=g).tolist() for _ in range(a.prompts)]
    side_by_side(model, prompts, a.max_new_tokens, a.device)
    verify_costs(model, prompts[0], a.max_new_tokens, a.device, a.reps)


if __name__ == "__main__":
    main()
