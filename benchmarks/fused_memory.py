"""Resident memory that folded verifiers add to a loaded model (fused q/k/v and gate/up weights).

    OMP_NUM_THREADS=1 python benchmarks/fused_memory.py SPECFOLD_SRC MODEL_DIR

SPECFOLD_SRC: the folder whose `specfold/` package to import (a checkout or a worktree of another
revision, for side-by-side runs). Prints the RSS after loading, after a first FoldVerifier and after
a second one. RSS does not fall when tensors are freed (the allocator keeps the pages), so a drop
shows as +0, not as a negative number.
"""
import gc
import os
import sys

src, model = sys.argv[1], sys.argv[2]
sys.path.insert(0, src)

from specfold import LLM  # noqa: E402
from specfold.decoding.verify.fold import FoldVerifier  # noqa: E402


def rss_mib() -> float:
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


llm = LLM(model, dtype="float32")
gc.collect()
a = rss_mib()
first = FoldVerifier(llm.model, 0.05)
gc.collect()
b = rss_mib()
second = FoldVerifier(llm.model, 0.1)
gc.collect()
c = rss_mib()
print(f"{src}: after load {a:.0f} MiB, first verifier {b - a:+.0f} MiB, second {c - b:+.0f} MiB")
