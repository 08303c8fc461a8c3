"""Tensor parallelism on the CPU (issue 40, "Must show"): `-tp 2` against one rank, side by side.

    python benchmarks/tensor_parallel.py [--model DIR] [--units 4] [--methods vanilla,spiffy]
        [--batches 1,16] [--max-new-tokens 64] [--device cpu] [--out benchmarks/results/tensor_parallel.json]
    python benchmarks/tensor_parallel.py --quick          # smoke run (writes runs/tensor_parallel_quick.json)
    python benchmarks/tensor_parallel.py --resume --units 6   # more units into the same JSON (same settings)

The model is the 0.5B-width cost proxy of the embedded model (`specfold widen --model tiny --preset
0.5b`, SPEC §9: hidden 896, FFN 4864, 18/2 heads, its 4 layers; kept under runs/ and reused), float32.
Three configurations, each in its own fresh process so thread settings are clean:
- `tp2`: `LLM(..., tensor_parallel_size=2)` at one thread per rank (torch.set_num_threads(2) before the
  LLM is built: each rank gets 2 // 2), rank 0 in the child process, rank 1 in its subprocess;
- `1r1t`: one rank, one thread;
- `1r2t`: one rank, two threads.
The three processes load and warm up one after another (every method at every batch size, untimed), then
stay up; the parent runs them unit by unit, the three configurations in a unit back to back (the order
rotated per unit: ABC, BCA, CAB, ...), so load on the shared machine hits them alike. A unit runs, for
each method: batch 1 (`--b1-prompts` chat prompts one at a time) and batch 16 (16 prompts submitted at
once to one `generate`), on the tiny model's held-out questions (each unit its own questions, the same
for the three configurations). Reported per (method, batch, configuration): tokens/s (wall clock) per
unit and their median and quartiles; per (method, batch): the ratios tp2 / 1r1t and tp2 / 1r2t as the
median (and quartiles) of the per-unit ratios.

Inside each timed generate, on rank 0 of every configuration (patched in the child process only):
- `reduce`: time inside `Parallel.reduce` (the two all-reduces per layer; this includes waiting for the
  slower rank, so it is the collectives' cost as rank 0 sees it, skew included);
- `send`: time inside `Leader.send` (the control broadcast of each step's jobs: pickle + two gloo
  broadcasts);
- `head`: time inside `Transformer.head` (final norm + the replicated LM head);
- `runner`: time inside `ModelRunner.run` (the step's model call on rank 0; its count is the steps);
each as a fraction of the item's wall time. Also the process CPU seconds of each rank, the load average
before and after each item, and each rank's parameter bytes (`parameter_bytes`: distinct storages) and
the bytes of the parameters' own elements, and each process's resident memory (VmRSS).

Writes one JSON (command, machine, date, commit, load averages, every item's raw numbers, the summary)
after every unit, so an interrupted run keeps what it measured, and `--resume` continues it (fresh
processes, warmed up again; each unit records its commit and load); prints a markdown table at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"tp2": dict(tp=2, threads=2), "1r1t": dict(tp=1, threads=1), "1r2t": dict(tp=1, threads=2)}
METHODS = {"vanilla": dict(method="vanilla"), "spiffy": dict(method="spiffy", draft_budget=2),
           "specfold": dict(method="specfold", draft_budget=2, delta=0.0)}
TAG = "@@TP@@ "


# ---------------------------------------------------------------------------------------------- child
def _cpu_of(pid: int) -> float:
    """utime + stime of a process, seconds (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def child(a: argparse.Namespace) -> int:
    """One configuration: load, warm up, then run each unit the parent asks for; JSON lines on stdout."""
    import torch
    cfg = CONFIGS[a.child]
    torch.set_num_threads(cfg["threads"])
    sys.path.insert(0, str(ROOT))
    from specfold import LLM, DecodeParams
    from specfold.engine.mirror import Leader
    from specfold.engine.runner import ModelRunner
    from specfold.models.parallel import Parallel, parameter_bytes
    from specfold.models.transformer import Transformer

    acc = {}

    def timed(cls, name, key):  # before the model is built: layers keep `par.reduce` bound at load
        orig = getattr(cls, name)

        def wrapper(*args, **kw):
            t = time.perf_counter()
            try:
                return orig(*args, **kw)
            finally:
                acc[key] = acc.get(key, 0.0) + time.perf_counter() - t
                acc[key + "_n"] = acc.get(key + "_n", 0) + 1
        setattr(cls, name, wrapper)
    timed(Parallel, "reduce", "reduce")
    timed(Leader, "send", "send")
    timed(Transformer, "head", "head")
    timed(ModelRunner, "run", "runner")

    t0 = time.perf_counter()
    llm = LLM(a.model, dtype="float32", device=a.device, tensor_parallel_size=cfg["tp"])
    load_s = time.perf_counter() - t0
    pids = {0: os.getpid()}
    if llm.ranks is not None:
        pids.update(llm.ranks.launcher.pids())
        pbytes = list(llm.ranks.param_bytes)
    else:
        pbytes = [parameter_bytes(llm.model)]
    elem0 = sum(p.numel() * p.element_size() for p in {id(p): p for p in llm.model.parameters()}.values())
    lines = (ROOT / "specfold/tiny/model/heldout.jsonl").read_text().splitlines()
    questions = [json.loads(x)["question"] for x in lines]
    params = {m: DecodeParams(chat_template=True, max_new_tokens=a.max_new_tokens, **METHODS[m])
              for m in a.methods.split(",")}
    batches = [int(b) for b in a.batches.split(",")]

    def prompts_for(unit: int, batch: int) -> list[list[str]]:
        qs = [questions[(unit * 16 + i) % len(questions)] for i in range(16)]
        return [[q] for q in qs[:a.b1_prompts]] if batch == 1 else [qs[:batch]]

    for m, p in params.items():  # untimed warm-up: every method at every batch size, a short answer
        for b in batches:
            for group in prompts_for(10_000, b)[:1]:
                llm.generate(group, p.replace(max_new_tokens=min(a.max_new_tokens, 16)))
    import specfold
    ready = dict(config=a.child, specfold=str(Path(specfold.__file__).parent), load_s=load_s, threads_rank0=torch.get_num_threads(), pids=pids,
                 param_bytes=pbytes, param_element_bytes_rank0=elem0, rss=[_rss(p) for p in pids.values()])
    print(TAG + json.dumps(ready), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("stop"):
            break
        unit, items = cmd["unit"], []
        for m, p in params.items():
            for b in batches:
                acc.clear()
                cpu0 = {r: _cpu_of(pid) for r, pid in pids.items()}
                la0 = os.getloadavg()
                t = time.perf_counter()
                toks, digests = 0, []
                for group in prompts_for(unit, b):
                    outs = llm.generate(group, p)
                    toks += sum(len(o.token_ids) for o in outs)
                    digests += [hash(tuple(o.token_ids)) for o in outs]
                wall = time.perf_counter() - t
                la1 = os.getloadavg()
                cpu = {r: _cpu_of(pid) - cpu0[r] for r, pid in pids.items()}
                items.append(dict(method=m, batch=b, requests=len(digests), tokens=toks, wall_s=wall,
                                  tps=toks / wall, cpu_s=[cpu[r] for r in sorted(cpu)], load_before=la0,
                                  load_after=la1, tokens_hash=hash(tuple(digests)),
                                  **{k: v for k, v in acc.items()}))
        print(TAG + json.dumps(dict(config=a.child, unit=unit, items=items,
                                    rss=[_rss(p) for p in pids.values()])), flush=True)
    llm.close()
    return 0


# --------------------------------------------------------------------------------------------- parent
class Proc:
    def __init__(self, name: str, a: argparse.Namespace, log):
        cfg = CONFIGS[name]
        env = dict(os.environ, OMP_NUM_THREADS=str(cfg["threads"]), MKL_NUM_THREADS=str(cfg["threads"]),
                   PYTHONPATH=str(ROOT), PYTHONHASHSEED="0")
        cmd = [sys.executable, __file__, "--child", name, "--model", a.model, "--methods", a.methods,
               "--batches", a.batches, "--max-new-tokens", str(a.max_new_tokens), "--b1-prompts",
               str(a.b1_prompts), "--device", a.device]
        self.name = name
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                  cwd=ROOT, env=env)

    def read(self) -> dict:
        for line in self.p.stdout:
            if line.startswith(TAG):
                return json.loads(line[len(TAG):])
        raise SystemExit(f"error: configuration {self.name} ended (exit {self.p.wait()}); see its log")

    def unit(self, u: int) -> dict:
        self.p.stdin.write(json.dumps({"unit": u}) + "\n")
        self.p.stdin.flush()
        return self.read()

    def stop(self) -> None:
        try:
            self.p.stdin.write(json.dumps({"stop": True}) + "\n")
            self.p.stdin.close()
            self.p.wait(60)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            self.p.kill()
            self.p.wait()


def quartiles(xs: list[float]) -> dict:
    xs = sorted(xs)
    if len(xs) == 1:
        return dict(median=xs[0], q1=xs[0], q3=xs[0], n=1)
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return dict(median=statistics.median(xs), q1=q[0], q3=q[2], n=len(xs))


def summarize(units: list[dict], ready: dict) -> dict:
    """Per (method, batch): each configuration's tokens/s and shares, and the per-unit ratios."""
    by = {}  # (method, batch) -> config -> [item per unit]
    for u in units:
        for name, res in u["results"].items():
            for it in res["items"]:
                by.setdefault((it["method"], it["batch"]), {}).setdefault(name, []).append((u["unit"], it))
    cells = []
    for (m, b), per in by.items():
        cell = dict(method=m, batch=b, configs={}, ratios={})
        for name, rows in per.items():
            its = [it for _, it in rows]
            wall = sum(it["wall_s"] for it in its)
            cell["configs"][name] = dict(
                tps=quartiles([it["tps"] for it in its]),
                tokens_per_cpu_s=sum(it["tokens"] for it in its) / sum(sum(it["cpu_s"]) for it in its),
                reduce_share=sum(it.get("reduce", 0.0) for it in its) / wall,
                send_share=sum(it.get("send", 0.0) for it in its) / wall,
                head_share=sum(it.get("head", 0.0) for it in its) / wall,
                runner_share=sum(it.get("runner", 0.0) for it in its) / wall,
                reduce_ms_per_call=1e3 * sum(it.get("reduce", 0.0) for it in its)
                / max(1, sum(it.get("reduce_n", 0) for it in its)),
                steps_per_unit=statistics.mean(it.get("runner_n", 0) for it in its))
        tp = dict(per.get("tp2", []))
        for ref in ("1r1t", "1r2t"):
            other = dict(per.get(ref, []))
            rs = [tp[u]["tps"] / other[u]["tps"] for u in tp if u in other]
            if rs:
                cell["ratios"][f"tp2/{ref}"] = quartiles(rs)
        same = [tp[u]["tokens_hash"] == dict(per.get("1r1t", []))[u]["tokens_hash"]
                for u in tp if u in dict(per.get("1r1t", []))]
        cell["tp2_tokens_equal_1r1t_units"] = f"{sum(same)}/{len(same)}"
        cells.append(cell)
    mem = {}
    if "tp2" in ready and "1r1t" in ready:
        full = ready["1r1t"]["param_bytes"][0]
        mem = dict(full_param_bytes=full, tp2_param_bytes=ready["tp2"]["param_bytes"],
                   tp2_ratio=[x / full for x in ready["tp2"]["param_bytes"]],
                   tp2_rank0_element_bytes=ready["tp2"]["param_element_bytes_rank0"],
                   tp2_rank0_element_ratio=ready["tp2"]["param_element_bytes_rank0"] / full,
                   rss_after_load={k: v["rss"] for k, v in ready.items()})
    aims = {}
    for c in cells:
        if c["method"] == "vanilla" and c["batch"] == 16 and c["ratios"]:
            aims = {"tp2/1r1t >= 1.5 at batch 16 (vanilla)": c["ratios"].get("tp2/1r1t", {}).get("median", 0) >= 1.5,
                    "tp2/1r2t >= 0.85 at batch 16 (vanilla)": c["ratios"].get("tp2/1r2t", {}).get("median", 0) >= 0.85}
    if mem:
        aims["each rank's parameter_bytes <= 0.55x the full model's"] = max(mem["tp2_ratio"]) <= 0.55
    return dict(cells=cells, memory=mem, aims=aims)


def table(summary: dict) -> str:
    names = list(CONFIGS)
    out = ["| method | batch | tok/s tp2 | tok/s 1r1t | tok/s 1r2t | tp2 / 1r1t | tp2 / 1r2t | tp2: all-reduce "
           "| tp2: control send | head (tp2 / 1r1t) | tokens tp2 = 1r1t |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    q = lambda d: f"{d['median']:.2f} ({d['q1']:.2f}-{d['q3']:.2f})"
    for c in summary["cells"]:
        cf = c["configs"]
        tps = [f"{cf[n]['tps']['median']:.1f}" if n in cf else "—" for n in names]
        r = [q(c["ratios"][k]) if k in c["ratios"] else "—" for k in ("tp2/1r1t", "tp2/1r2t")]
        tp = cf.get("tp2", {})
        head = (f"{100 * tp['head_share']:.1f} % / {100 * cf['1r1t']['head_share']:.1f} %"
                if tp and "1r1t" in cf else "—")
        out.append(f"| {c['method']} | {c['batch']} | " + " | ".join(tps + r) +
                   (f" | {100 * tp['reduce_share']:.1f} % | {100 * tp['send_share']:.1f} % | {head}" if tp else " | — | — | —")
                   + f" | {c['tp2_tokens_equal_1r1t_units']} |")
    return "\n".join(out)


def machine() -> dict:
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), platform.processor())
    import torch
    return dict(cpu=model, cores=os.cpu_count(), python=platform.python_version(), torch=torch.__version__,
                platform=platform.platform())


