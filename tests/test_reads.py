"""Device-to-host reads per engine step, counted (issue: one read per step).

Every way a tensor's values reach Python is patched and counted while `Engine.step()` runs: `item`,
`tolist`, `numpy`, `__bool__`, `__int__`, `__float__`, `__index__`, and copies to the CPU (`cpu`, `to`).
On the tiny model with 8 concurrent requests a step of vanilla, FreeDave or Spiffy reads at most 2
times (the runner's one read of every job's scores, plus at most one elsewhere); SpecFold at most
L + 3 (its fold gate syncs once per layer, plus once on the embeddings); and the count does not grow
with the batch: 1 request reads as often per step as 8. The same bounds hold with static shapes.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specfold import EngineConfig, SamplingParams

pytestmark = pytest.mark.slow  # host reads counted over whole decodes

TINY = Path(__file__).resolve().parents[1] / "specfold" / "tiny" / "model"
NAMES = ("item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__")


class ReadCounter:
    def __init__(self):
        self.n = 0
        self.on = False

    def install(self, monkeypatch) -> None:
        for name in NAMES:
            monkeypatch.setattr(torch.Tensor, name, self._wrap(getattr(torch.Tensor, name)))
        cpu, to = torch.Tensor.cpu, torch.Tensor.to

        def counted_cpu(t, *a, **k):
            self._hit()
            return cpu(t, *a, **k)

        def counted_to(t, *a, **k):
            dev = k.get("device", a[0] if a else None)
            if isinstance(dev, (str, torch.device)) and torch.device(dev).type == "cpu":
                self._hit()
            return to(t, *a, **k)
        monkeypatch.setattr(torch.Tensor, "cpu", counted_cpu)
        monkeypatch.setattr(torch.Tensor, "to", counted_to)

    def _hit(self) -> None:
        if self.on:
            self.n += 1

    def _wrap(self, orig):
        def counted(t, *a, **k):
            self._hit()
            return orig(t, *a, **k)
        return counted


def _prompts(n: int) -> list[str]:
    rows = [json.loads(x) for x in (TINY / "heldout.jsonl").read_text().splitlines()[:n]]
    return [r["question"] for r in rows]


def _max_reads(llm, config: EngineConfig, prompts: list[str], counter: ReadCounter,
               params: SamplingParams | None = None) -> tuple[int, int]:
    eng = llm.engine(config)
    for pr in prompts:
        eng.add_request(llm.encode(pr, SamplingParams(chat_template=True)), params or SamplingParams(max_new_tokens=32))
    worst, steps = 0, 0
    while eng.has_unfinished():
        counter.n, counter.on = 0, True
        eng.step()
        counter.on = False
        worst, steps = max(worst, counter.n), steps + 1
    return worst, steps


@pytest.fixture(scope="module")
def llm(tiny_llm):
    return tiny_llm


CASES = [(m, r) for m in ("vanilla", "freedave", "spiffy", "specfold") for r in (None, "static")]


@pytest.mark.parametrize("method,rule", CASES)
def test_reads_per_step(llm, monkeypatch, method, rule):
    """Every draft verified (a fixed budget): the same reads per step at batch 1 and 8. With auto
    budgets (the chooser reads host counts and host timings only) the bound holds as well; whether a
    step verifies drafts at all is then the chooser's, so only the bound is compared."""
    counter = ReadCounter()
    counter.install(monkeypatch)
    bound = 2 if method != "specfold" else llm.spec.num_layers + 3
    config = EngineConfig(method=method, rule=rule, max_num_seqs=8, draft_budget=64)
    many, steps = _max_reads(llm, config, _prompts(8), counter)
    one, _ = _max_reads(llm, config, _prompts(1), counter)
    assert steps > 3
    assert 1 <= many <= bound, (method, rule, many)
    assert one == many, (method, rule, one, many)
    auto = config.replace(draft_budget="auto")
    for n in (1, 8):
        worst, _ = _max_reads(llm, auto, _prompts(n), counter)
        assert 1 <= worst <= bound, (method, rule, n, worst)


