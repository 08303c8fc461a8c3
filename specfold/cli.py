"""`specfold` command line: generate, demo, and the subcommands other parts register
(calibrate, bench, eval, train-tiny, serve). Subcommands whose optional dependencies are missing
are still listed and fail with the install hint when used."""
from __future__ import annotations

import argparse
import importlib
import json
import sys

from specfold.params import CONFIDENCES, RULES


def add_model_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="tiny", help="local HuggingFace checkpoint folder, or 'tiny'")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16", "float16"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=JSON",
                    help="model spec override, e.g. mask_token_id=151665 (repeatable)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")


def add_decode_args(ap: argparse.ArgumentParser) -> None:
    from specfold.decoding.methods import method_names
    g = ap.add_argument_group("decoding")
    g.add_argument("--method", default="vanilla", help=f"one of {method_names()}")
    g.add_argument("--rule", choices=RULES, default=None, help="unmask rule (default: the family's)")
    g.add_argument("--block-size", type=int)
    g.add_argument("--sub-block-size", type=int)
    g.add_argument("--tokens-per-step", type=int, help="k of the static/dynamic rules")
    g.add_argument("--threshold", type=float)
    g.add_argument("--confidence", choices=CONFIDENCES)
    g.add_argument("--steps", type=int, help="llada: steps per block; dream: total steps")
    g.add_argument("--max-new-tokens", type=int, default=256)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--no-chat-template", action="store_true", help="send the prompt text as is")
    g.add_argument("--no-early-stop", action="store_true")
    g.add_argument("--draft-depth", type=int, default=8, help="FreeDave chain depth")
    g.add_argument("--eager", action="store_true", help="FreeDave drafts may reach into the next block")
    g.add_argument("--branches", type=int, default=7, help="Spiffy/SpecFold draft branches")
    g.add_argument("--graph", default=None, help="Spiffy draft graph JSON")
    g.add_argument("--delta", type=float, default=0.1, help="SpecFold fold threshold")
    g.add_argument("--drafts", default="spiffy", choices=["spiffy", "freedave"], help="SpecFold draft policy")
    g.add_argument("--backend", default="torch", choices=["torch", "triton"], help="SpecFold kernels")


def params_from_args(a: argparse.Namespace):
    from specfold.params import DecodeParams
    return DecodeParams(
        method=a.method, rule=a.rule, block_size=a.block_size, sub_block_size=a.sub_block_size,
        tokens_per_step=a.tokens_per_step, threshold=a.threshold, confidence=a.confidence, steps=a.steps,
        max_new_tokens=a.max_new_tokens, temperature=a.temperature, seed=a.seed,
        chat_template=not a.no_chat_template, early_stop=not a.no_early_stop, draft_depth=a.draft_depth,
        eager=a.eager, branches=a.branches, graph=a.graph, delta=a.delta, drafts=a.drafts, backend=a.backend)


def llm_from_args(a: argparse.Namespace):
    import torch

    from specfold.api import LLM
    if a.threads:
        torch.set_num_threads(a.threads)
    overrides = {}
    for item in a.override:
        key, _, val = item.partition("=")
        try:
            overrides[key] = json.loads(val)
        except json.JSONDecodeError:
            overrides[key] = val
    return LLM(a.model, dtype=a.dtype, device=a.device, overrides=overrides or None)


def stats_line(st) -> str:
    line = (f"[{st.tokens} tokens, {st.nfe} forwards, {st.tokens_per_forward:.2f} tokens/forward, "
            f"{st.seconds:.2f} s, {st.tokens_per_second:.1f} tokens/s")
    if st.extra.get("fold_ratio") is not None:  # None: no draft position was verified
        line += f", fold ratio {st.extra['fold_ratio']:.2f}"
    return line + "]"


