"""The argparse pieces every command shares: model and parallelism flags, the settings flags, and how
they become an `LLM`, an `EngineConfig` and `SamplingParams`. Commands (cli.py and the command modules
of eval, serve, ray, tiny, calibrate_cli, widen_cli) import them from here, never from cli.py.

The settings flags are made from the fields of `EngineConfig` and `SamplingParams` (`add_settings`):
one flag per field, `--field-name`, its type from the annotation, its default and help from the field
(params.py's `setting` metadata); a boolean gets `--x/--no-x`. Each value is checked by the dataclass
as it is parsed, so a bad one is one line naming the flag; checks across fields come when the flags
become the dataclasses (`engine_config_from_args`, `sampling_from_args`), before any model loads.
"""
from __future__ import annotations

import argparse
import dataclasses
import json

from specfold.errors import ParamsError
from specfold.params import EngineConfig, SamplingParams


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


SETTINGS = (EngineConfig, SamplingParams)
GROUPS = {EngineConfig: "engine (EngineConfig: fixed per engine)",
          SamplingParams: "sampling (SamplingParams: per request)"}


def flag(name: str) -> str:
    """The flag of a settings field: `--max-new-tokens` for `max_new_tokens`."""
    return "--" + name.replace("_", "-")


def add_settings(ap: argparse.ArgumentParser, exclude: tuple[str, ...] = ()) -> None:
    """One flag per field of EngineConfig and SamplingParams, but those in `exclude` (fields that mean
    nothing to this command); a command's defaults are the fields' (or their `cli_default`)."""
    for cls in SETTINGS:
        g = ap.add_argument_group(GROUPS[cls])
        for f in dataclasses.fields(cls):
            if f.name not in exclude:
                _add_field(g, cls, f)


def _add_field(g, cls, f: dataclasses.Field) -> None:
    meta, base = f.metadata, f.type.replace(" | None", "")
    default = meta.get("cli_default", f.default)
    help_ = meta["help"] + (f" (default: {default})" if default is not None else "")
    if f.name == "method":  # the registry names (decoding/methods imports no torch)
        from specfold.decoding.methods import BUILTIN
        help_ += f"; one of {', '.join(BUILTIN)}"
    kw = {"default": default, "metavar": meta.get("metavar") or _METAVARS.get(base), "dest": f.name}
    if base == "bool":
        action = g.add_argument(flag(f.name), action=argparse.BooleanOptionalAction, **kw)
    elif base == "list[str]":
        action = g.add_argument(flag(f.name), action="append", type=_checked(cls, f.name, str, listed=True), **kw)
    else:
        action = g.add_argument(flag(f.name), type=_checked(cls, f.name, _CONVERT[base]), choices=meta.get("choices"),
                                **kw)
    action.help = help_.replace("%", "%%")  # set after: BooleanOptionalAction would append its own default


def _number(cast, what: str):
    def convert(text: str):
        try:
            return cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    return convert


def _int_or_word(text: str):
    """`int | str` (draft_budget): an integer when the text is one, else the word ('auto')."""
    try:
        return int(text)
    except ValueError:
        return text


def _int_list(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


# a field's annotation (without "| None") -> how its flag's text becomes a value (then checked by the dataclass)
_CONVERT = {"int": _number(int, "an integer"), "float": _number(float, "a number"), "str": str, "object": str,
            "int | str": _int_or_word, "list[int]": _int_list}
_METAVARS = {"int": "N", "float": "X"}


def _checked(cls, name: str, convert, listed: bool = False):
    """The argparse type of field `name`: the text converted, then checked by `cls` itself (its own
    one-line message, after argparse's "argument --flag:")."""
    def parse(text: str):
        value = convert(text)
        try:
            cls(**{name: [value] if listed else value})
        except ParamsError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return value
    parse.__name__ = name
    return parse


def _from_args(cls, a: argparse.Namespace):
    return cls(**{f.name: getattr(a, f.name) for f in dataclasses.fields(cls) if hasattr(a, f.name)})


def engine_config_from_args(a: argparse.Namespace) -> EngineConfig:
    """The `EngineConfig` of the settings flags (checked across fields here: bad settings fail before
    the model is loaded); a field without a flag on this command keeps its default."""
    return _from_args(EngineConfig, a)


def sampling_from_args(a: argparse.Namespace) -> SamplingParams:
    """The `SamplingParams` of the settings flags (every request of a run takes them)."""
    return _from_args(SamplingParams, a)


def params_from_args(a: argparse.Namespace):
    """The pair of the flags as one `DecodeParams`, for the commands that vary both per run (calibrate,
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
