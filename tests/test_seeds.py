"""One rule for seeds in the API, the CLI and the server: an integer in [0, 2**63), or none at all
(the API and the server then draw one); anything else gets the same one-line message everywhere."""
from __future__ import annotations

import pytest

from specfold.cli import main
from specfold.errors import ParamsError
from specfold.params import DecodeParams, SamplingParams, seed_error

BAD = [-1, -(2**70), 2**63, 2**64, True, 1.0, "7"]
GOOD = [0, 1, 2**63 - 1]


def message(seed) -> str:
    return f"seed must be an integer in [0, 2**63), got {seed!r}"


@pytest.mark.parametrize("seed", BAD)
def test_api_refuses(seed):
    assert seed_error(seed) == message(seed)
    with pytest.raises(ParamsError) as e:
        SamplingParams(seed=seed)
    assert str(e.value) == message(seed)
    with pytest.raises(ParamsError) as e:
        DecodeParams(seed=seed)
    assert str(e.value) == message(seed)


@pytest.mark.parametrize("seed", GOOD + [None])
def test_api_accepts(seed):
    assert SamplingParams(seed=seed).seed == seed


@pytest.mark.parametrize("seed", ["-1", str(2**63)])
def test_cli_refuses_with_the_same_line(capsys, seed):
    with pytest.raises(SystemExit) as e:  # refused while the flags are parsed, naming the flag
        main(["generate", "--prompt", "hi", "--seed", seed])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err == (f"specfold generate: error: argument --seed: {message(int(seed))} "
                                         f"(see specfold generate --help)")


@pytest.mark.parametrize("seed", BAD)
def test_server_refuses_with_the_same_line(seed):
    from specfold.serve.protocol import ApiError, parse_request
    body = {"model": "tiny", "prompt": "hi", "seed": seed}
    with pytest.raises(ApiError) as e:
        parse_request(body, chat=False)
    assert (e.value.status, e.value.param, e.value.message) == (400, "seed", message(seed))


@pytest.mark.parametrize("seed", GOOD)
def test_server_accepts(seed):
    from specfold.serve.protocol import parse_request
    assert parse_request({"model": "tiny", "prompt": "hi", "seed": seed}, chat=False).seed == seed
