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
import contextlib
import math
import os
import random
import shutil
import signal
import sys
import time
from dataclasses import dataclass
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


# -------------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class TrainConfig:
    """One training run's settings (the `train-tiny` flags; their defaults are these).

    Length: `steps` (deterministic) or, without it, `minutes` (the step count is then fixed from the
    throughput measured over the first `CALIB_STEPS` steps and stored, so resuming continues the same
    schedule). `micro` trains the micro model (a smoke test) whatever `size` says."""
    out: str
    seed: int = 0
    minutes: float | None = None
    steps: int | None = None
    micro: bool = False
    batch_size: int = 32
    lr: float = 2e-3
    warmup: int = 200
    autocast: bool = False  # bf16 autocast
    threads: int = 1
    save_minutes: float = 3.0
    export_minutes: float = 10.0
    eval_minutes: float = 10.0
    eval_problems: int = 40
    ship: bool = False
    log_every: int = 20
    copies: int = 2  # noisy copies per clean sequence
    task: str = "choices"
    digit_weight: float = 1.0
    size: str = "base"

    def __post_init__(self):
        if self.model_size not in SIZES:
            raise ValueError(f"unknown model size {self.model_size!r}; accepted: {', '.join(SIZES)}")
        if self.task not in TASKS:
            raise ValueError(f"unknown tiny task {self.task!r}; accepted: {', '.join(TASKS)}")

    @property
    def model_size(self) -> str:
        return "micro" if self.micro else self.size


CALIB_STEPS = 30  # steps timed before a `minutes` run fixes its length


def train_tiny(out: str, seed: int = 0, **settings) -> dict:
    """Train (or resume) the tiny model into `out` (`settings`: the fields of `TrainConfig`); returns
    the last metrics (see `train`)."""
    return train(TrainConfig(out, seed, **settings))


def train(cfg: TrainConfig) -> dict:
    """Train (or resume) the run `cfg` describes; returns the last metrics: step, loss, acc, the last
    evaluation's (val_loss, val_acc, decode_acc, tokens_per_forward) and `first_losses` (the first five
    losses of this invocation)."""
    with fused_attention():
        torch.set_num_threads(cfg.threads)
        outp = Path(cfg.out)
        outp.mkdir(parents=True, exist_ok=True)
        tr = _Trainer(cfg, outp)
        with _stop_signals() as stop:
            last = _loop(tr, stop)
        if not stop:
            if tr.step == 0 or not (outp / "model.safetensors").is_file():
                tr.save()
                tr.export()
            if cfg.ship:
                ship_export(outp)
        last["first_losses"] = tr.first_losses
        return last


# -------------------------------------------------------------------------------------- the run
@dataclass
class _Data:
    """The run's data side, deterministic from the seed: held-out problems (saved into the run's
    folder), the BPE tokenizer trained on other problems, and the training stream."""
    held: list[dict]
    held_path: Path
    tok_dir: Path
    tok: Tokenizer
    enc: Encoder
    stream: D.TrainStream

    @classmethod
    def make(cls, cfg: TrainConfig, outp: Path) -> "_Data":
        make = TASKS[cfg.task]
        held = D.heldout(cfg.seed, 40 if cfg.micro else D.HELDOUT_SIZE, make)
        held_path = outp / "heldout.jsonl"
        D.save_jsonl(held, held_path)
        exclude = {p["question"] for p in held}
        tok_dir = _tokenizer(outp / "tokenizer", cfg.seed, exclude, 2000 if cfg.micro else 20000, make)
        tok = Tokenizer.load(tok_dir)
        return cls(held, held_path, tok_dir, tok, Encoder(tok), D.TrainStream(cfg.seed, exclude, make))


