"""Train the embedded tiny block-diffusion model: `specfold train-tiny --out DIR --seed S`.

Regenerates everything from the seed: data (specfold.tiny.data), tokenizer (specfold.tiny.tokenizer)
and weights, trained with specfold's own `Transformer` and the block-diffusion objective of
specfold.tiny.objective (block-causal attention aligned to absolute position 0, no logits shift).

Progress (loss, tokens/s, ETA, held-out masked-token accuracy and, every few minutes, greedy decoding
accuracy on held-out problems, specfold.tiny.monitor) goes to stdout. A resumable checkpoint (model,
optimizer, step, data and torch RNG state) is written to `DIR/ckpt.pt` every `--save-minutes`, and the
HF checkpoint folder (specfold.tiny.export: config.json, model.safetensors, tokenizer files,
heldout.jsonl) is exported into DIR every `--export-minutes` and at the end. Rerunning the same
command resumes.
"""
from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import signal
import sys
import time
from pathlib import Path

import torch

from specfold.models.spec import resolve_spec
from specfold.models.tokenizer import Tokenizer
from specfold.models.transformer import Transformer
from specfold.tiny import choices as C
from specfold.tiny import data as D
from specfold.tiny import tokenizer as T
from specfold.tiny.export import BLOCK_SIZE, SIZES, SUB_BLOCK_SIZE, export, model_config  # noqa: F401
from specfold.tiny.monitor import decode_accuracy, greedy_decode  # noqa: F401
from specfold.tiny.objective import (Encoder, fused_attention, init_weights, loss_fn,  # noqa: F401
                                     make_batch, train_mask)

PACKAGE_MODEL_DIR = Path(__file__).resolve().parent / "model"
SHIPPED_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json", "special_tokens_map.json", "heldout.jsonl")
DEFAULT_STEPS = 6400  # the shipped model's length (its schedule: specfold/tiny/README.md)
# task name -> problem maker: "choices" (specfold.tiny.choices, the shipped model's: worked solutions
# with choice points, see README.md) or "arith" (specfold.tiny.data, the earlier model's)
TASKS = {"arith": D.make_problem, "choices": C.make_problem}


# -------------------------------------------------------------------------------------- training
def _lr(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    prog = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * prog)))


def _log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def _tokenizer(tok_dir: Path, seed: int, exclude: set[str], n: int, make: D.Maker) -> Path:
    """Train (once) the BPE tokenizer on `n` seeded training problems (never held-out ones)."""
    if not (tok_dir / "tokenizer.json").is_file():
        tok_rng = random.Random(f"tokenizer-{seed}")
        sample = []
        while len(sample) < n:
            p = make(tok_rng)
            if p["question"] not in exclude:
                sample.append(p)
        T.save_tokenizer(T.train_tokenizer(T.corpus(sample)), tok_dir)
    return tok_dir


def _optimizer(model: Transformer, lr: float) -> torch.optim.Optimizer:
    """AdamW (betas 0.9/0.95), weight decay 0.1 on matrices only."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8)


def ship_export(outp: Path, dest: Path = PACKAGE_MODEL_DIR) -> None:
    """Copy a finished export into the package (`specfold/tiny/model/`)."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in SHIPPED_FILES:
        shutil.copy(outp / f, dest / f)
    _log(f"shipped to {dest}")


def train_tiny(out: str, seed: int = 0, minutes: float | None = None, steps: int | None = None,
               micro: bool = False, batch_size: int = 32, lr: float = 2e-3, warmup: int = 200,
               autocast: bool | None = None, threads: int = 1, save_minutes: float = 3.0,
               export_minutes: float = 10.0, eval_minutes: float = 10.0, eval_problems: int = 40,
               ship: bool = False, log_every: int = 20, copies: int = 2, task: str = "choices",
               digit_weight: float = 1.0, size: str = "base") -> dict:
    """Train (or resume) the tiny model into `out`; returns the last metrics (see `_train_tiny`)."""
    with fused_attention():
        return _train_tiny(out, seed, minutes, steps, micro, batch_size, lr, warmup, autocast, threads,
                           save_minutes, export_minutes, eval_minutes, eval_problems, ship, log_every,
                           copies, task, digit_weight, size)


