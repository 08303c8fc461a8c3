"""Folded-verification compute kernels (SPEC.md §6).

Two backends with the same function signatures: ``"torch"`` (``fold_torch``: the CPU path and the
reference) and ``"triton"`` (``fold_triton``: the GPU path; importable without triton, raising a
clear error when a kernel is called). ``get_backend(name)`` returns the backend module, which
provides gate_compact, compact_rows, resolve_sources, packed_norm_qkv_rope, streaming_attention,
folded_correction and packed_ffn. ``fold_pack`` composes them over the packed rows of one or many
forwards; ``fold_layer`` (one forward) / ``dense_layer`` are the per-layer entry points.
"""

from __future__ import annotations

from types import ModuleType

from specfold.kernels.fold_torch import LayerFoldStats, LayerWeights, dense_layer, fold_layer

BACKENDS = ("torch", "triton")

__all__ = ["BACKENDS", "LayerFoldStats", "LayerWeights", "dense_layer", "fold_layer", "get_backend",
           "triton_unavailable"]


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