class _Trainer:
    """The model, optimizer, data and counters of one run: what the resumable checkpoint holds."""

    def __init__(self, cfg: TrainConfig, outp: Path):
        self.cfg, self.outp, self.ckpt = cfg, outp, outp / "ckpt.pt"
        self.data = d = _Data.make(cfg, outp)
        self.config = model_config(cfg.model_size, len(d.tok.vocab), d.enc.mask, [d.enc.im_end, d.enc.pad],
                                   d.enc.im_end, d.enc.pad)
        self.token_weight = _token_weight(cfg.digit_weight, d.tok, self.config["vocab_size"])
        self.spec = resolve_spec(self.config)
        torch.manual_seed(cfg.seed)
        self.model = Transformer(self.spec)
        init_weights(self.model)
        self.opt = _optimizer(self.model, cfg.lr)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.step, self.total, self.tokens, self.elapsed = 0, cfg.steps, 0, 0.0
        self.first_losses: list[float] = []
        if self.ckpt.is_file():
            self._resume()
        nparams = sum(p.numel() for p in self.model.parameters())
        _log(f"model {cfg.model_size}: {nparams / 1e6:.2f}M params, vocab {self.spec.vocab_size} "
             f"(tokenizer {len(d.tok.vocab)}), block {self.spec.block_size}/{self.spec.sub_block_size}, "
             f"batch {cfg.batch_size}, lr {cfg.lr}, autocast bf16={cfg.autocast}, threads {cfg.threads}")
        # fixed held-out batch for masked-token loss/accuracy
        vgen = torch.Generator().manual_seed(1234)
        self.vbatch = make_batch([d.enc.example(p) for p in d.held[:64]], d.enc, self.spec.block_size, vgen)
        self.eval_set = d.held[: min(cfg.eval_problems, len(d.held))]

    def _resume(self) -> None:
        st = torch.load(self.ckpt, weights_only=False)
        if st["config"]["hidden_size"] != self.config["hidden_size"] or \
                st["config"]["num_hidden_layers"] != self.config["num_hidden_layers"]:
            raise ValueError(f"{self.ckpt} holds another model size; pass the --size it was trained with")
        self.model.load_state_dict(st["model"])
        self.opt.load_state_dict(st["opt"])
        self.data.stream.set_state(st["data_state"])
        self.gen.set_state(st["gen_state"])
        task = self.cfg.task
        if st.get("task", task) != task:
            raise ValueError(f"{self.ckpt} was trained on task {st['task']!r}, not {task!r}: pass --task {st['task']}")
        self.step, self.total, self.tokens, self.elapsed = st["step"], st["total"], st["tokens"], st["elapsed"]
        if self.cfg.steps is not None:  # an explicit length wins over the stored one (extend a finished run)
            self.total = self.cfg.steps
        _log(f"resumed from {self.ckpt} at step {self.step}/{self.total}")

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor, float, int]:
        """One optimizer step at the schedule's learning rate: (loss, acc, lr, tokens in the batch)."""
        cfg, d = self.cfg, self.data
        lr = _lr(self.step, self.total or 10**9, cfg.lr, cfg.warmup)
        for g in self.opt.param_groups:
            g["lr"] = lr
        t0 = time.time()
        batch = make_batch([d.enc.example(next(d.stream)) for _ in range(cfg.batch_size)], d.enc,
                           self.spec.block_size, self.gen, cfg.copies)
        loss, acc = loss_fn(self.model, batch, cfg.autocast, self.token_weight)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.step += 1
        ntok = batch[0].numel()
        self.tokens += ntok
        self.elapsed += time.time() - t0
        if len(self.first_losses) < 5:
            self.first_losses.append(loss.item())
        return loss, acc, lr, ntok

    def evaluate(self) -> dict:
        """Held-out masked loss/accuracy and greedy decoding accuracy (the model is left training)."""
        self.model.eval()
        with torch.no_grad():
            vl, va = loss_fn(self.model, self.vbatch, self.cfg.autocast)
        dacc, tpf = decode_accuracy(self.model, self.spec, self.data.enc, self.eval_set, "sub_block")
        self.model.train()
        _log(f"eval step {self.step}: held-out masked loss {vl.item():.4f} acc {va.item():.3f}; "
             f"greedy sub_block@{self.spec.threshold} accuracy {dacc:.3f} on {len(self.eval_set)} "
             f"held-out, tokens/forward {tpf:.2f}")
        return dict(val_loss=vl.item(), val_acc=va.item(), decode_acc=dacc, tokens_per_forward=tpf)

    def save(self) -> None:
        tmp = self.outp / "ckpt.pt.tmp"
        torch.save({"model": self.model.state_dict(), "opt": self.opt.state_dict(), "step": self.step,
                    "total": self.total, "tokens": self.tokens, "elapsed": self.elapsed,
                    "data_state": self.data.stream.state(), "gen_state": self.gen.get_state(),
                    "torch_rng": torch.get_rng_state(), "config": self.config, "task": self.cfg.task}, tmp)
        os.replace(tmp, self.ckpt)

    def export(self) -> None:
        export(self.model, self.config, self.data.tok_dir, self.data.held_path, self.outp)


def _token_weight(digit_weight: float, tok: Tokenizer, vocab_size: int) -> torch.Tensor | None:
    """Digit targets (the arithmetic's results) weigh `digit_weight` in the loss, the others 1."""
    if digit_weight == 1.0:
        return None
    w = torch.ones(vocab_size)
    w[[tok.vocab[str(d)] for d in range(10)]] = digit_weight
    return w


