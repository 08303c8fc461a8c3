"""Kernel tests: one CPU thread, Triton in interpreter mode when there is no GPU.

TRITON_INTERPRET must be set before ``triton.jit`` decorates the kernels (i.e. before
``specfold.kernels.fold_triton`` is imported), so it is set here, at collection time.
"""

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
torch.set_num_threads(1)
sys.path.insert(0, os.path.dirname(__file__))  # fold_helpers
