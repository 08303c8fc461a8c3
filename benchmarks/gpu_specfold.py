"""The GPU check of SpecFold, one script for a lent GPU machine (target: under 8 minutes on an H100/H200).

    PYTHONPATH=. python benchmarks/gpu_specfold.py [--out report.md] [--quick] [--model DIR ...]

1. correctness of every Triton kernel against its PyTorch twin on the GPU (fold_layer pieces, float32);
2. kernel and layer times: Triton vs the PyTorch twin vs the dense layer, at Qwen2.5-0.5B and 7B
   widths, fold ratios 0 / 0.3 / 0.6 / 0.9;
3. end to end, each model under its own rule: tokens/s of vanilla vs dense Spiffy and FreeDave (plain
   and eager windows) vs SpecFold (plain and eager; torch and Triton backends; issue 14's aims) on
   the embedded tiny model, on a random-weight 0.5B-shaped model (no graph: Spiffy rows fail), and on every
   checkpoint given with `--model DIR` (e.g. the widened checkpoints of SPEC §9, which compute the
   source model's function at the wider shape: tables name them as cost proxies), side by side;
4. Nemotron-Labs-Diffusion's ar / linear_spec / multi-branch LinearSpec (dense, folded) on a
   random-weight NLD-3B-shaped model: forwards, cost and match with ar (benchmarks/nld_causal.py).
Each section reports its own failure and the script goes on. `--device cpu --quick` runs the same
code on the CPU (the interpreter for Triton is not used there: Triton rows are skipped).
"""
from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fold_layer import PAR, WIDTHS, make_hidden, make_weights  # noqa: E402

from specfold import LLM, DecodeParams  # noqa: E402
from specfold.kernels import dense_layer, fold_layer, get_backend  # noqa: E402

LINES: list[str] = []


def emit(line: str = "") -> None:
    print(line, flush=True)
    LINES.append(line)


