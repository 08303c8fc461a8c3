"""`specfold widen`: write a function-preserving widened copy of a checkpoint (a cost proxy).

The arithmetic lives in `specfold.models.widen`; this module only parses arguments, prints the plan
and reports errors in one line. Unset dimensions keep the source's (or the preset's) value.
"""
from __future__ import annotations

import argparse
import sys


def cmd_widen(a: argparse.Namespace) -> int:
    import torch

    from specfold.errors import SpecfoldError
    from specfold.models.widen import PRESETS, Shape, resolve_shape, source_spec, widen_checkpoint
    if a.threads:
        torch.set_num_threads(a.threads)
    try:
        _path, _config, spec = source_spec(a.model)
        shape = resolve_shape(Shape.of(spec), spec.head_dim, a.preset, a.hidden, a.intermediate, a.heads,
                              a.kv_heads, a.layers)
        if a.preset and a.layers is None and not a.quiet:
            p = PRESETS[a.preset]
            print(f"preset {a.preset}: {p['name']} width (depth kept at {shape.layers} layers; "
                  f"--layers {p['layers']} for its depth)", file=sys.stderr)
        out = widen_checkpoint(a.model, a.out, shape, seed=a.seed, dtype=a.dtype, progress=not a.quiet)
    except SpecfoldError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(out)
    return 0


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def register(subparsers) -> argparse.ArgumentParser:
    from specfold.models.widen import DTYPES, PRESETS
    presets = ", ".join(f"{k} ({v['name']}: {v['hidden']}/{v['intermediate']}, {v['heads']}/{v['kv_heads']} heads)"
                        for k, v in PRESETS.items())
    p = subparsers.add_parser(
        "widen", help="widen a checkpoint without changing its function (benchmark cost proxy)",
        description="Write a wider (and optionally deeper) copy of a checkpoint whose logits equal the "
                    "source's: zero-padded hidden dims, rescaled RMSNorms, extra random heads and FFN units "
                    "with zero output weights, identity layers. head_dim is kept. A cost proxy: tokens, "
                    f"fold ratios and accepted drafts are the source's. Presets: {presets}.")
    p.add_argument("--model", default="tiny", help="source checkpoint folder, or 'tiny'")
    p.add_argument("--out", required=True, help="new output folder (must not exist or be empty)")
    p.add_argument("--preset", choices=sorted(PRESETS), help="a named model's width (depth: --layers)")
    p.add_argument("--hidden", type=_positive, help="hidden size (>= the source's)")
    p.add_argument("--intermediate", type=_positive, help="FFN size (>= the source's)")
    p.add_argument("--heads", type=_positive, help="query heads (>= the source's)")
    p.add_argument("--kv-heads", type=_positive, help="KV heads (>= the source's; divides --heads)")
    p.add_argument("--layers", type=_positive, help="layers (>= the source's; extra ones are identities)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights of new heads/units")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                   help="stored dtype (default: the source's; float64 for exactness checks)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=cmd_widen)
    return p
