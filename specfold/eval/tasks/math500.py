"""MATH-500 (500 competition problems): zero-shot, final answer in `\\boxed{}`.

Data: `math500/test.jsonl` (fields `problem`, `answer`, `solution`, `subject`, `level`,
`unique_id`) inside a folder, or that file, or HF `HuggingFaceH4/MATH-500` (split test).
Scoring: `math_equiv.last_boxed(completion)` against `answer` with `math_equiv.is_equiv`.
"""
from __future__ import annotations

from typing import Any

from specfold.eval.math_equiv import is_equiv, last_boxed
from specfold.eval.tasks.base import Sample, Task, take

PROMPT = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."


class MATH500(Task):
    name = "math500"

    def load(self, data: str | None = None, limit: int | None = None) -> list[Sample]:
        recs = self.records(data, ["math500/test.jsonl", "test.jsonl"],
                            lambda ld: [dict(r) for r in ld("HuggingFaceH4/MATH-500", split="test")])
        samples = [
            Sample(id=r.get("unique_id", f"{self.name}/{i}"), prompt=PROMPT.format(problem=r["problem"]),
                   reference={"answer": r["answer"], "subject": r.get("subject"), "level": r.get("level")})
            for i, r in enumerate(recs)
        ]
        return take(samples, limit)

    def score(self, sample: Sample, completion: str) -> dict[str, Any]:
        pred = last_boxed(completion)
        return {"correct": is_equiv(pred, sample.reference["answer"]), "pred": pred,
                "target": sample.reference["answer"]}