def widened(a: argparse.Namespace) -> str:
    if a.model:
        return a.model
    folder = ROOT / "runs" / "tensor_parallel" / "tiny-0.5b"
    if not (folder / "config.json").is_file():
        subprocess.run([sys.executable, "-m", "specfold", "widen", "--model", "tiny", "--preset", "0.5b",
                        "--out", str(folder)], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return str(folder)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="checkpoint folder (default: the 0.5B-width proxy under runs/)")
    ap.add_argument("--units", type=int, default=4)
    ap.add_argument("--methods", default="vanilla,spiffy", help=f"comma-separated, of {list(METHODS)}")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--b1-prompts", type=int, default=2, help="requests, one at a time, in a batch-1 item")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 units, vanilla, 16 new tokens")
    ap.add_argument("--out", default=None)
    ap.add_argument("--resume", action="store_true", help="continue the units of an earlier run of --out "
                                                          "(same settings) up to --units")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return child(a)
    if a.quick:
        a.units, a.methods, a.max_new_tokens, a.b1_prompts = 2, "vanilla", 16, 1
    out = Path(a.out or (ROOT / ("runs/tensor_parallel_quick.json" if a.quick
                                 else "benchmarks/results/tensor_parallel.json")))
    a.model = widened(a)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip())
    cmd = "python benchmarks/tensor_parallel.py " + " ".join(argv if argv is not None else sys.argv[1:])
    started = datetime.now(timezone.utc)
    record = dict(command=cmd.strip(), machine=machine(), started=started.isoformat(timespec="seconds"),
                  commit=commit, tree_dirty=dirty, load_start=os.getloadavg(),
                  settings=dict(model=a.model, units=a.units, methods=a.methods, batches=a.batches,
                                b1_prompts=a.b1_prompts, max_new_tokens=a.max_new_tokens, dtype="float32",
                                device=a.device, configs={n: CONFIGS[n] for n in a.configs.split(",")},
                                method_params={m: METHODS[m] for m in a.methods.split(",")}),
                  ready={}, units=[], sessions=[])
    if a.resume and out.is_file():
        old = json.loads(out.read_text())
        same = lambda d: {k: v for k, v in d.items() if k != "units"}
        if same(old["settings"]) != same(record["settings"]):
            raise SystemExit(f"error: {out} was run with other settings ({old['settings']}); pass another --out")
        record = dict(old, sessions=old.get("sessions", []), settings=record["settings"])
        record["command"] = cmd.strip()
    session = dict(started=started.isoformat(timespec="seconds"), commit=commit, tree_dirty=dirty,
                   load_start=os.getloadavg(), first_unit=len(record["units"]))
    record["sessions"].append(session)
    out.parent.mkdir(parents=True, exist_ok=True)
    log_path = ROOT / "runs" / f"{out.stem}.log"  # the children's stderr
    log_path.parent.mkdir(parents=True, exist_ok=True)
    names = a.configs.split(",")
    procs = {}
    with open(log_path, "a" if a.resume else "w") as log:
        try:
            for n in names:  # one at a time: loading and warm-up do not overlap
                procs[n] = Proc(n, a, log)
                record["ready"][n] = procs[n].read()
                print(f"{n}: ready ({record['ready'][n]['load_s']:.1f} s to load; parameter bytes "
                      f"{record['ready'][n]['param_bytes']})", file=sys.stderr, flush=True)
            for u in range(len(record["units"]), a.units):
                order = names[u % len(names):] + names[:u % len(names)]
                unit = dict(unit=u, order=order, commit=commit, started=datetime.now(timezone.utc).isoformat(
                    timespec="seconds"), load_before=os.getloadavg(), results={})
                for n in order:
                    unit["results"][n] = procs[n].unit(u)
                unit["load_after"] = os.getloadavg()
                record["units"].append(unit)
                record["summary"] = summarize(record["units"], record["ready"])
                out.write_text(json.dumps(record, indent=1))
                brief = {n: {f"{it['method']}/b{it['batch']}": round(it["tps"], 1) for it in r["items"]}
                         for n, r in unit["results"].items()}
                print(f"unit {u + 1}/{a.units} (load {unit['load_after'][0]:.1f}): {brief}", file=sys.stderr, flush=True)
        finally:
            for p in procs.values():
                p.stop()
    record["finished"] = session["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    session["seconds"] = (datetime.now(timezone.utc) - started).total_seconds()
    record["seconds"] = sum(x.get("seconds", 0.0) for x in record["sessions"])
    record["load_end"] = session["load_end"] = os.getloadavg()
    record["summary"] = summarize(record["units"], record["ready"])
    record["table"] = table(record["summary"])
    out.write_text(json.dumps(record, indent=1))
    print(record["table"])
    print(json.dumps(record["summary"]["memory"], indent=1))
    print(json.dumps(record["summary"]["aims"], indent=1))
    print(f"wrote {out} ({session['seconds']:.0f} s this session, load {session['load_start']} -> "
          f"{session['load_end']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
