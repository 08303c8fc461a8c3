"""A paired check of one engine cell on two source trees: vanilla, `tiny`, 16 concurrent requests,
the best of 4 `LLM.generate` calls per process (process CPU clock, one thread), and the time inside
`Transformer.forward_many`. Run it once per tree, alternating, and compare the best CPU seconds:

    for i in 1 2 3; do for t in /path/old /path/new; do
        (cd $t && OMP_NUM_THREADS=1 PYTHONPATH= taskset -c 1 python /path/new/benchmarks/engine_pair.py $t); done; done

Prints one JSON line: {"cpu": best seconds of one generate call, "inside": its seconds in the forwards}.
"""
from __future__ import annotations

import json
import sys
import time


def main(tree: str, rule: str | None = None) -> None:
    sys.path.insert(0, tree)
    import torch
    torch.set_num_threads(1)
    from specfold import LLM, EngineConfig, SamplingParams
    from specfold.models.transformer import Transformer
    inside = [0.0]
    forward_many = Transformer.forward_many

    def timed(*a, **k):
        t0 = time.process_time()
        try:
            return forward_many(*a, **k)
        finally:
            inside[0] += time.process_time() - t0
    Transformer.forward_many = timed
    llm = LLM("tiny", dtype="float32")
    with open(f"{tree}/specfold/tiny/model/heldout.jsonl") as f:
        qs = [json.loads(x)["question"] for x in f][:16]
    sp = SamplingParams(max_new_tokens=64, chat_template=True)
    llm._engine = llm.engine(EngineConfig(method="vanilla", rule=rule, max_num_seqs=16))
    llm.generate(qs[:2], sp)  # warm up
    best = None
    for _ in range(4):
        inside[0] = 0.0
        c0 = time.process_time()
        llm.generate(qs, sp)
        c = time.process_time() - c0
        if best is None or c < best[0]:
            best = (c, inside[0])
    print(json.dumps({"cpu": best[0], "inside": best[1]}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
