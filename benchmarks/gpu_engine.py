"""The engine on a device (issue 19): output tokens/s at batch 1, 16 and 64, and host syncs per step.

    python benchmarks/gpu_engine.py --model DIR [--model DIR ...] [--device cuda] [--methods ...]
        [--batches 1,16,64] [--max-new-tokens 64] [--out runs/gpu/gpu_engine.md]

Syncs are counted with `torch.cuda.set_sync_debug_mode("warn")`: every operation that makes the
host wait for the GPU warns once, and the warnings of each `Engine.step()` are counted (on the CPU,
where nothing syncs, the column reads "-"). Expected: 1 per step for vanilla, FreeDave and Spiffy
(the runner's one read of every job's scores), L + 2 for SpecFold (its fold gate).
`--cuda-graphs off,on` (default on CUDA; "off" elsewhere): each configuration with
EngineConfig(cuda_graphs=...). Every engine first decodes the same prompts once (warm-up: cost
model calibration, and with graphs on the capture of each bucket's graph, which syncs); the
measured pass follows on the same engine, and its new captures are counted (a capture syncs).
`--static` adds static_shapes=True rows without graphs (the padding alone).
Prompts: random token ids of the widened tiny model (a random-weight proxy: speed only).
"""
from __future__ import annotations

import argparse
import random
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specfold import LLM, EngineConfig, SamplingParams  # noqa: E402


def prompts(llm: LLM, n: int, length: int = 24) -> list[list[int]]:
    rng = random.Random(0)
    bad = {llm.spec.mask_token_id, *llm.spec.stop_token_ids}
    ok = [t for t in range(min(llm.spec.vocab_size, 4096)) if t not in bad]
    return [[rng.choice(ok) for _ in range(length)] for _ in range(n)]


def run(llm: LLM, method: str, batch: int, max_new: int, cuda: bool, mode: str) -> dict:
    cfg = EngineConfig(method=method, max_num_seqs=batch, cuda_graphs=mode == "graphs",
                       static_shapes=mode != "eager")
    eng = llm.engine(cfg)
    out = None
    for _ in range(2):  # warm-up, then the measured pass on the same engine (its graphs captured)
        st = eng.runner.static
        before = st.captures if st is not None else 0
        out = one_pass(eng, llm, batch, max_new, cuda)
        out["captures"] = (st.captures - before) if st is not None else 0
        out["buckets"] = len(st.buckets) if st is not None else 0
        out["padded"] = (st.rows[1] / max(st.rows[0], 1)) if st is not None else 1.0
    return out


def one_pass(eng, llm: LLM, batch: int, max_new: int, cuda: bool) -> dict:
    sp = SamplingParams(max_new_tokens=max_new, stop_token_ids=[])
    for ids in prompts(llm, batch):
        eng.add_request(ids, sp)
    steps, syncs, toks = 0, [], 0
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    while eng.has_unfinished():
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            if cuda:
                torch.cuda.set_sync_debug_mode("warn")
            for d in eng.step():
                toks += len(d.new_token_ids)
            if cuda:
                torch.cuda.set_sync_debug_mode("default")
        syncs.append(sum(1 for x in w if "synchroniz" in str(x.message)))
        steps += 1
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return {"tokens_s": toks / wall, "steps": steps, "syncs_max": max(syncs) if cuda else None,
            "syncs_mean": sum(syncs) / len(syncs) if cuda else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--methods", default="vanilla,freedave,spiffy,specfold")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--cuda-graphs", default=None, help="off,on (default on CUDA; off elsewhere)")
    ap.add_argument("--static", action="store_true", help="also static_shapes=True without graphs")
    ap.add_argument("--out", default="runs/gpu/gpu_engine.md")
    a = ap.parse_args()
    cuda = a.device.startswith("cuda")
    dtype = a.dtype or ("bfloat16" if cuda else "float32")
    name = torch.cuda.get_device_name() if cuda else "cpu"
    graphs = (a.cuda_graphs or ("off,on" if cuda else "off")).split(",")
    modes = [{"off": "eager", "on": "graphs"}[g] for g in graphs]
    if a.static:
        modes.insert(1, "static")
    lines = [f"# Engine on {name} ({dtype})", "",
             "| model | method | batch | mode | tokens/s | steps | syncs/step max | mean | captures (measured pass) "
             "| buckets | computed / asked rows |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in a.model:
        llm = LLM(m, dtype=dtype, device=a.device)
        for method in a.methods.split(","):
            for b in (int(x) for x in a.batches.split(",")):
                for mode in modes:
                    r = run(llm, method, b, a.max_new_tokens, cuda, mode)
                    s = "- | -" if r["syncs_max"] is None else f"{r['syncs_max']} | {r['syncs_mean']:.2f}"
                    lines.append(f"| {Path(m).name} | {method} | {b} | {mode} | {r['tokens_s']:.1f} | {r['steps']} | "
                                 f"{s} | {r['captures']} | {r['buckets']} | {r['padded']:.2f} |")
                    print(lines[-1], flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
