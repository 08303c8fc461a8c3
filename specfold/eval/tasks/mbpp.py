"""MBPP pass@1: `mbpp` = sanitized test split (257), `mbpp_full` = full test split (500).

Data: `mbpp/sanitized-mbpp.json` (fields `prompt`, `code`, `task_id`, `test_imports`,
`test_list`) and `mbpp/mbpp.jsonl` (fields `text`, `code`, `task_id`, `test_setup_code`,
`test_list`) inside a folder, or the file itself; HF `google-research-datasets/mbpp` (configs
sanitized / full) when `datasets` is installed. The test split is task_id 11..510 in both.
Program run in the sandbox: test imports, the extracted code, test setup code, the asserts, each
of the form `f(args) == expected` (all of them in both splits) turned into a report judged by the
harness (verdict.py), so the expected values never enter the sandbox.
"""
from __future__ import annotations

import re
from typing import Any

from specfold.eval.code_extract import extract_code
from specfold.eval.sandbox import Limits, isolation
from specfold.eval.tasks.base import DataError, Sample, Task, take
from specfold.eval.tasks.humaneval import run_verdict
from specfold.eval.verdict import Plan, plan_test

TEST_IDS = range(11, 511)
PROMPT = (
    "{text}\nYour code should pass these tests:\n\n{tests}\n\n"
    "Write the complete Python solution in a ```python code block."
)


def entry_point(code: str, tests: list[str]) -> str | None:
    """The reference function that the tests call (first def named in the asserts)."""
    names = re.findall(r"^def\s+(\w+)\s*\(", code, re.M)
    joined = "\n".join(tests)
    for n in names:
        if re.search(rf"\b{re.escape(n)}\s*\(", joined):
            return n
    return names[0] if names else None


def build_program(completion: str, ref: dict[str, Any]) -> tuple[str, Plan]:
    """The full program executed for one MBPP completion, and the checks judged outside."""
    code = extract_code(completion, ref.get("entry_point"))
    plan = plan_test("\n".join(ref["test_list"]))
    parts = ["\n".join(ref["test_imports"]), code, ref["test_setup_code"], plan.source]
    return "\n\n".join(p for p in parts if p) + "\n", plan


class MBPP(Task):
    name = "mbpp"
    hf_config = "sanitized"
    candidates = ["mbpp/sanitized-mbpp.json", "sanitized-mbpp.json"]

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits(timeout_s=10.0)

    def load(self, data: str | None = None, limit: int | None = None) -> list[Sample]:
        isolation()  # no OS sandbox here: fail now (one line), before any generation
        recs = self.records(data, self.candidates, lambda ld: [dict(r) for r in ld(
            "google-research-datasets/mbpp", self.hf_config, split="test")])
        samples = []
        for r in recs:
            if "task_id" not in r or "test_list" not in r:
                raise DataError(f"{self.name}: record lacks task_id/test_list: {list(r)}")
            if r["task_id"] not in TEST_IDS:
                continue
            text = r.get("prompt", r.get("text"))
            tests = list(r["test_list"])
            ref = {"code": r["code"], "test_list": tests, "test_imports": list(r.get("test_imports") or []),
                   "test_setup_code": r.get("test_setup_code") or "",
                   "entry_point": entry_point(r["code"], tests)}
            samples.append(Sample(id=f"mbpp/{r['task_id']}",
                                  prompt=PROMPT.format(text=text, tests="\n".join(tests)), reference=ref))
        samples.sort(key=lambda s: int(s.id.split("/")[1]))
        return take(samples, limit)

    def score(self, sample: Sample, completion: str) -> dict[str, Any]:
        return run_verdict(*build_program(completion, sample.reference), self.limits)


class MBPPFull(MBPP):
    name = "mbpp_full"
    hf_config = "full"
    candidates = ["mbpp/mbpp.jsonl", "mbpp.jsonl"]
