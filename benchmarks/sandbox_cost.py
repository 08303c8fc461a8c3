"""Cost of the code sandbox per program: all 164 canonical HumanEval solutions, one at a time.

Prints pass count and the median / p90 / max wall seconds per program as `run_program` measures
them (bwrap + seccomp + interpreter start + guard + the program + teardown), next to the median
start-up of a bare `python -I -S -c pass` measured in the same run (the floor any
out-of-process executor pays here).

    OMP_NUM_THREADS=1 taskset -c 0 .venv/bin/python benchmarks/sandbox_cost.py [--out F.json]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from specfold.eval.sandbox import isolation
from specfold.eval.tasks import get_task

from provenance import header, write_result  # benchmarks/ (this script's folder)


def bare_startup(n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], check=True)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=None, help="first N problems (default: all 164)")
    ap.add_argument("--out", default=None, help="write the figures here as JSON (with the run's header)")
    ap.add_argument("--note", default="", help="what the run shared the machine with (the result's machine note)")
    args = ap.parse_args()
    head = header(args.note)
    print(f"isolation: {isolation()}")
    task = get_task("humaneval")
    samples = task.load(None, limit=args.limit)
    secs, failed, bare = [], [], []
    for s in samples:  # interleave the bare start-ups so both see the same machine load
        r = task.score(s, s.reference["canonical_solution"])
        secs.append(r["exec_seconds"])
        if not r["correct"]:
            failed.append((s.id, r["status"], r["error"]))
        bare += bare_startup(1)
    q = statistics.quantiles(secs, n=10)
    print(f"programs: {len(samples)}  passed: {len(samples) - len(failed)}  failed: {failed}")
    print(f"sandboxed run, s/program: median {statistics.median(secs):.3f}  p90 {q[-1]:.3f}  max {max(secs):.3f}")
    print(f"bare python -I -S start-up, s: median {statistics.median(bare):.3f}")
    print(f"ratio of medians (sandboxed / bare start-up): {statistics.median(secs) / statistics.median(bare):.2f}")
    if args.out:
        write_result(args.out, head, {
            "isolation": isolation(), "programs": len(samples), "passed": len(samples) - len(failed),
            "failed": [list(f) for f in failed], "median_s": statistics.median(secs), "p90_s": q[-1],
            "max_s": max(secs), "bare_median_s": statistics.median(bare),
            "ratio": statistics.median(secs) / statistics.median(bare)})


if __name__ == "__main__":
    main()
