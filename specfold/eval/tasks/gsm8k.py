"""GSM8K (test split, 1319 problems): zero-shot chain of thought, final number after `####`.

Data: `gsm8k/test.jsonl` (fields `question`, `answer` ending in `#### n`) inside a folder, or
that file itself, or HF `openai/gsm8k` (config main, split test) when `datasets` is installed.
Scoring: `numeric.extract_number` on completion and reference, exact numeric comparison.
"""
from __future__ import annotations

from typing import Any

from specfold.eval.numeric import extract_number, format_number, numbers_equal
from specfold.eval.tasks.base import DataError, Sample, Task, take

PROMPT = (
    "Solve the following math problem step by step. The last line of your response should be "
    'of the form "#### ANSWER" where ANSWER is the final number.\n\n{question}'
)


def qa_samples(records: list[dict[str, Any]], prefix: str, template: str) -> list[Sample]:
    """Samples from question/answer records (GSM8K format)."""
    out = []
    for i, r in enumerate(records):
        if "question" not in r or "answer" not in r:
            raise DataError(f"{prefix}: record {i} lacks 'question'/'answer'")
        ref = extract_number(r["answer"])
        out.append(Sample(id=f"{prefix}/{i}", prompt=template.format(question=r["question"]),
                          reference={"answer": format_number(ref), "solution": r["answer"]}))
    return out


def score_number(sample: Sample, completion: str) -> dict[str, Any]:
    """Numeric final-answer score shared by GSM8K and the tiny task."""
    pred = extract_number(completion)
    ref = extract_number(sample.reference["solution"])
    return {"correct": numbers_equal(pred, ref), "pred": format_number(pred),
            "target": format_number(ref)}


class GSM8K(Task):
    name = "gsm8k"

    def load(self, data: str | None = None, limit: int | None = None) -> list[Sample]:
        recs = self.records(data, ["gsm8k/test.jsonl", "test.jsonl"],
                            lambda ld: [dict(r) for r in ld("openai/gsm8k", "main", split="test")])
        return take(qa_samples(recs, self.name, PROMPT), limit)

    def score(self, sample: Sample, completion: str) -> dict[str, Any]:
        return score_number(sample, completion)
