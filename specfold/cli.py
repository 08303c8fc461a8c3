"""`specfold` command line: generate, demo, and the subcommands other parts register
(calibrate, bench, eval, train-tiny, serve).

Invariants:
- `specfold --help` imports neither torch nor any optional extra: only the subcommand being run
  is registered in full (its module imported); the others are listed by name and help.
- Every user error ends in ONE line on stderr and exit status 2 (argparse errors, SpecfoldError,
  a file that cannot be read or written, a missing optional extra); Ctrl-C ends quietly with 130, a closed stdout pipe quietly with 141,
  SIGTERM quietly with 143 (interrupts.py: both unwind as exceptions, never inside a C extension's init),
  keeping whatever a resumable run already wrote. Any other exception is a bug and keeps its traceback.
- As the process (the console script, `python -m specfold`), a signal that lands after the command
  (the interpreter's teardown of torch takes most of a second) ends it silently with the command's
  own status: never a traceback from an exit handler, never death by the default action.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys

from specfold.interrupts import Terminated, exit_quietly, handling_signals
from specfold.args import (  # noqa: F401 (re-exported for callers of the older location)
    add_model_args, add_settings, engine_config_from_args, llm_from_args, nonnegative_int,
    overrides_from_args, params_from_args, positive_int, sampling_from_args, stats_line,
)
from specfold.params import RULES

EXIT_USAGE, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE, EXIT_TERMINATED = 2, 130, 141, 143


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage block): `specfold generate: error: ... (see --help)`."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def cmd_generate(a: argparse.Namespace) -> int:
    from specfold.text import check_text, read_text_lines
    config, sampling = engine_config_from_args(a), sampling_from_args(a)  # bad settings fail before loading
    prompts: list = [check_text(p, "--prompt") for p in a.prompt]
    for ids in a.prompt_ids:
        try:
            prompts.append([int(t) for t in ids.split(",")])
        except ValueError:
            print(f"error: --prompt-ids takes comma-separated integers, got {ids!r}", file=sys.stderr)
            return EXIT_USAGE
    if a.prompt_file:
        prompts += read_text_lines(a.prompt_file, "--prompt-file")
    if not prompts:
        print("error: give --prompt TEXT, --prompt-ids IDS or --prompt-file FILE (a file with at least one "
              "non-empty line)", file=sys.stderr)
        return EXIT_USAGE
    from specfold.api import _drain
    llm = llm_from_args(a)
    llm.engine_config = config
    job = llm._prepare(prompts, sampling)  # every prompt encoded and validated: no error line can follow
    print(template_line(sampling.chat_template and llm.tokenizer is not None), file=sys.stderr)
    outs = _drain(*job, use_tqdm=len(prompts) > 1 and not a.json)
    for o in outs:
        if a.json:
            row = {"prompt": o.prompt, "text": o.text, "token_ids": o.token_ids, "finish_reason": o.finish_reason,
                   "stats": o.stats.to_dict()}
            if o.logprobs is not None:  # --logprobs N: per token, {token id: log-probability}
                row["logprobs"] = [{str(t): lp for t, lp in d.items()} for d in o.logprobs]
            print(json.dumps(row))
        else:
            print(o.text if llm.tokenizer is not None else " ".join(map(str, o.token_ids)))
            print(stats_line(o.stats), file=sys.stderr if a.quiet_stats else sys.stdout)
    return 0


def template_line(applied: bool) -> str:
    """`generate`'s first stderr line: whether the prompts go through the chat template."""
    return ("applying the chat template (--no-chat-template sends the prompt as is)" if applied
            else "sending the prompt as is")


def rule_label(p) -> str:
    """The unmask rule of resolved params `p` with the setting that decides its speed."""
    if p.rule in ("threshold", "sub_block"):
        return f"rule {p.rule} {p.threshold}"
    if p.rule in ("llada", "dream"):
        return f"rule {p.rule} steps={p.steps}"
    if p.rule == "llada2":
        return f"rule llada2 {p.threshold} steps={p.steps}"
    if p.rule == "llada2_edit":
        return f"rule llada2_edit {p.threshold}/{p.edit_threshold} post={p.max_post_steps}"
    return f"rule {p.rule} k={p.tokens_per_step}"


def cmd_demo(a: argparse.Namespace) -> int:
    """Run held-out problems of the tiny model's task through the embedded model, per method; every
    run is labelled with its method and its (resolved) unmask rule."""
    from specfold.api import LLM, tiny_path
    from specfold.decoding.methods import get_method
    from specfold.params import DecodeParams
    methods = a.methods.split(",")
    plist = [DecodeParams(method=m, rule=a.rule, chat_template=True, max_new_tokens=a.max_new_tokens)
             for m in methods]
    for m in methods:
        get_method(m)  # an unknown method fails before any work
    llm = LLM("tiny")
    rows = [json.loads(line) for line in (tiny_path() / "heldout.jsonl").read_text().splitlines()[: a.n]]
    summary = []
    for method, params in zip(methods, plist):
        label = f"{method}, {rule_label(params.resolve(llm.spec))}"
        outs = llm.generate([r["question"] for r in rows], params)
        right = 0
        for row, out in zip(rows, outs):
            want = row["answer"].rsplit("####", 1)[-1].strip()
            got = out.text.rsplit("####", 1)[-1].strip() if "####" in out.text else "?"
            right += got == want
            print(f"--- [{label}] {row['question']}\n{out.text}\n{stats_line(out.stats)} "
                  f"answer {got} (expected {want}: {'correct' if got == want else 'wrong'})")
        nfe, toks = sum(o.stats.nfe for o in outs), sum(o.stats.tokens for o in outs)
        secs = sum(o.stats.seconds for o in outs)
        summary.append(f"{label:>32}: {right}/{len(rows)} correct, {nfe} forwards, "
                       f"{toks / max(nfe, 1):.2f} tokens/forward, {toks / secs:.0f} tokens/s")
    print("\n" + "\n".join(summary))
    return 0


