"""Folded-verification compute kernels (SPEC.md §6).

Two backends with the same function signatures: ``"torch"`` (``fold_torch``: the CPU path and the
reference) and ``"triton"`` (``fold_triton``: the GPU path; importable without triton, raising a
clear error when a kernel is called). ``get_backend(name)`` returns the backend module, which
provides gate_compact, compact_rows, resolve_sources, packed_norm_qkv_rope, streaming_attention,
folded_correction and packed_ffn. ``fold_pack`` composes them over the packed rows of one or many
forwards; ``fold_layer`` (one forward) / ``dense_layer`` are the per-layer entry points.
"""

from __future__ import annotations

from specfold.kernels.backends import BACKENDS, get_backend, triton_unavailable
from specfold.kernels.fold_common import LayerFoldStats, LayerWeights
from specfold.kernels.fold_pack import dense_layer, fold_layer

__all__ = ["BACKENDS", "LayerFoldStats", "LayerWeights", "dense_layer", "fold_layer", "get_backend",
           "triton_unavailable"]

