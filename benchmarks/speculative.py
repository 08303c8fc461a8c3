"""Speculative decoding side by side (SPEC §5, issue 4), one run, one CPU thread by default.

    python benchmarks/speculative.py [--model tiny|DIR] [--n 40] [--max-new-tokens 128] [--threads 1]

Pairs, each speculative method against its vanilla baseline on the same prompts:
- vanilla static k=1  vs  FreeDave depth 8 (and eager): tokens per forward ratio (aim >= 2.5x);
- vanilla threshold 0.9  vs  Spiffy B=7: forward-pass ratio (aim <= 0.7x); FreeDave++ depth 8 too.
Also tokens/s of each vs its vanilla, where the time goes (model forwards / drafting / the rest), and
the sequence-level token match rate with vanilla in float32 and bfloat16 (float64 is tested exact).

Prompts: the tiny model's held-out set (`specfold/tiny/model/heldout.jsonl`, chat template) when the
model exists; otherwise a random Qwen2-shaped checkpoint (peaked head) with random prompts, which
only shows that the machinery runs. Spiffy's graph: `--graph`, else the shipped default for the model,
else calibrated here on `--calib` prompts disjoint from the evaluated ones.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specfold import LLM, DecodeParams  # noqa: E402
from specfold.decoding.drafts.calibrate import calibrate  # noqa: E402
from specfold.decoding.drafts.graph import GraphError  # noqa: E402

TINY = ROOT / "specfold" / "tiny" / "model"


def random_checkpoint(folder: Path) -> Path:
    import transformers as tf
    torch.manual_seed(0)
    cfg = tf.Qwen2Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=False)
    m = tf.Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        m.lm_head.weight.mul_(40.0)
    m.save_pretrained(folder, safe_serialization=True)
    c = json.loads((folder / "config.json").read_text())
    c.update(mask_token_id=511, block_size=16, sub_block_size=8, stop_token_ids=[510], logits_shift=False,
             attention="block_causal", rule="threshold", threshold=0.9)
    (folder / "config.json").write_text(json.dumps(c))
    return folder


def load_prompts(args, folder: Path | None) -> tuple[list, list]:
    if folder is not None:
        rows = [json.loads(x) for x in (folder / "heldout.jsonl").read_text().splitlines() if x.strip()]
        evals = [r["question"] for r in rows[: args.n]]
        try:
            from specfold.tiny import data as D
            rng = random.Random("speculative-calibration")
            held = {r["question"] for r in rows}
            calib = []
            while len(calib) < args.calib:
                q = D.make_problem(rng)["question"]
                if q not in held:
                    calib.append(q)
        except Exception:  # no generator: calibrate on the held-out tail, disjoint from the evaluated head
            calib = [r["question"] for r in rows[args.n: args.n + args.calib]]
        return evals, calib
    g = torch.Generator().manual_seed(1)
    mk = lambda k: [torch.randint(0, 500, (int(torch.randint(8, 40, (1,), generator=g)),), generator=g).tolist()
                    for _ in range(k)]
    return mk(args.n), mk(args.calib)


def run(llm, prompts, params):
    outs = llm.generate(prompts, params)
    st = [o.stats for o in outs]
    tok, nfe, sec = sum(s.tokens for s in st), sum(s.nfe for s in st), sum(s.seconds for s in st)
    ex = lambda k: sum(s.extra.get(k, 0.0) for s in st)
    return {"ids": [o.token_ids for o in outs], "tokens": tok, "nfe": nfe, "seconds": sec,
            "tpf": tok / nfe, "tps": tok / sec, "model": ex("model_seconds"), "draft": ex("draft_seconds"),
            "accepted": ex("reused_states") / max(1, sum(s.verify_forwards for s in st))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="checkpoint folder or 'tiny' (default: tiny if trained)")
    ap.add_argument("--n", type=int, default=40, help="evaluated prompts")
    ap.add_argument("--calib", type=int, default=50, help="calibration prompts when no graph is given")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--graph", default=None)
    ap.add_argument("--no-bf16", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    tmp = None
    folder = TINY if args.model in (None, "tiny") else Path(args.model)
    if args.model in (None, "tiny") and not (TINY / "config.json").is_file():
        tmp = tempfile.TemporaryDirectory()
        model = folder = random_checkpoint(Path(tmp.name))
        print("(the tiny model is not trained yet: a random Qwen2-shaped checkpoint stands in)\n")
    else:
        model = "tiny" if args.model in (None, "tiny") else args.model
    tiny = (folder / "heldout.jsonl").is_file()  # the tiny task: held-out questions through the chat template
    evals, calib = load_prompts(args, folder if tiny else None)
    common = dict(max_new_tokens=args.max_new_tokens, chat_template=tiny)
    static = DecodeParams(rule="static", tokens_per_step=1, **common)
    thr = DecodeParams(rule="threshold", threshold=0.9, **common)
    llm = LLM(model, dtype="float32")
    graph = args.graph
    if graph is None:
        try:
            from specfold.decoding.drafts.spiffy import default_graph
            graph = default_graph(llm.spec, "threshold", 7)
            gsrc = "shipped default"
        except GraphError:
            t = time.perf_counter()
            graph = calibrate(llm, calib, thr, branches=7)
            gsrc = f"calibrated here on {len(calib)} prompts in {time.perf_counter() - t:.0f} s"
    else:
        gsrc = graph
    rows = [  # (label, params, baseline label)
        ("vanilla static k=1", static, None),
        ("FreeDave d=8", static.replace(method="freedave", draft_depth=8), "vanilla static k=1"),
        ("FreeDave d=8 eager", static.replace(method="freedave", draft_depth=8, eager=True), "vanilla static k=1"),
        ("vanilla threshold 0.9", thr, None),
        ("FreeDave++ d=8", thr.replace(method="freedave", draft_depth=8), "vanilla threshold 0.9"),
        ("Spiffy B=7", thr.replace(method="spiffy", branches=7, graph=graph), "vanilla threshold 0.9"),
    ]
    if llm.spec.attention != "block_causal":
        rows = [r for r in rows if not r[1].eager]
    res = {}
    for label, p, _ in rows:
        res[label] = run(llm, evals, p)
    match = {}
    if not args.no_bf16:
        llm16 = LLM(model, dtype="bfloat16")
        res16 = {label: run(llm16, evals, p)["ids"] for label, p, _ in rows}
    for label, _, base in rows:
        if base is None:
            continue
        m32 = sum(a == b for a, b in zip(res[label]["ids"], res[base]["ids"])) / len(evals)
        m16 = (sum(a == b for a, b in zip(res16[label], res16[base])) / len(evals)) if not args.no_bf16 else None
        match[label] = (m32, m16)
    name = (f"tiny-task held-out set ({model})" if tiny else
            "a random Qwen2-shaped checkpoint" if tmp else f"{model} (random prompts)")
    print(f"## Speculative decoding on {name}: {len(evals)} prompts, max_new_tokens={args.max_new_tokens}, "
          f"float32, {args.threads} thread(s), CPU\n")
    print(f"Spiffy graph: {gsrc}\n")
    print("| method | NFE | NFE vs vanilla | tokens/forward | tpf vs vanilla | accepted/verify | tokens/s | "
          "speed vs vanilla | model % | drafting % | other % | match fp32 | match bf16 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for label, _, base in rows:
        r = res[label]
        b = res[base] if base else r
        m32, m16 = match.get(label, (1.0, 1.0 if not args.no_bf16 else None))
        fmt = lambda x: "-" if x is None else f"{100 * x:.0f}%"
        print(f"| {label} | {r['nfe']} | {r['nfe'] / b['nfe']:.2f}x | {r['tpf']:.2f} | {r['tpf'] / b['tpf']:.2f}x | "
              f"{r['accepted']:.2f} | {r['tps']:.1f} | {r['tps'] / b['tps']:.2f}x | {100 * r['model'] / r['seconds']:.0f} | "
              f"{100 * r['draft'] / r['seconds']:.1f} | {100 * (1 - (r['model'] + r['draft']) / r['seconds']):.0f} | "
              f"{fmt(m32)} | {fmt(m16)} |")
    print(f"\nCommand: python benchmarks/speculative.py --n {args.n} --max-new-tokens {args.max_new_tokens} "
          f"--threads {args.threads}" + (f" --model {args.model}" if args.model else ""))
    if tmp:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