# subcommands provided by other parts: (name, module, help, extra it needs or None)
_PLUGINS = [
    ("calibrate", "specfold.calibrate_cli", "calibrate a Spiffy draft graph", None),
    ("bench", "specfold.eval.bench", "benchmark methods side by side (needs the 'eval' extra)", "eval"),
    ("eval", "specfold.eval.evaluate", "score a method on benchmarks (needs the 'eval' extra)", "eval"),
    ("train-tiny", "specfold.tiny.train", "train the embedded tiny model", None),
    ("serve", "specfold.serve", "OpenAI-compatible server (needs the 'serve' extra)", "serve"),
    ("widen", "specfold.widen_cli", "widen a checkpoint without changing its function (cost proxy)", None),
]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; with `command`, only that plugin subcommand is registered in full (the others are
    listed by name, their modules not imported). `command=None` registers every one."""
    ap = Parser(prog="specfold", description="fast lossless decoding for diffusion LLMs",
                epilog="exit status: 0 ok, 2 bad input (one line on stderr), 130 interrupted, 143 terminated")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    g = sub.add_parser("generate", help="generate text for prompts")
    add_model_args(g)
    add_settings(g)
    g.add_argument("--prompt", action="append", default=[], help="prompt text (repeatable)")
    g.add_argument("--prompt-ids", action="append", default=[], help="token ids, e.g. 1,2,3 (repeatable)")
    g.add_argument("--prompt-file", help="UTF-8 text file, one prompt per line")
    g.add_argument("--json", action="store_true", help="one JSON object per prompt (with --logprobs N: theirs too)")
    g.add_argument("--quiet-stats", action="store_true", help="stats line to stderr")
    g.set_defaults(func=cmd_generate)
    d = sub.add_parser("demo", help="held-out problems through the embedded tiny model")
    d.add_argument("--n", type=positive_int, default=3)
    d.add_argument("--methods", default="vanilla")
    d.add_argument("--rule", choices=RULES, default=None, help="unmask rule (default: the model's)")
    d.add_argument("--max-new-tokens", type=positive_int, default=128)
    d.set_defaults(func=cmd_demo)
    for name, module, help_, _extra in _PLUGINS:
        if command is not None and command != name:
            sub.add_parser(name, help=help_, add_help=False)  # listed only; never parsed in this process
            continue
        importlib.import_module(module).register(sub)
        if name in ("serve", "eval", "bench"):  # specfold/ray adds --replicas/--ray and their path
            from specfold.ray.cli import extend
            extend(name, sub.choices[name])
    return ap


def _command(argv: list[str]) -> str | None:
    """The subcommand named on the command line (the first word that is not an option)."""
    return next((x for x in argv if not x.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    """Run one command; every user error ends as one line on stderr (see the module docstring). The
    signal handlers come first: from here on Ctrl-C and SIGTERM end in one line wherever they land.
    Without `argv` (the console script, `python -m specfold`) main is the whole process: a signal
    after the command (interpreter teardown) ends it at once with the command's status, silently,
    never by the default action (interrupts.exit_quietly)."""
    ending = exit_quietly() if argv is None else None
    try:
        with handling_signals():  # SIGINT/SIGTERM unwind as exceptions (interrupts.py)
            status = _run(sys.argv[1:] if argv is None else list(argv))
    except KeyboardInterrupt:
        status = EXIT_INTERRUPTED
        print(("\n" if sys.stderr.isatty() else "") + "interrupted", file=sys.stderr)
    except Terminated:
        status = EXIT_TERMINATED
        print(("\n" if sys.stderr.isatty() else "") + "terminated", file=sys.stderr)
    except BaseException as e:  # SystemExit (argparse: --help, a usage error) or a bug: it ends the process
        if ending is not None:
            code = e.code if isinstance(e, SystemExit) else 1
            ending.status = code if isinstance(code, int) else int(code is not None)
        raise
    if ending is not None:
        ending.status = status
    return status


def _run(argv: list[str]) -> int:
    import warnings
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # torch without numpy: harmless
    from specfold.errors import SpecfoldError
    from specfold.extras import MissingExtraError, extra_of, hint, require
    command = _command(argv)
    prog = f"specfold {command}" if command else "specfold"
    try:
        extra = next((e for n, _m, _h, e in _PLUGINS if n == command), None)
        if extra is not None:
            require(extra, prog)
        a = build_parser(command or "").parse_args(argv)  # "": no plugin needed (e.g. `specfold --help`)
        return a.func(a) or 0
    except MissingExtraError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except ModuleNotFoundError as e:  # an optional package imported on the way (e.g. triton)
        if extra_of(e.name) is None:
            raise
        print(f"error: {hint(prog, extra_of(e.name), e.name)}", file=sys.stderr)
        return EXIT_USAGE
    except SpecfoldError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # the reader went away (e.g. `| head`): stop quietly, as other CLIs do
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except OSError as e:  # a file that cannot be read or written
        where = f"{e.filename}: " if e.filename else ""
        print(f"error: {where}{e.strerror or e}", file=sys.stderr)
        return EXIT_USAGE


def lm_eval_main() -> int:
    """`specfold-lm-eval`: lm-eval's CLI with the specfold model registered (needs the 'lm-eval' extra)."""
    from specfold.extras import MissingExtraError, require
    try:
        require("lm-eval", "specfold-lm-eval")
    except MissingExtraError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    from specfold.eval.lm_eval_adapter import main as adapter_main
    return adapter_main() or 0


if __name__ == "__main__":
    sys.exit(main())