@pytest.mark.parametrize("method", ["vanilla", "spiffy", "specfold"])
def test_logprobs_ride_in_the_same_read(llm, monkeypatch, method):
    """Requests asking for logprobs (and sampling) read no more often: their numbers are columns of
    the step's one read."""
    counter = ReadCounter()
    counter.install(monkeypatch)
    bound = 2 if method != "specfold" else llm.spec.num_layers + 3
    config = EngineConfig(method=method, rule="static", max_num_seqs=8, draft_budget=64)
    sp = SamplingParams(max_new_tokens=32, logprobs=5, temperature=0.7, seed=1)
    many, _ = _max_reads(llm, config, _prompts(8), counter, sp)
    one, _ = _max_reads(llm, config, _prompts(1), counter, sp)
    assert 1 <= many <= bound and one == many, (method, one, many)


def test_the_counter_counts(llm, monkeypatch):
    """Teeth: a read in a step is seen (a program that reads a tensor would be caught)."""
    counter = ReadCounter()
    counter.install(monkeypatch)
    counter.on = True
    x = torch.ones(3)
    x.tolist(), x.sum().item(), bool(x[0]), int(x[1]), float(x[2]), x.cpu()
    assert counter.n == 6


class UploadCounter:
    """Host data that becomes a tensor inside a step (`torch.tensor` / `as_tensor` of Python data):
    each one is a host-to-device copy when the model is on an accelerator."""

    def __init__(self):
        self.n, self.on = 0, False

    def install(self, monkeypatch) -> None:
        for name in ("tensor", "as_tensor"):
            monkeypatch.setattr(torch, name, self._wrap(getattr(torch, name)))

    def _wrap(self, orig):
        def counted(data, *a, **k):
            if self.on and not isinstance(data, torch.Tensor):
                self.n += 1
            return orig(data, *a, **k)
        return counted


@pytest.mark.parametrize("method,bound", [("vanilla", 1), ("freedave", 1), ("spiffy", 1), ("specfold", 2)])
def test_one_upload_per_step(llm, monkeypatch, method, bound):
    """The step's index data goes to the device in one copy (the runner's), plus one per folded
    verification batch (its plan's rows and ancestors, in one buffer); 1 request as 8."""
    counter = UploadCounter()
    counter.install(monkeypatch)
    config = EngineConfig(method=method, rule="static", max_num_seqs=8, draft_budget=64)
    many, _ = _max_reads(llm, config, _prompts(8), counter)
    one, _ = _max_reads(llm, config, _prompts(1), counter)
    assert 1 <= many <= bound and one == many, (method, one, many)


@pytest.mark.parametrize("method", ["vanilla", "freedave", "spiffy", "specfold"])
def test_static_shapes_reads_and_uploads(llm, monkeypatch, method):
    """With static shapes (a pooled KV cache, steps padded to buckets: engine/graphs.py) the bounds
    hold as they are: the buckets come from host data only and their integers ride in the runner's
    one copy. The worst step of each run is compared, 1 request as 8."""
    bound = 2 if method != "specfold" else llm.spec.num_layers + 3
    uploads = 1 if method != "specfold" else 2
    reads, ups = ReadCounter(), UploadCounter()
    reads.install(monkeypatch)
    ups.install(monkeypatch)
    worst = {}
    for n in (8, 1):
        worst[n] = {"reads": 0, "uploads": 0}
        eng = llm.engine(EngineConfig(method=method, max_num_seqs=8, draft_budget=64, static_shapes=True))
        for pr in _prompts(n):
            eng.add_request(llm.encode(pr, SamplingParams(chat_template=True)), SamplingParams(max_new_tokens=32))
        while eng.has_unfinished():
            reads.n = ups.n = 0
            reads.on = ups.on = True
            eng.step()
            reads.on = ups.on = False
            worst[n]["reads"] = max(worst[n]["reads"], reads.n)
            worst[n]["uploads"] = max(worst[n]["uploads"], ups.n)
        assert eng.runner.static.forwards > 0
    assert 1 <= worst[8]["reads"] <= bound and 1 <= worst[8]["uploads"] <= uploads, (method, worst)
    assert worst[1] == worst[8], (method, worst)