@contextlib.contextmanager
def _stop_signals():
    """SIGTERM / SIGINT append to the yielded list instead of stopping (the loop then saves the
    checkpoint after the current step and returns: resumable); the old handlers come back after."""
    stop: list[int] = []
    old = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            old[sig] = signal.signal(sig, lambda signum, _frame: stop.append(signum))
        except ValueError:  # not the main thread
            pass
    try:
        yield stop
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def _loop(tr: _Trainer, stop: list[int]) -> dict:
    """Train until the run's length (or a signal), logging, evaluating, saving and exporting on their
    clocks and at the last step; returns the last step's metrics and the last evaluation's."""
    cfg = tr.cfg
    t_save = t_export = t_eval = t_log = t_start = time.time()
    tok_log, last = 0, {}
    while tr.total is None or tr.step < tr.total:
        if tr.total is None and tr.step >= CALIB_STEPS and cfg.minutes is not None:
            rate = (time.time() - t_start) / max(1, tr.step)  # s/step measured so far
            tr.total = max(tr.step + 1, int(cfg.minutes * 60 / rate))
            _log(f"{cfg.minutes} min at {rate:.3f} s/step -> {tr.total} steps")
        loss, acc, lr, ntok = tr.train_step()
        tok_log += ntok
        last = {"step": tr.step, "loss": loss.item(), "acc": acc.item()}
        now, end = time.time(), tr.step == tr.total
        if tr.step % cfg.log_every == 0 or end:
            _log_progress(tr, loss.item(), acc.item(), lr, tok_log / (now - t_log), now - t_log)
            t_log, tok_log = now, 0
        if now - t_eval > cfg.eval_minutes * 60 or end:
            last.update(tr.evaluate())
            t_eval = time.time()
        if now - t_save > cfg.save_minutes * 60 or end or stop:
            tr.save()
            t_save = time.time()
        if stop:
            _log(f"signal {stop[0]}: checkpoint saved at step {tr.step}; rerun the command to resume")
            break
        if now - t_export > cfg.export_minutes * 60 or end:
            tr.export()
            _log(f"exported HF checkpoint to {tr.outp}")
            t_export = time.time()
    return last


def _log_progress(tr: _Trainer, loss: float, acc: float, lr: float, tps: float, since_log: float) -> None:
    total, step = tr.total, tr.step
    eta = (total - step) * since_log / tr.cfg.log_every / 60 if total else float("nan")
    _log(f"step {step}/{total} loss {loss:.4f} acc {acc:.3f} lr {lr:.2e} "
         f"tok/s {tps:.0f} tokens {tr.tokens / 1e6:.2f}M ETA {eta:.1f} min")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from specfold.args import positive_int
    C = TrainConfig  # the defaults are the config's
    p.add_argument("--out", required=True, help="output folder (checkpoint, HF export); rerun to resume")
    p.add_argument("--seed", type=int, default=C.seed)
    p.add_argument("--steps", type=positive_int, default=None,
                   help=f"training steps (deterministic length; default {DEFAULT_STEPS} unless --minutes)")
    p.add_argument("--minutes", type=float, default=None,
                   help="training length in minutes when --steps is not given")
    p.add_argument("--micro", action="store_true", help="micro config (smoke test)")
    p.add_argument("--batch-size", type=positive_int, default=C.batch_size)
    p.add_argument("--lr", type=float, default=C.lr)
    p.add_argument("--warmup", type=int, default=C.warmup)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (faster on CPUs with bf16 units)")
    p.add_argument("--threads", type=positive_int, default=C.threads)
    p.add_argument("--copies", type=int, default=C.copies, help="noisy copies per clean sequence")
    p.add_argument("--task", choices=list(TASKS), default=C.task,
                   help="choices: worked solutions with choice points (the shipped model's task); arith: the "
                        "earlier model's fixed-template task")
    p.add_argument("--size", choices=[k for k in SIZES if k != "micro"], default=C.size,
                   help="base: d=192, 4 layers (1.9M parameters); large: d=256, 6 layers (5.0M)")
    p.add_argument("--digit-weight", type=float, default=C.digit_weight,
                   help="loss weight of digit targets (the arithmetic's results) against 1 for the others")
    p.add_argument("--save-minutes", type=float, default=C.save_minutes)
    p.add_argument("--export-minutes", type=float, default=C.export_minutes)
    p.add_argument("--eval-minutes", type=float, default=C.eval_minutes)
    p.add_argument("--eval-problems", type=int, default=C.eval_problems)
    p.add_argument("--ship", action="store_true", help=f"copy the final export into {PACKAGE_MODEL_DIR}")


def run_args(a: argparse.Namespace) -> int:
    steps = DEFAULT_STEPS if a.steps is None and a.minutes is None else a.steps
    train(TrainConfig(a.out, a.seed, minutes=a.minutes, steps=steps, micro=a.micro, batch_size=a.batch_size,
                      lr=a.lr, warmup=a.warmup, autocast=a.bf16, threads=a.threads, copies=a.copies,
                      save_minutes=a.save_minutes, export_minutes=a.export_minutes,
                      eval_minutes=a.eval_minutes, eval_problems=a.eval_problems, ship=a.ship, task=a.task,
                      digit_weight=a.digit_weight, size=a.size))
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
