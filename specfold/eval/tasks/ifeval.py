"""IFEval (541 prompts): prompt-level and instruction-level, strict and loose accuracy.

Data: `ifeval/input_data.jsonl` (fields `key`, `prompt`, `instruction_id_list`, `kwargs`) inside a
folder, or that file, or HF `google/IFEval` (split train). The prompt is used verbatim.
Per-sample score: `correct` (= prompt-level strict), `prompt_strict`, `prompt_loose`, and the
per-instruction lists `inst_strict`, `inst_loose`. `aggregate` gives the four official metrics.
"""
from __future__ import annotations

from typing import Any

from specfold.eval.instructions import CHECKERS, follows
from specfold.eval.tasks.base import DataError, Sample, Task, take


class IFEval(Task):
    name = "ifeval"

    def load(self, data: str | None = None, limit: int | None = None) -> list[Sample]:
        recs = self.records(data, ["ifeval/input_data.jsonl", "input_data.jsonl"],
                            lambda ld: [dict(r) for r in ld("google/IFEval", split="train")])
        samples = []
        for r in recs:
            ids, kws = list(r["instruction_id_list"]), [dict(k) for k in r["kwargs"]]
            unknown = [i for i in ids if i not in CHECKERS]
            if unknown or len(ids) != len(kws):
                raise DataError(f"ifeval: key {r.get('key')}: unknown ids {unknown} or kwargs mismatch")
            samples.append(Sample(id=f"ifeval/{r['key']}", prompt=r["prompt"],
                                  reference={"instruction_id_list": ids, "kwargs": kws}))
        return take(samples, limit)

    def score(self, sample: Sample, completion: str) -> dict[str, Any]:
        strict, loose = follows(completion, sample.reference["instruction_id_list"], sample.reference["kwargs"])
        return {"correct": all(strict), "prompt_strict": all(strict), "prompt_loose": all(loose),
                "inst_strict": strict, "inst_loose": loose}

    def aggregate(self, scores: list[dict[str, Any]]) -> dict[str, float]:
        n = len(scores)
        inst_s = [v for s in scores for v in s["inst_strict"]]
        inst_l = [v for s in scores for v in s["inst_loose"]]
        mean = lambda xs: sum(map(bool, xs)) / len(xs) if xs else 0.0  # noqa: E731
        return {"accuracy": mean([s["prompt_strict"] for s in scores]) if n else 0.0,
                "prompt_strict": mean([s["prompt_strict"] for s in scores]),
                "prompt_loose": mean([s["prompt_loose"] for s in scores]),
                "inst_strict": mean(inst_s), "inst_loose": mean(inst_l)}
