"""The tiny model's own arithmetic task: held-out problems in GSM8K format.

Data: any JSON Lines file with `question` and `answer` (ending in `#### n`); with data=None the
packaged `specfold/tiny/model/heldout.jsonl` (written by the tiny-model part) is used.
Prompt: the question verbatim (the tiny model is trained on bare questions through its chat
template, so no instruction text is added). Scoring: same as GSM8K (final number, numeric).

`tiny_fresh`: the same task on problems generated at load (`specfold.tiny.fresh.fresh(0, n)`: a
stream no split of the shipped model uses, minus every held-out, training, tokenizer and calibration
question by text); `limit` = n (200 without one); `data` is not read. Other seeds: write a file
with `python -m specfold.tiny.fresh --seed S --n N --out F` and run `tiny` with `--data F`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from specfold.eval.tasks.base import DataError, Sample, Task, find_file, read_records, take
from specfold.eval.tasks.gsm8k import qa_samples, score_number

PACKAGED = Path(__file__).resolve().parents[2] / "tiny" / "model" / "heldout.jsonl"


class Tiny(Task):
    name = "tiny"

    def load(self, data: str | None = None, limit: int | None = None) -> list[Sample]:
        path = find_file(self.name, data, ["heldout.jsonl", "tiny/heldout.jsonl"])
        if path is None:
            if not PACKAGED.is_file():
                raise DataError(f"tiny: packaged held-out set {PACKAGED} not found; pass --data")
            path = PACKAGED
        return take(qa_samples(read_records(path), self.name, "{question}"), limit)

    def score(self, sample: Sample, completion: str) -> dict[str, Any]:
        return score_number(sample, completion)


class TinyFresh(Tiny):
    name = "tiny_fresh"
    default_size = 200

    def load(self, data: str | None = None, limit: int | None = None) -> list[Sample]:
        from specfold.tiny.fresh import fresh
        return qa_samples(fresh(0, self.default_size if limit is None else limit), self.name, "{question}")
