"""The fold backends by name: "torch" (`fold_torch`, the CPU path and the reference) and "triton"
(`fold_triton`, the GPU path). Callers pick one with a flag (`backend="triton"`), never by module."""
from __future__ import annotations

from types import ModuleType

BACKENDS = ("torch", "triton")

def triton_unavailable(device) -> str | None:
    """Why the "triton" backend cannot run kernels for a model on `device` here (None: it can).
    It needs the triton package and a CUDA device, or TRITON_INTERPRET=1 (CPU interpreter, slow)."""
    import importlib.util
    import os
    if importlib.util.find_spec("triton") is None:
        return "backend 'triton' needs the triton package: pip install 'specfold[triton]'; or use backend 'torch'"
    if os.environ.get("TRITON_INTERPRET") == "1" or str(device).startswith("cuda"):
        return None
    return (f"backend 'triton' runs its kernels on a CUDA GPU, but the model is on {str(device)!r}; use "
            f"backend 'torch' (or set TRITON_INTERPRET=1 to run the kernels in Triton's slow CPU interpreter)")


def get_backend(name: str) -> ModuleType:
    """Module implementing the fold pieces for backend ``name`` ("torch" or "triton")."""
    if name == "torch":
        from specfold.kernels import fold_torch
        return fold_torch
    if name == "triton":
        from specfold.kernels import fold_triton
        return fold_triton
    raise ValueError(f"unknown fold backend {name!r}; supported: {', '.join(BACKENDS)}")
