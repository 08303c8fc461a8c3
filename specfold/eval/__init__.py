"""Evaluation harness: benchmark tasks, their scorers, and the code sandbox.

Invariants:
- Nothing here imports the engine (specfold.api / models / decoding); tasks only turn data into
  prompts and completions into scores, so the harness is testable without a model.
- Model-written code is never executed in this process: it goes through `sandbox.run_program`,
  which runs it in a separate, resource-limited process.

Typical loop (the bench drives it):
    task = get_task("gsm8k")
    samples = task.load(data, limit)
    outs = llm.generate([s.prompt for s in samples], DecodeParams(chat_template=True, ...))
    scores = [task.score(s, o.text) for s, o in zip(samples, outs)]
    summary = task.aggregate(scores)
"""
from specfold.eval.tasks import TASKS, Sample, Task, get_task

__all__ = ["TASKS", "Sample", "Task", "get_task"]
