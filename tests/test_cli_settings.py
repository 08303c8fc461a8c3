"""Settings written once: every field of `EngineConfig` and `SamplingParams` is a flag of the commands
where it means something (made from the fields: args.add_settings), its value lands in the dataclass,
its default is the field's, and `DecodeParams` is the two dataclasses' fields, not a third list."""
from __future__ import annotations

import dataclasses

import pytest

from specfold.args import engine_config_from_args, flag, sampling_from_args
from specfold.cli import build_parser
from specfold.params import DecodeParams, EngineConfig, SamplingParams, draft_fields

FIELDS = [(cls, f) for cls in (EngineConfig, SamplingParams) for f in dataclasses.fields(cls)]
CALIBRATE_UNUSED = {n for n in draft_fields(EngineConfig) if n != "branches"} | {"method", "temperature", "seed",
                                                                                 "logprobs"}
# command -> the fields without a flag there (they mean nothing to it), and the arguments it needs
COMMANDS = {"generate": (set(), []), "bench": ({"method", "logprobs"}, []), "eval": ({"logprobs"}, []),
            "serve": ({"seed", "stop", "stop_token_ids", "chat_template", "logprobs"}, []),
            "calibrate": (CALIBRATE_UNUSED, ["--prompts", "p.txt", "--out", "g.json"])}


def _other(cls, f: dataclasses.Field) -> tuple[list[str], object]:
    """(the flag's arguments, the value they give) for a value of `f` other than its command default."""
    default = f.metadata.get("cli_default", f.default)
    base = f.type.replace(" | None", "")
    if base == "bool":
        return ([flag(f.name)], True) if not default else (["--no-" + f.name.replace("_", "-")], False)
    if f.metadata.get("choices"):
        v = next(c for c in f.metadata["choices"] if c != default)
        return [flag(f.name), v], v
    if base == "list[str]":
        return [flag(f.name), "a", flag(f.name), "b"], ["a", "b"]
    if base == "list[int]":
        return [flag(f.name), "3,4"], [3, 4]
    if base in ("int", "int | str"):
        v = default + 1 if isinstance(default, int) else 2
        return [flag(f.name), str(v)], v
    if base == "float":
        v = 0.5 if default is None else default + 0.25
        return [flag(f.name), str(v)], v
    return [flag(f.name), f"{f.name}-x"], f"{f.name}-x"  # str / object: method, graph


def _command_parser(ap, command: str):
    return ap._subparsers._group_actions[0].choices[command]


def _from(cls, a):
    return engine_config_from_args(a) if cls is EngineConfig else sampling_from_args(a)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_field_is_a_flag_and_lands_in_its_dataclass(command):
    unused, needed = COMMANDS[command]
    ap = build_parser(command)
    flags = _command_parser(ap, command)._option_string_actions
    for cls, f in FIELDS:
        argv, value = _other(cls, f)
        assert (flag(f.name) in flags) == (f.name not in unused), (command, f.name)
        if f.name in unused:
            continue
        got = getattr(_from(cls, ap.parse_args([command, *needed, *argv])), f.name)
        assert got == value != f.metadata.get("cli_default", f.default), (command, f.name, got)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_defaults_are_the_fields(command):
    """No flag restates a default: what a command builds with no flags is the dataclasses' defaults,
    but the `cli_default`s (the chat template on, seed 0) and the fields it has no flag for."""
    unused, needed = COMMANDS[command]
    a = build_parser(command).parse_args([command, *needed])
    for cls in (EngineConfig, SamplingParams):
        made = _from(cls, a)
        for f in dataclasses.fields(cls):
            want = f.default if f.name in unused else f.metadata.get("cli_default", f.default)
            assert getattr(made, f.name) == want, (command, f.name)


def test_every_field_has_its_help_once():
    for _cls, f in FIELDS:
        assert f.metadata.get("help"), f.name
    text = _command_parser(build_parser("generate"), "generate").format_help()
    assert "--max-waiting" in text and "--no-chat-template" in text and "-tp" in text


def test_decode_params_is_the_pair():
    """DecodeParams' fields are EngineConfig's then SamplingParams', with their types and defaults;
    split and join are inverse."""
    pair = [(f.name, f.type, f.default) for cls in (EngineConfig, SamplingParams) for f in dataclasses.fields(cls)]
    assert [(f.name, f.type, f.default) for f in dataclasses.fields(DecodeParams)] == pair
    p = DecodeParams(method="spiffy", max_num_seqs=3, max_waiting=1, stop=["x"], seed=4, temperature=0.5)
    config, sampling = p.split()
    assert (config.method, config.max_num_seqs, config.max_waiting) == ("spiffy", 3, 1)
    assert (sampling.stop, sampling.seed, sampling.temperature) == (["x"], 4, 0.5)
    assert DecodeParams.join(config, sampling) == p


def test_draft_fields_and_backends_are_one_list():
    from specfold.eval.sweeps import DRAFT_FIELDS
    from specfold.kernels.backends import BACKENDS
    assert DRAFT_FIELDS == draft_fields(EngineConfig)
    backend = next(f for f in dataclasses.fields(EngineConfig) if f.name == "backend")
    assert tuple(backend.metadata["choices"]) == tuple(BACKENDS)


def test_the_engine_flags_reach_the_engine_of_every_command():
    """`--max-waiting` (and the other scheduler fields) exist on every command that builds an engine."""
    for command, (unused, needed) in COMMANDS.items():
        a = build_parser(command).parse_args([command, *needed, "--max-waiting", "3", "--max-num-seqs", "2"])
        assert (engine_config_from_args(a).max_waiting, engine_config_from_args(a).max_num_seqs) == (3, 2), command


def test_generate_sampling_flags_reach_the_output(capsys):
    """`--logprobs N` adds each token's log-probabilities to `--json`; `--stop-token-ids` ends the
    answer at the first such token (the same run as the API's SamplingParams)."""
    import json

    from specfold.cli import main
    from specfold.models.loader import tiny_path
    if not (tiny_path() / "config.json").is_file():
        pytest.skip("the embedded tiny model is not trained yet")
    argv = ["generate", "--model", "tiny", "--prompt", "Tom has 3 apples.", "--max-new-tokens", "8", "--json",
            "--threads", "1"]
    assert main(argv + ["--logprobs", "2"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert len(row["logprobs"]) == len(row["token_ids"]) > 1
    assert all(str(t) in d and 2 <= len(d) <= 3 for t, d in zip(row["token_ids"], row["logprobs"]))
    assert main(argv + ["--stop-token-ids", str(row["token_ids"][0])]) == 0
    cut = json.loads(capsys.readouterr().out)
    assert cut["finish_reason"] == "stop" and len(cut["token_ids"]) <= 1 and "logprobs" not in cut
    assert cut["token_ids"] == row["token_ids"][:len(cut["token_ids"])]