def timeit(fn, reps: int, device: str) -> float:
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    fn()
    sync()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def layer_inputs(width: str, ratio: float, device: str, N: int = 32, P: int = 256, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    c = WIDTHS[width]
    w = make_weights(g, c["d"], c["Hq"], c["Hkv"], c["D"], c["F"])
    w = type(w)(**{f.name: (getattr(w, f.name).to(device) if isinstance(getattr(w, f.name), torch.Tensor)
                            else getattr(w, f.name)) for f in dataclasses.fields(w) if f.init})
    H = make_hidden(g, N, c["d"], ratio).to(device)
    pos = torch.arange(P, P + N, dtype=torch.float64)
    inv = 1.0 / (10000 ** (torch.arange(0, c["D"], 2, dtype=torch.float64) / c["D"]))
    emb = torch.cat([pos[:, None] * inv] * 2, dim=-1)
    cos, sin = emb.cos().float().to(device), emb.sin().float().to(device)
    pk = (torch.randn(c["Hkv"], P, c["D"], generator=g) * 0.5).to(device)
    pv = torch.randn(c["Hkv"], P, c["D"], generator=g).to(device)
    mask = torch.ones(N, N, dtype=torch.bool, device=device)
    par = torch.tensor(PAR, device=device)
    return H, par, w, cos, sin, pk, pv, mask, c["D"] ** -0.5


def section_correctness(device: str) -> None:
    emit("## 1. Triton kernels against their PyTorch twins\n")
    emit("| width | fold ratio | max abs diff of fold_layer (triton vs torch) | max abs diff torch fold(δ=0) vs dense |")
    emit("|---|---|---|---|")
    for width in ("0.5b",):
        for ratio in (0.0, 0.6):
            H, par, w, cos, sin, pk, pv, mask, scale = layer_inputs(width, ratio, device)
            ref, _ = fold_layer(H, par, w, cos, sin, pk, pv, mask, 0.1, scale, backend="torch")
            tri, _ = fold_layer(H, par, w, cos, sin, pk, pv, mask, 0.1, scale, backend="triton")
            z, _ = fold_layer(H, par, w, cos, sin, pk, pv, mask, 0.0, scale, backend="torch")
            dense = dense_layer(H, w, cos, sin, pk, pv, mask, scale)
            emit(f"| {width} | {ratio} | {(tri - ref).abs().max().item():.2e} | {(z - dense).abs().max().item():.2e} |")
    tb, tt = get_backend("torch"), get_backend("triton")
    H, par, w, cos, sin, pk, pv, mask, scale = layer_inputs("0.5b", 0.6, device)
    rec, _ = tb.gate_compact(H, par, 0.1)
    rows, folded, row_of = tb.compact_rows(rec)
    src = tb.resolve_sources(rec, par)
    kv_row = row_of.gather(0, src)
    checks = {
        "gate_compact": lambda be: be.gate_compact(H, par, 0.1)[0].float(),
        "resolve_sources": lambda be: be.resolve_sources(rec, par).float(),
        "packed_norm_qkv_rope": lambda be: torch.cat([t.flatten() for t in be.packed_norm_qkv_rope(H, rows, w, cos, sin)]),
        "streaming_attention": lambda be: _attn(be, H, rows, w, cos, sin, kv_row, pk, pv, mask, scale),
        "folded_correction": lambda be: _corr(be, H, rows, folded, src, kv_row, w, cos, sin, pk, pv, mask, scale),
        "packed_ffn": lambda be: be.packed_ffn(H, rows, w).flatten(),
    }
    emit("\n| kernel | max abs diff | torch ms | triton ms |\n|---|---|---|---|")
    for name, fn in checks.items():
        try:
            a, b = fn(tb), fn(tt)
            ta, tbt = timeit(lambda: fn(tb), 10, device), timeit(lambda: fn(tt), 10, device)
            emit(f"| {name} | {(a - b).abs().max().item():.2e} | {ta * 1e3:.3f} | {tbt * 1e3:.3f} |")
        except Exception as e:  # report and go on
            emit(f"| {name} | FAILED: {type(e).__name__}: {str(e)[:80]} | | |")


def _attn(be, H, rows, w, cos, sin, kv_row, pk, pv, mask, scale):
    q, k, v = get_backend("torch").packed_norm_qkv_rope(H, rows, w, cos, sin)
    O, m, Z = be.streaming_attention(q, k, v, rows, kv_row, pk, pv, mask, scale)
    return (O / Z[..., None]).flatten()


def _corr(be, H, rows, folded, src, kv_row, w, cos, sin, pk, pv, mask, scale):
    tb = get_backend("torch")
    q, k, v = tb.packed_norm_qkv_rope(H, rows, w, cos, sin)
    O, m, Z = tb.streaming_attention(q, k, v, rows, kv_row, pk, pv, mask, scale)
    Of, mf, Zf = be.folded_correction(q, k, v, O, m, Z, folded, src, kv_row, mask, scale)
    return (Of / Zf[..., None]).flatten()


def section_layer(device: str, quick: bool) -> None:
    emit("\n## 2. One decoder layer: dense vs folded (B=7, N=32, P=256, float32)\n")
    emit("| width | fold ratio | dense ms | fold torch ms | fold triton ms | torch speedup | triton speedup |")
    emit("|---|---|---|---|---|---|---|")
    reps = 3 if quick else 20
    for width in (("0.5b",) if quick else ("0.5b", "7b")):
        for ratio in (0.0, 0.3, 0.6, 0.9):
            H, par, w, cos, sin, pk, pv, mask, scale = layer_inputs(width, ratio, device)
            td = timeit(lambda: dense_layer(H, w, cos, sin, pk, pv, mask, scale), reps, device)
            tt = timeit(lambda: fold_layer(H, par, w, cos, sin, pk, pv, mask, 0.1, scale, backend="torch"), reps, device)
            tr = float("nan")
            if device == "cuda":
                tr = timeit(lambda: fold_layer(H, par, w, cos, sin, pk, pv, mask, 0.1, scale, backend="triton"), reps, device)
            emit(f"| {width} | {ratio} | {td * 1e3:.2f} | {tt * 1e3:.2f} | {tr * 1e3:.2f} | {td / tt:.2f}x | {td / tr:.2f}x |")


def section_end_to_end(device: str, quick: bool, extra: list[str]) -> None:
    emit("\n## 3. End to end (greedy; ratios to vanilla measured side by side)\n")
    models = []
    try:
        from specfold.api import tiny_path
        models.append(("tiny", str(tiny_path()), "float32"))
    except Exception as e:
        emit(f"tiny model unavailable: {e}")
    if not quick:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from model_core import QWEN25_05B, random_checkpoint
        tmp = Path(tempfile.mkdtemp())
        models.append(("random Qwen2.5-0.5B shape", str(random_checkpoint(tmp / "m", QWEN25_05B)), "bfloat16"))
    for path in extra:  # widened checkpoints: the source model's tokens at the wider shape's cost
        models.append((f"{Path(path).name} (cost proxy)", path, "bfloat16"))
    for name, path, dtype in models:
        llm = LLM(path, dtype=dtype, device=device)
        if llm.tokenizer is not None:  # text prompts: the tiny model's held-out questions
            import json
            from specfold.api import tiny_path
            src = Path(path) / "heldout.jsonl"
            src = src if src.is_file() else Path(tiny_path()) / "heldout.jsonl"
            prompts = [json.loads(x)["question"] for x in src.read_text().splitlines()[:8]]
            chat = True
        else:
            V = llm.spec.vocab_size
            prompts = [[(1000 + i + j) % (V - 16) + 8 for j in range(100)] for i in range(2)]
            chat = False
        n = 64 if quick else 128
        methods = end_to_end_methods(device)
        emit(f"\n### {name} ({dtype}, {len(prompts)} prompts, max_new_tokens {n})\n")
        emit("| method | NFE | tokens/forward | tokens/s | tokens/s ratio | match with vanilla | fold ratio |")
        emit("|---|---|---|---|---|---|---|")
        base = None
        for label, kw in methods:
            try:
                outs = llm.generate(prompts, DecodeParams(max_new_tokens=n, chat_template=chat, **kw))
            except Exception as e:
                emit(f"| {label} | FAILED: {type(e).__name__}: {str(e)[:80]} | | | | | |")
                continue
            nfe = sum(o.stats.nfe for o in outs)
            toks = sum(o.stats.tokens for o in outs)
            secs = sum(o.stats.seconds for o in outs)
            if base is None:
                base = (outs, toks / secs)
            match = sum(o.token_ids == b.token_ids for o, b in zip(outs, base[0])) / len(outs)
            folds = [o.stats.extra["fold_ratio"] for o in outs if o.stats.extra.get("fold_ratio") is not None]
            fr = f"{sum(folds) / len(folds):.2f}" if folds else "-"
            emit(f"| {label} | {nfe} | {toks / nfe:.2f} | {toks / secs:.1f} | {toks / secs / base[1]:.2f}x | {match:.2f} | {fr} |")


def end_to_end_methods(device: str) -> list[tuple[str, dict]]:
    """Issue 14's comparison under each model's own rule: vanilla, Spiffy B = 7 dense and folded
    (δ = 0.05, the default), FreeDave d = 8, and the eager windows (the only drafts that reach
    <= 0.67x vanilla's forwards, which a 1.5x gain needs). Spiffy rows need a graph for the model
    (the tiny model and its widened copies have one); without one they print FAILED."""
    spiffy = dict(drafts="spiffy", branches=7)
    out = [("vanilla", dict(method="vanilla")),
           ("spiffy B=7 dense", dict(method="spiffy", branches=7)),
           ("specfold spiffy δ=0.05 torch", dict(method="specfold", **spiffy)),
           ("freedave d=8 dense", dict(method="freedave", draft_depth=8)),
           ("freedave d=8 eager dense", dict(method="freedave", draft_depth=8, eager=True)),
           ("spiffy B=7 eager dense", dict(method="spiffy", branches=7, eager=True)),
           ("specfold spiffy eager δ=0.05 torch", dict(method="specfold", eager=True, **spiffy))]
    if device == "cuda":
        out += [("specfold spiffy δ=0.05 triton", dict(method="specfold", backend="triton", **spiffy)),
                ("specfold spiffy eager δ=0.05 triton", dict(method="specfold", eager=True, backend="triton", **spiffy))]
    return out


def section_nld_causal(device: str, quick: bool) -> None:
    """Nemotron-Labs-Diffusion's ar / LinearSpec / multi-branch (dense, folded) on a random-weight
    NLD-layout model (NLD-3B shape on the GPU): equivalence with ar and cost only (no NLD weights)."""
    import nld_causal as nc
    shape = "small" if quick else "nld3b"
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    emit(f"\n## 4. NLD causal modes, random weights ({shape}, {dtype}): forwards, cost, match with ar\n")
    model = nc.random_nld(shape, device, dtype)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(300, model.spec.vocab_size, (64,), generator=g).tolist() for _ in range(2)]
    nc.side_by_side(model, prompts, 32, device, emit=emit)
    nc.verify_costs(model, prompts[0], 32, device, reps=5 if quick else 20, emit=emit)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--model", action="append", default=[], metavar="DIR",
                    help="also run section 3 on this checkpoint (repeatable), e.g. a widened model")
    a = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    gpu = torch.cuda.get_device_name() if a.device == "cuda" else platform.processor() or platform.machine()
    emit(f"# SpecFold GPU check: {gpu}, torch {torch.__version__}, commit {commit}, {time.strftime('%Y-%m-%d %H:%M')}\n")
    t0 = time.time()
    sections = [lambda: section_layer(a.device, a.quick), lambda: section_end_to_end(a.device, a.quick, a.model),
                lambda: section_nld_causal(a.device, a.quick)]
    if a.device == "cuda":
        sections.insert(0, lambda: section_correctness(a.device))
    for sec in sections:
        try:
            sec()
        except Exception:
            emit("```\n" + traceback.format_exc()[-1500:] + "```")
    emit(f"\n(total {time.time() - t0:.0f} s)")
    if a.out:
        Path(a.out).write_text("\n".join(LINES) + "\n")


if __name__ == "__main__":
    main()
