"""One MoE layer at LLaDA2-mini shape (hidden 2048, 256 experts of 512, top-8 in 4 of 8 groups,
one shared expert), random float32 weights: specfold's routed experts against a dense evaluation
of every expert on every row. Time and peak memory above the resident weights, per row count.

    MALLOC_MMAP_THRESHOLD_=65536 OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python \
        benchmarks/moe_layer.py [--rows 32 128 512] [--repeats 3] [--methods routed-loop ...] [--no-warmup] [--out F.json]

Methods: `routed-loop` (models/moe.py: rows sorted by expert, one GEMM per non-empty expert),
`routed-grouped` (the same through torch's grouped GEMM: the float32 default), `dense-loop` (each of the
256 experts on all rows, weighted by the routing weights, 0 where not routed) and `dense-batched`
(the same as one batched matmul over all experts). All four give the same output (checked).
Times: wall and CPU seconds of the call (median over --repeats; on a shared machine the CPU
seconds are the fairer figure). Peak memory: the process's peak RSS (VmHWM, reset through /proc/self/clear_refs) minus its RSS
before the call (the fixed mmap threshold makes glibc return every large freed block, so an
earlier call's memory cannot hide this one's peak). Random weights make this a cost proxy: routing on trained weights is less
uniform, which changes how many experts a batch touches, not the work per routed row.
"""
from __future__ import annotations

import argparse
import gc
import re
import statistics
import time

import torch
import torch.nn.functional as F

from specfold.models import moe as moe_mod
from specfold.models.moe import MoE

from provenance import header, write_result  # benchmarks/ (this script's folder)

D, E, INTER, TOP, GROUPS, KEPT = 2048, 256, 512, 8, 8, 4


def _kib(key: str) -> int:
    return int(re.search(rf"{key}:\s+(\d+)", open("/proc/self/status").read()).group(1))


def build(seed: int = 0) -> MoE:
    torch.manual_seed(seed)
    m = MoE(D, E, INTER, TOP, GROUPS, KEPT, 2.5, 1, True)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, p.shape[-1] ** -0.5)  # in place: no second copy of the weights
        m.expert_bias.mul_(0.1)
    return m.eval().requires_grad_(False)


def dense_weights(m: MoE, x: torch.Tensor) -> torch.Tensor:
    experts, weights = m.route(x)
    return torch.zeros(x.shape[0], E, dtype=weights.dtype).scatter_(1, experts, weights)  # [R, E]


def dense_loop(m: MoE, x: torch.Tensor) -> torch.Tensor:
    w, out = dense_weights(m, x), m.shared(x)
    for e in range(E):
        h = F.silu(F.linear(x, m.w_gate[e])) * F.linear(x, m.w_up[e])
        out += w[:, e: e + 1] * F.linear(h, m.w_down[e])
    return out


def dense_batched(m: MoE, x: torch.Tensor) -> torch.Tensor:
    w = dense_weights(m, x)
    xe = x[None].expand(E, *x.shape)
    h = F.silu(torch.bmm(xe, m.w_gate.transpose(1, 2))) * torch.bmm(xe, m.w_up.transpose(1, 2))  # [E, R, I]
    y = torch.bmm(h, m.w_down.transpose(1, 2))  # [E, R, d]
    return (y * w.T[..., None]).sum(0) + m.shared(x)


def routed(backend: str):
    def run(m: MoE, x: torch.Tensor) -> torch.Tensor:
        moe_mod.BACKEND = backend
        try:
            return m(x)
        finally:
            moe_mod.BACKEND = "auto"
    return run


METHODS = {"routed-loop": routed("loop"), "routed-grouped": routed("grouped"),
           "dense-loop": dense_loop, "dense-batched": dense_batched}


def measure(fn, m: MoE, x: torch.Tensor, repeats: int, warmup: bool):
    """(median wall seconds, median CPU seconds of this process, peak MiB above the RSS before
    the call, output). CPU seconds are the fairer figure on a shared machine (one thread)."""
    out = fn(m, x) if warmup else None
    times, cpu, peak = [], [], 0.0
    for _ in range(repeats):
        out = None
        gc.collect()
        before = _kib("VmRSS")
        open("/proc/self/clear_refs", "w").write("5")  # reset the peak RSS
        t, c = time.perf_counter(), time.process_time()
        out = fn(m, x)
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        peak = max(peak, (_kib("VmHWM") - before) / 1024)
    return statistics.median(times), statistics.median(cpu), peak, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[32, 128, 512])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--no-warmup", action="store_true", help="skip the untimed first call")
    ap.add_argument("--out", default=None, help="write the rows here as JSON (with the run's header)")
    ap.add_argument("--note", default="", help="what the run shared the machine with (the result's machine note)")
    a = ap.parse_args()
    head = header(a.note)
    results = []
    torch.set_num_threads(1)
    m = build()
    print(f"weights resident: {sum(p.numel() for p in m.parameters()) * 4 / 2**30:.2f} GiB (float32)")
    print("| rows | method | wall s | CPU s | peak MiB | experts touched | max abs diff vs routed-loop |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    with torch.no_grad():
        for rows in a.rows:
            x = torch.randn(rows, D, generator=torch.Generator().manual_seed(rows))
            touched = int(torch.unique(m.route(x)[0]).numel())
            ref = None
            for name in a.methods:
                secs, cpu, peak, out = measure(METHODS[name], m, x, a.repeats, not a.no_warmup)
                ref = out if ref is None else ref
                diff = (out - ref).abs().max().item()
                print(f"| {rows} | {name} | {secs:.2f} | {cpu:.2f} | {peak:.0f} | {touched} | {diff:.1e} |",
                      flush=True)
                assert diff <= 1e-3 * ref.abs().max().item(), (name, diff)
                results.append(dict(rows=rows, method=name, wall_s=secs, cpu_s=cpu, peak_mib=peak, experts_touched=touched,
                                    max_abs_diff=diff))
    if a.out:
        shape = dict(hidden=D, experts=E, expert_width=INTER, top_k=TOP, groups=GROUPS, groups_kept=KEPT, shared_experts=1)
        write_result(a.out, head, {"settings": {"shape": shape, "dtype": "float32", "weights": "random",
                                                "repeats": a.repeats, "warmup": not a.no_warmup}, "rows": results})


if __name__ == "__main__":
    main()