def _train_tiny(out, seed, minutes, steps, micro, batch_size, lr, warmup, autocast, threads,
                save_minutes, export_minutes, eval_minutes, eval_problems, ship, log_every, copies, task,
                digit_weight=1.0, size="base"):
    """Train (or resume) the tiny model into `out`; returns a summary dict of the last metrics.

    Length: `steps` (deterministic) or, without it, `minutes` (the step count is then fixed from the
    throughput measured over the first steps and stored, so resuming continues the same schedule).
    """
    torch.set_num_threads(threads)
    outp = Path(out)
    outp.mkdir(parents=True, exist_ok=True)
    size = "micro" if micro else size
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; accepted: {', '.join(SIZES)}")
    if autocast is None:
        autocast = False
    # --- data and tokenizer (deterministic from the seed)
    if task not in TASKS:
        raise ValueError(f"unknown tiny task {task!r}; accepted: {', '.join(TASKS)}")
    make = TASKS[task]
    held = D.heldout(seed, 40 if micro else D.HELDOUT_SIZE, make)
    held_path = outp / "heldout.jsonl"
    D.save_jsonl(held, held_path)
    exclude = {p["question"] for p in held}
    tok_dir = _tokenizer(outp / "tokenizer", seed, exclude, 2000 if micro else 20000, make)
    tok = Tokenizer.load(tok_dir)
    enc = Encoder(tok)
    stop_ids = [enc.im_end, enc.pad]
    config = model_config(size, len(tok.vocab), enc.mask, stop_ids, enc.im_end, enc.pad)
    token_weight = None
    if digit_weight != 1.0:  # digit targets (the arithmetic's results) weigh more in the loss
        token_weight = torch.ones(config["vocab_size"])
        token_weight[[tok.vocab[str(d)] for d in range(10)]] = digit_weight
    spec = resolve_spec(config)
    torch.manual_seed(seed)
    model = Transformer(spec)
    init_weights(model)
    opt = _optimizer(model, lr)
    stream = D.TrainStream(seed, exclude, make)
    gen = torch.Generator().manual_seed(seed)
    step, total, tokens_seen, elapsed = 0, steps, 0, 0.0
    ckpt = outp / "ckpt.pt"
    if ckpt.is_file():
        st = torch.load(ckpt, weights_only=False)
        if st["config"]["hidden_size"] != config["hidden_size"] or \
                st["config"]["num_hidden_layers"] != config["num_hidden_layers"]:
            raise ValueError(f"{ckpt} holds another model size; pass the --size it was trained with")
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        stream.set_state(st["data_state"])
        gen.set_state(st["gen_state"])
        if st.get("task", task) != task:
            raise ValueError(f"{ckpt} was trained on task {st['task']!r}, not {task!r}: pass --task {st['task']}")
        step, total, tokens_seen, elapsed = st["step"], st["total"], st["tokens"], st["elapsed"]
        if steps is not None:  # an explicit length wins over the stored one (extend a finished run)
            total = steps
        _log(f"resumed from {ckpt} at step {step}/{total}")
    nparams = sum(p.numel() for p in model.parameters())
    _log(f"model {size}: {nparams / 1e6:.2f}M params, vocab {spec.vocab_size} "
         f"(tokenizer {len(tok.vocab)}), block {spec.block_size}/{spec.sub_block_size}, "
         f"batch {batch_size}, lr {lr}, autocast bf16={autocast}, threads {threads}")
    # fixed held-out batch for masked-token loss/accuracy
    vgen = torch.Generator().manual_seed(1234)
    vbatch = make_batch([enc.example(p) for p in held[:64]], enc, spec.block_size, vgen)
    eval_set = held[: min(eval_problems, len(held))]

    def save_ckpt():
        tmp = outp / "ckpt.pt.tmp"
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                    "total": total, "tokens": tokens_seen, "elapsed": elapsed,
                    "data_state": stream.state(), "gen_state": gen.get_state(),
                    "torch_rng": torch.get_rng_state(), "config": config, "task": task}, tmp)
        os.replace(tmp, ckpt)

    def do_export():
        export(model, config, tok_dir, held_path, outp)

    stop = []  # SIGTERM / SIGINT: save the checkpoint after the current step and exit (resumable)

    def on_signal(signum, _frame):
        stop.append(signum)

    old_handlers = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            old_handlers[sig] = signal.signal(sig, on_signal)
        except ValueError:  # not the main thread
            pass
    model.train()
    t_save = t_export = t_eval = time.time()
    t_log, tok_log = time.time(), 0
    calib_steps = 30
    t_start = time.time()
    last = {}
    first_losses: list[float] = []
    while total is None or step < total:
        if total is None and step >= calib_steps and minutes is not None:
            rate = (time.time() - t_start) / max(1, step)  # s/step measured so far
            total = max(step + 1, int(minutes * 60 / rate))
            _log(f"{minutes} min at {rate:.3f} s/step -> {total} steps")
        cur_lr = _lr(step, total or 10**9, lr, warmup)
        for g in opt.param_groups:
            g["lr"] = cur_lr
        t0 = time.time()
        batch = make_batch([enc.example(next(stream)) for _ in range(batch_size)], enc,
                           spec.block_size, gen, copies)
        loss, acc = loss_fn(model, batch, autocast, token_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        ntok = batch[0].numel()
        tokens_seen += ntok
        tok_log += ntok
        elapsed += time.time() - t0
        if len(first_losses) < 5:
            first_losses.append(loss.item())
        last = {"step": step, "loss": loss.item(), "acc": acc.item()}
        now = time.time()
        if step % log_every == 0 or step == total:
            tps = tok_log / (now - t_log)
            eta = (total - step) * (now - t_log) / log_every / 60 if total else float("nan")
            _log(f"step {step}/{total} loss {loss.item():.4f} acc {acc.item():.3f} lr {cur_lr:.2e} "
                 f"tok/s {tps:.0f} tokens {tokens_seen / 1e6:.2f}M ETA {eta:.1f} min")
            t_log, tok_log = now, 0
        if now - t_eval > eval_minutes * 60 or step == total:
            model.eval()
            with torch.no_grad():
                vl, va = loss_fn(model, vbatch, autocast)
            dacc, tpf = decode_accuracy(model, spec, enc, eval_set, "sub_block")
            model.train()
            last.update(val_loss=vl.item(), val_acc=va.item(), decode_acc=dacc, tokens_per_forward=tpf)
            _log(f"eval step {step}: held-out masked loss {vl.item():.4f} acc {va.item():.3f}; "
                 f"greedy sub_block@{spec.threshold} accuracy {dacc:.3f} on {len(eval_set)} "
                 f"held-out, tokens/forward {tpf:.2f}")
            t_eval = time.time()
        if now - t_save > save_minutes * 60 or step == total or stop:
            save_ckpt()
            t_save = time.time()
        if stop:
            _log(f"signal {stop[0]}: checkpoint saved at step {step}; rerun the command to resume")
            break
        if now - t_export > export_minutes * 60 or step == total:
            do_export()
            _log(f"exported HF checkpoint to {outp}")
            t_export = time.time()
    for sig, h in old_handlers.items():
        signal.signal(sig, h)
    if stop:
        last["first_losses"] = first_losses
        return last
    if step == 0 or not (outp / "model.safetensors").is_file():
        save_ckpt()
        do_export()
    if ship:
        ship_export(outp)
    last["first_losses"] = first_losses
    return last


def add_arguments(p: argparse.ArgumentParser) -> None:
    from specfold.args import positive_int
    p.add_argument("--out", required=True, help="output folder (checkpoint, HF export); rerun to resume")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=positive_int, default=None,
                   help=f"training steps (deterministic length; default {DEFAULT_STEPS} unless --minutes)")
    p.add_argument("--minutes", type=float, default=None,
                   help="training length in minutes when --steps is not given")
    p.add_argument("--micro", action="store_true", help="micro config (smoke test)")
    p.add_argument("--batch-size", type=positive_int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (faster on CPUs with bf16 units)")
    p.add_argument("--threads", type=positive_int, default=1)
    p.add_argument("--copies", type=int, default=2, help="noisy copies per clean sequence")
    p.add_argument("--task", choices=list(TASKS), default="choices",
                   help="choices: worked solutions with choice points (the shipped model's task); arith: the "
                        "earlier model's fixed-template task")
    p.add_argument("--size", choices=[k for k in SIZES if k != "micro"], default="base",
                   help="base: d=192, 4 layers (1.9M parameters); large: d=256, 6 layers (5.0M)")
    p.add_argument("--digit-weight", type=float, default=1.0,
                   help="loss weight of digit targets (the arithmetic's results) against 1 for the others")
    p.add_argument("--save-minutes", type=float, default=3.0)
    p.add_argument("--export-minutes", type=float, default=10.0)
    p.add_argument("--eval-minutes", type=float, default=10.0)
    p.add_argument("--eval-problems", type=int, default=40)
    p.add_argument("--ship", action="store_true", help=f"copy the final export into {PACKAGE_MODEL_DIR}")


def run_args(a: argparse.Namespace) -> int:
    if a.steps is None and a.minutes is None:
        a.steps = DEFAULT_STEPS
    train_tiny(a.out, a.seed, minutes=a.minutes, steps=a.steps, micro=a.micro,
               batch_size=a.batch_size, lr=a.lr, warmup=a.warmup, autocast=a.bf16, threads=a.threads, copies=a.copies,
               save_minutes=a.save_minutes, export_minutes=a.export_minutes,
               eval_minutes=a.eval_minutes, eval_problems=a.eval_problems, ship=a.ship, task=a.task,
               digit_weight=a.digit_weight, size=a.size)
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    """Add the `train-tiny` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser("train-tiny", help="train the embedded tiny diffusion model (resumable)",
                              description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.set_defaults(func=run_args)
    return p


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specfold.tiny.train")
    add_arguments(p)
    return run_args(p.parse_args(argv))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
