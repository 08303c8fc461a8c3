"""`train-tiny`'s settings: one `TrainConfig` whose defaults the command line reads, checked before
any work."""
import argparse
import dataclasses

import pytest

from specfold.tiny.train import DEFAULT_STEPS, TrainConfig, add_arguments


def test_command_line_defaults_are_the_configs():
    p = argparse.ArgumentParser()
    add_arguments(p)
    a = p.parse_args(["--out", "x"])
    flags = {"autocast": "bf16"}  # field -> flag, where the names differ
    for f in dataclasses.fields(TrainConfig):
        if f.name in ("out", "steps", "log_every"):  # required / DEFAULT_STEPS below / not a flag
            continue
        assert getattr(a, flags.get(f.name, f.name)) == f.default, f.name
    assert a.steps is None and DEFAULT_STEPS > 0


@pytest.mark.parametrize("bad,message", [(dict(size="huge"), "unknown model size 'huge'"),
                                         (dict(task="nope"), "unknown tiny task 'nope'")])
def test_bad_settings_are_refused_before_any_work(tmp_path, bad, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(str(tmp_path / "run"), **bad)
    assert not (tmp_path / "run").exists()


def test_micro_overrides_the_size():
    assert TrainConfig("x", micro=True, size="large").model_size == "micro"
    assert TrainConfig("x").model_size == "base"
