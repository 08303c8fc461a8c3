"""The argparse pieces every command shares: model, decoding and engine flags, and how they become
an `LLM`, `DecodeParams` and `EngineConfig`. Commands (cli.py and the command modules of eval,
serve, ray, tiny, calibrate_cli, widen_cli) import them from here, never from cli.py.
"""
from __future__ import annotations

import argparse
import json

from specfold.params import CONFIDENCES, RULES


def _int_at_least(text: str, lo: int, what: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if v < lo:
        raise argparse.ArgumentTypeError(f"expected {what}, got {v}")
    return v


def positive_int(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


def nonnegative_int(text: str) -> int:
    return _int_at_least(text, 0, "an integer >= 0")


def draft_budget(text: str):
    """--draft-budget: 'auto' or an integer >= 0."""
    return text if text == "auto" else _int_at_least(text, 0, "'auto' or an integer >= 0")


def add_model_args(ap: argparse.ArgumentParser, parallel: bool = True) -> None:
    """The checkpoint flags; with `parallel` (every command that decodes through `LLM.generate` or an
    engine) also the tensor-parallel ones (vLLM's names)."""
    ap.add_argument("--model", default="tiny", help="local HuggingFace checkpoint folder, or 'tiny'")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16", "float16"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=JSON",
                    help="model spec override, e.g. mask_token_id=151665 (repeatable)")
    ap.add_argument("--threads", type=positive_int, default=None,
                    help="torch CPU threads (with -tp N: shared by the N ranks)")
    if parallel:
        add_parallel_args(ap)


EXECUTOR_BACKENDS = ("mp", "ray")  # executor/ranks.py's BACKENDS (not imported: --help loads no torch)


def add_parallel_args(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("parallelism")
    g.add_argument("--tensor-parallel-size", "-tp", type=positive_int, default=1, metavar="N",
                   help="split the model over N ranks (processes: one GPU each on CUDA, a share of the CPU "
                        "threads each on the CPU); N must divide the heads, KV heads and FFN widths")
    g.add_argument("--enable-expert-parallel", action="store_true",
                   help="mixture-of-experts checkpoints: each rank holds 1/N of the experts whole instead of "
                        "a 1/N slice of every expert")
    g.add_argument("--distributed-executor-backend", choices=EXECUTOR_BACKENDS, default="mp",
                   help="how the other ranks start: 'mp' local processes (default), 'ray' Ray actors in one "
                        "placement group (needs the 'ray' extra)")


def add_decode_args(ap: argparse.ArgumentParser) -> None:
    from specfold.decoding.methods import BUILTIN
    g = ap.add_argument_group("decoding")
    g.add_argument("--method", default="vanilla", help=f"one of {', '.join(BUILTIN)}")
    g.add_argument("--rule", choices=RULES, default=None, help="unmask rule (default: the family's)")
    g.add_argument("--block-size", type=int)
    g.add_argument("--sub-block-size", type=int)
    g.add_argument("--tokens-per-step", type=int, help="k of the static/dynamic rules")
    g.add_argument("--threshold", type=float)
    g.add_argument("--confidence", choices=CONFIDENCES)
    g.add_argument("--steps", type=int, help="llada / llada2: steps per block; dream: total steps")
    g.add_argument("--edit-threshold", type=float, help="llada2_edit: a written token is rewritten when p > this")
    g.add_argument("--max-post-steps", type=nonnegative_int,
                   help="llada2_edit: forwards a block may run once it has no mask")
    g.add_argument("--max-new-tokens", type=positive_int, default=256)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--no-chat-template", action="store_true", help="send the prompt text as is")
    g.add_argument("--no-early-stop", action="store_true")
    g.add_argument("--draft-depth", type=int, default=8, help="FreeDave chain depth")
    g.add_argument("--eager", action="store_true", help="FreeDave drafts may reach into the next block")
    g.add_argument("--branches", type=int, default=7, help="Spiffy/SpecFold draft branches")
    g.add_argument("--graph", default=None, help="Spiffy draft graph JSON")
    g.add_argument("--graph-depth", type=positive_int, default=None,
                   help="Spiffy/SpecFold: use only the graph's nodes at most this deep (default: all)")
    g.add_argument("--delta", type=float, default=0.05, help="SpecFold fold threshold (default 0.05: the sweep in BENCHMARKS.md)")
    g.add_argument("--drafts", default="spiffy", choices=["spiffy", "freedave"], help="SpecFold draft policy")
    g.add_argument("--backend", default="torch", choices=["torch", "triton"], help="SpecFold kernels")
    g.add_argument("--draft-budget", type=draft_budget, default="auto", metavar="auto|N",
                   help="drafts a verification verifies: 'auto' (default: chosen every step from this machine's "
                        "measured cost and the drafts' acceptance) or N >= 0 (the first N; 0 = none); tokens "
                        "never change")


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Scheduler settings of the engine (`EngineConfig`), shared by `generate` and `serve`."""
    g = p.add_argument_group("engine")
    g.add_argument("--max-num-seqs", type=positive_int, default=64, help="requests decoded at once")
    g.add_argument("--max-num-batched-tokens", type=positive_int, default=8192,
                   help="token rows of one engine step (at least one forward always runs)")
    g.add_argument("--static-shapes", action="store_true",
                   help="a pooled KV cache and every step padded to bucket sizes (the same tokens)")
    g.add_argument("--cuda-graphs", action="store_true",
                   help="CUDA only: one captured CUDA graph per bucket (implies --static-shapes)")
    g.add_argument("--max-seq-len", type=positive_int, default=None,
                   help="static shapes: prompt + max new tokens one request may hold (default: min(context, 2048))")


_ENGINE_FLAGS = ("method", "rule", "block_size", "sub_block_size", "tokens_per_step", "threshold", "confidence",
                 "steps", "edit_threshold", "max_post_steps", "draft_depth", "eager", "branches", "graph",
                 "graph_depth", "delta", "drafts", "backend", "draft_budget", "max_num_seqs",
                 "max_num_batched_tokens", "max_waiting", "static_shapes", "cuda_graphs", "max_seq_len")


def engine_config_from_args(a: argparse.Namespace):
    """The `EngineConfig` of the decode and engine flags (validated here: bad settings fail before the
    model is loaded)."""
    from specfold.params import EngineConfig
    kw = {f: getattr(a, f) for f in _ENGINE_FLAGS if hasattr(a, f)}
    return EngineConfig(**kw, early_stop=not a.no_early_stop)


def sampling_from_args(a: argparse.Namespace):
    """The `SamplingParams` of the sampling flags (every request of a `generate` run takes them)."""
    from specfold.params import SamplingParams
    return SamplingParams(max_new_tokens=a.max_new_tokens, temperature=a.temperature, seed=a.seed,
                          chat_template=not a.no_chat_template)


def params_from_args(a: argparse.Namespace):
    """The all-in-one `DecodeParams` of the flags, for the commands that take one per run (calibrate,
    bench, eval: their sweeps vary engine and sampling settings together)."""
    from specfold.params import DecodeParams
    return DecodeParams.join(engine_config_from_args(a), sampling_from_args(a))


def overrides_from_args(a: argparse.Namespace) -> dict:
    """The model spec overrides of `--override KEY=JSON` (a value that is not JSON is a string)."""
    overrides = {}
    for item in a.override:
        key, _, val = item.partition("=")
        try:
            overrides[key] = json.loads(val)
        except json.JSONDecodeError:
            overrides[key] = val
    return overrides


def llm_from_args(a: argparse.Namespace):
    import torch

    from specfold.api import LLM
    if a.threads:
        torch.set_num_threads(a.threads)
    return LLM(a.model, dtype=a.dtype, device=a.device, overrides=overrides_from_args(a) or None,
               **parallel_from_args(a))


def parallel_from_args(a: argparse.Namespace) -> dict:
    """The `LLM` keywords of the parallelism flags (none on a command without them); the `ray`
    backend checks its extra first (one line when it is missing)."""
    if not hasattr(a, "tensor_parallel_size"):
        return {}
    kw = {"tensor_parallel_size": a.tensor_parallel_size, "enable_expert_parallel": a.enable_expert_parallel,
          "distributed_executor_backend": a.distributed_executor_backend}
    if kw["distributed_executor_backend"] == "ray" and (kw["tensor_parallel_size"] > 1 or kw["enable_expert_parallel"]):
        from specfold.extras import require
        require("ray", "--distributed-executor-backend ray")
    return kw


def stats_line(st) -> str:
    line = (f"[{st.tokens} tokens, {st.nfe} forwards, {st.tokens_per_forward:.2f} tokens/forward, "
            f"{st.seconds:.2f} s, {st.tokens_per_second:.1f} tokens/s")
    if st.extra.get("fold_ratio") is not None:  # None: no draft position was verified
        line += f", fold ratio {st.extra['fold_ratio']:.2f}"
    return line + "]"