def cmd_generate(a: argparse.Namespace) -> int:
    llm = llm_from_args(a)
    params = params_from_args(a)
    prompts: list = list(a.prompt)
    for ids in a.prompt_ids:
        try:
            prompts.append([int(t) for t in ids.split(",")])
        except ValueError:
            print(f"error: --prompt-ids takes comma-separated integers, got {ids!r}", file=sys.stderr)
            return 2
    if a.prompt_file:
        with open(a.prompt_file) as f:
            prompts += [line.rstrip("\n") for line in f if line.strip()]
    if not prompts:
        print("error: give --prompt TEXT, --prompt-ids IDS or --prompt-file FILE", file=sys.stderr)
        return 2
    outs = llm.generate(prompts, params, use_tqdm=len(prompts) > 1 and not a.json)
    for o in outs:
        if a.json:
            print(json.dumps({"prompt": o.prompt, "text": o.text, "token_ids": o.token_ids,
                              "finish_reason": o.finish_reason, "stats": o.stats.to_dict()}))
        else:
            print(o.text if llm.tokenizer is not None else " ".join(map(str, o.token_ids)))
            print(stats_line(o.stats), file=sys.stderr if a.quiet_stats else sys.stdout)
    return 0


def cmd_demo(a: argparse.Namespace) -> int:
    """Run held-out problems of the tiny model's task through the embedded model, per method."""
    from specfold.api import LLM, tiny_path
    from specfold.params import DecodeParams
    llm = LLM("tiny")
    rows = [json.loads(line) for line in (tiny_path() / "heldout.jsonl").read_text().splitlines()[: a.n]]
    summary = []
    for method in a.methods.split(","):
        params = DecodeParams(method=method, rule=a.rule, chat_template=True, max_new_tokens=a.max_new_tokens)
        outs = llm.generate([r["question"] for r in rows], params)
        right = 0
        for row, out in zip(rows, outs):
            want = row["answer"].rsplit("####", 1)[-1].strip()
            got = out.text.rsplit("####", 1)[-1].strip() if "####" in out.text else "?"
            right += got == want
            print(f"--- [{method}] {row['question']}\n{out.text}\n{stats_line(out.stats)} "
                  f"answer {got} (expected {want}: {'correct' if got == want else 'wrong'})")
        nfe, toks = sum(o.stats.nfe for o in outs), sum(o.stats.tokens for o in outs)
        secs = sum(o.stats.seconds for o in outs)
        summary.append(f"{method:>9}: {right}/{len(rows)} correct, {nfe} forwards, "
                       f"{toks / max(nfe, 1):.2f} tokens/forward, {toks / secs:.0f} tokens/s")
    print("\n" + "\n".join(summary))
    return 0


# subcommands provided by other parts: (name, module, help)
_PLUGINS = [
    ("calibrate", "specfold.decoding.drafts.calibrate", "calibrate a Spiffy draft graph"),
    ("bench", "specfold.eval.bench", "benchmark methods side by side"),
    ("eval", "specfold.eval.evaluate", "score a method on benchmarks"),
    ("train-tiny", "specfold.tiny.train", "train the embedded tiny model"),
    ("serve", "specfold.serve", "OpenAI-compatible server"),
    ("widen", "specfold.widen_cli", "widen a checkpoint without changing its function (cost proxy)"),
]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="specfold", description="fast lossless decoding for diffusion LLMs")
    sub = ap.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text for prompts")
    add_model_args(g)
    add_decode_args(g)
    g.add_argument("--prompt", action="append", default=[], help="prompt text (repeatable)")
    g.add_argument("--prompt-ids", action="append", default=[], help="token ids, e.g. 1,2,3 (repeatable)")
    g.add_argument("--prompt-file", help="one prompt per line")
    g.add_argument("--json", action="store_true", help="one JSON object per prompt")
    g.add_argument("--quiet-stats", action="store_true", help="stats line to stderr")
    g.set_defaults(func=cmd_generate)
    d = sub.add_parser("demo", help="held-out problems through the embedded tiny model")
    d.add_argument("--n", type=int, default=3)
    d.add_argument("--methods", default="vanilla")
    d.add_argument("--rule", choices=RULES, default=None, help="unmask rule (default: the model's)")
    d.add_argument("--max-new-tokens", type=int, default=128)
    d.set_defaults(func=cmd_demo)
    for name, module, help_ in _PLUGINS:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if not (module == e.name or module.startswith(str(e.name) + ".")):
                missing = e.name

                def fail(_a, missing=missing, name=name):
                    print(f"error: `specfold {name}` needs the optional package {missing!r}; "
                          f"install it (pip install 'specfold[eval,serve]')", file=sys.stderr)
                    return 2
                sub.add_parser(name, help=help_ + " (unavailable)").set_defaults(func=fail)
            continue
        mod.register(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    from specfold.errors import SpecfoldError
    a = build_parser().parse_args(argv)
    try:
        return a.func(a) or 0
    except SpecfoldError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
