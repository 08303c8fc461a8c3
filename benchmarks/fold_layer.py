"""Folded layer vs dense layer, one decoder layer, PyTorch twin on the CPU (SPEC.md §6, issue 5).

Random weights at Qwen2.5-0.5B widths (d=896, H=14, Hkv=2, D=64, ffn 4864) and 7B-like widths
(d=3584, H=28, Hkv=4, D=128, ffn 18944); B=7 drafts over a tree with chains of depth >= 3, window
N=32 (bidirectional), prefix P=256, float32. For each target fold ratio f the draft hidden states
are built so that exactly round(f * B * N) draft positions pass the gate (relative residual 0.01
against the parent, delta = 0.1) and the rest fail it (relative residual 0.5). Times are medians of
interleaved dense/fold calls, in CPU seconds of the compute thread on the CPU (`time.thread_time`:
the core is shared; wall time would count other jobs' time slices) and synchronised wall time on
a GPU. `ffn_fold` is the fraction of draft positions that also inherited the FFN output (second
gate on the post-attention residual, see fold_torch.fold_layer).

`bound` is the cost of dense computation on the rows folding leaves, (root rows + unfolded draft
rows) / all rows = (1 + B (1 - fold)) / (B + 1); `fold/bound` = (fold ms / dense ms) / bound (1.00
means folding costs exactly what it computes). `floor` = the dense layer run on only the rows folding
recomputes (one branch of R = root + unfolded draft rows), over the dense layer: what the recomputed
rows cost at this width on this machine when GEMMs get fewer rows (small GEMMs are less efficient
per row than the 256-row ones, so `floor` >= `bound`). `--baseline REV` adds the fold_layer of git revision
REV, timed in the same interleaved loop (`old ms`). `in-stack` = the same layer as it runs inside a
verification: the PackPlan built once per verification and the QKV rows handed on by the layer
before (its post-attention gate), so the layer makes one gate and one sync, not two.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/fold_layer.py [--baseline 45c5eb5] [--out F.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from specfold.kernels import get_backend  # noqa: E402
from specfold.kernels.fold_pack import PackPlan, Segment, packed_fold_layer  # noqa: E402
from specfold.kernels import LayerWeights, dense_layer, fold_layer  # noqa: E402

WIDTHS = {
    "0.5b": dict(d=896, Hq=14, Hkv=2, D=64, F=4864),
    "7b": dict(d=3584, Hq=28, Hkv=4, D=128, F=18944),
}
PAR = [-1, 0, 1, 2, 3, 0, 5, 1]   # B = 7: chain 0-1-2-3-4, chain 0-5-6, side branch 1-7


def make_weights(g: torch.Generator, d: int, Hq: int, Hkv: int, D: int, F: int) -> LayerWeights:
    def r(*shape: int, s: float) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * s

    return LayerWeights(
        input_norm_w=torch.ones(d), eps=1e-6,
        wq=r(Hq * D, d, s=d ** -0.5), bq=r(Hq * D, s=0.02), wk=r(Hkv * D, d, s=d ** -0.5), bk=r(Hkv * D, s=0.02),
        wv=r(Hkv * D, d, s=d ** -0.5), bv=r(Hkv * D, s=0.02), q_norm_w=None, k_norm_w=None,
        wo=r(d, Hq * D, s=(Hq * D) ** -0.5), post_norm_w=torch.ones(d),
        w_gate=r(F, d, s=d ** -0.5), w_up=r(F, d, s=d ** -0.5), w_down=r(d, F, s=F ** -0.5), head_dim=D,
    )


def make_hidden(g: torch.Generator, N: int, d: int, ratio: float) -> torch.Tensor:
    """H [B1, N, d] with exactly round(ratio * B * N) draft rows within rho = 0.01 of their parent."""
    B1 = len(PAR)
    B = B1 - 1
    n_fold = round(ratio * B * N)
    fold = torch.zeros(B * N, dtype=torch.bool)
    fold[torch.randperm(B * N, generator=g)[:n_fold]] = True
    fold = fold.view(B, N)
    H = torch.empty(B1, N, d)
    H[0] = torch.randn(N, d, generator=g)
    for i in range(1, B1):
        parent = H[PAR[i]]
        noise = torch.randn(N, d, generator=g)
        noise = noise / noise.norm(dim=-1, keepdim=True) * parent.norm(dim=-1, keepdim=True)
        rel = torch.where(fold[i - 1], 0.01, 0.5)[:, None]
        H[i] = parent + rel * noise
    return H


def timed(fns: list, reps: int, sync=lambda: None, clock=time.perf_counter) -> list[float]:
    """Median seconds of each function, calls interleaved (the CPU is shared: drift hits all alike)."""
    for fn in fns:  # warm-up (and Triton compilation)
        fn()
    ts: list[list[float]] = [[] for _ in fns]
    for _ in range(reps):
        for fn, t in zip(fns, ts):
            sync()
            t0 = clock()
            fn()
            sync()
            t.append(clock() - t0)
    return [statistics.median(t) for t in ts]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", default="0.5b,7b")
    ap.add_argument("--ratios", default="0,0.3,0.6,0.9")
    ap.add_argument("--N", type=int, default=32)
    ap.add_argument("--prefix", type=int, default=256)
    ap.add_argument("--delta", type=float, default=0.1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu | cuda")
    ap.add_argument("--backend", default="torch", help="fold backend: torch | triton (triton needs cuda)")
    ap.add_argument("--baseline", default=None, help="git revision whose fold_layer is timed alongside")
    ap.add_argument("--out", default=None, help="write the rows here as JSON (with the run's header)")
    ap.add_argument("--note", default="", help="what the run shared the machine with (the result's machine note)")
    args = ap.parse_args()
    from provenance import header, write_result  # benchmarks/ (this script's folder)
    head = header(args.note)
    rows = []
    old_fold = None
    if args.baseline:
        import baseline
        baseline.load(args.baseline)
        from specfold_base.kernels.fold_torch import LayerWeights as OldWeights  # type: ignore
        from specfold_base.kernels.fold_torch import fold_layer as old_fold  # type: ignore
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    clock = time.perf_counter if dev.type == "cuda" else time.thread_time
    print(f"torch {torch.__version__}, device {args.device}, backend {args.backend}, "
          f"threads {torch.get_num_threads()}, float32, B={len(PAR) - 1}, "
          f"N={args.N}, P={args.prefix}, delta={args.delta}, reps={args.reps} (median, interleaved)")
    print(f"baseline {args.baseline or '-'}; clock {'wall (synchronised)' if dev.type == 'cuda' else 'thread CPU time'}")
    print("| width | target | fold | ffn fold | dense ms | fold ms | old ms | fold/dense | old/dense | bound "
          "| fold/bound | floor | fold/floor | in-stack ms | in-stack/bound | max abs diff vs dense |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.widths.split(","):
        c = WIDTHS[name]
        g = torch.Generator().manual_seed(0)
        w = make_weights(g, **c)
        for f in w.__slots__:
            if isinstance(getattr(w, f), torch.Tensor):
                setattr(w, f, getattr(w, f).to(dev))
        D, Hkv, N, P = c["D"], c["Hkv"], args.N, args.prefix
        inv = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
        ang = torch.arange(P, P + N).float()[:, None] * inv[None, :]
        cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()
        pk, pv = torch.randn(Hkv, P, D, generator=g), torch.randn(Hkv, P, D, generator=g)
        cos, sin, pk, pv = cos.to(dev), sin.to(dev), pk.to(dev), pv.to(dev)
        mask = torch.ones(N, N, dtype=torch.bool, device=dev)
        par = torch.tensor(PAR, device=dev)
        be = get_backend(args.backend)
        fold = lambda H: fold_layer(H, par, w, cos, sin, pk, pv, mask, args.delta, scale, backend=args.backend)  # noqa: E731
        scale = 1 / math.sqrt(D)
        old_w = None if old_fold is None else OldWeights(**{f.name: getattr(w, f.name) for f in dataclasses.fields(OldWeights) if f.init})
        B = len(PAR) - 1
        for ratio in (float(x) for x in args.ratios.split(",")):
            H = make_hidden(g, N, c["d"], ratio).to(dev)
            with torch.inference_mode():
                dense_out = dense_layer(H, w, cos, sin, pk, pv, mask, scale)
                fold_out, st = fold(H)
                R = st.recomputed_rows
                Hr = H.reshape(1, -1, H.shape[-1])[:, :R]
                cr, sr = cos.repeat(len(PAR), 1)[:R], sin.repeat(len(PAR), 1)[:R]
                mr = torch.ones(R, R, dtype=torch.bool, device=dev)
                plan = PackPlan([Segment(len(PAR), N, PAR, None)], [cos], [sin], dev)
                X = H.reshape(-1, H.shape[-1])
                carried = plan.select(plan.gate(X, args.delta))  # what the layer before hands on
                fns = [lambda: dense_layer(H, w, cos, sin, pk, pv, mask, scale), lambda: fold(H),
                       lambda: dense_layer(Hr, w, cr, sr, pk, pv, mr, scale),
                       lambda: packed_fold_layer(X, plan, w, [(pk, pv)], args.delta, scale, be, qkv=carried)]
                if old_fold is not None:
                    fns.append(lambda: old_fold(H, par, old_w, cos, sin, pk, pv, mask, args.delta, scale,
                                                backend=args.backend))
                ts = timed(fns, args.reps, sync, clock)
            t_dense, t_fold, t_rows, t_stack = ts[:4]
            t_old = ts[4] if len(ts) > 4 else float("nan")
            err = (fold_out - dense_out).abs().max().item()
            bound = (1 + B * (1 - st.fold_ratio)) / (B + 1)
            print(f"| {name} | {ratio:.1f} | {st.fold_ratio:.2f} | {st.ffn_fold_ratio:.2f} | {t_dense * 1e3:.1f} | "
                  f"{t_fold * 1e3:.1f} | {t_old * 1e3:.1f} | {t_fold / t_dense:.2f} | {t_old / t_dense:.2f} | "
                  f"{bound:.2f} | {t_fold / t_dense / bound:.2f} | {t_rows / t_dense:.2f} | {t_fold / t_rows:.2f} | "
                  f"{t_stack * 1e3:.1f} | {t_stack / t_dense / bound:.2f} | {err:.1e} |", flush=True)
            rows.append(dict(width=name, target=ratio, fold=st.fold_ratio, ffn_fold=st.ffn_fold_ratio,
                             dense_ms=t_dense * 1e3, fold_ms=t_fold * 1e3, rows_ms=t_rows * 1e3,
                             in_stack_ms=t_stack * 1e3, old_ms=None if old_fold is None else t_old * 1e3,
                             bound=bound, max_abs_diff=err))
        del w
    if args.out:
        settings = dict(B=len(PAR) - 1, N=args.N, prefix=args.prefix, delta=args.delta, reps=args.reps,
                        threads=args.threads, device=args.device, backend=args.backend, baseline=args.baseline,
                        dtype="float32", weights="random")
        write_result(args.out, head, {"settings": settings, "rows": rows})


if __name__ == "__main__":
    main()
