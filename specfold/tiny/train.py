"""Train the embedded tiny block-diffusion model: `specfold train-tiny --out DIR --seed S`.

Regenerates everything from the seed: data (specfold.tiny.data), tokenizer (specfold.tiny.tokenizer)
and weights, trained with specfold's own `Transformer` and the block-diffusion objective that matches
inference (block-causal attention aligned to absolute position 0, no logits shift):

- a sequence is `chat-templated prompt + worked answer + <|im_end|>`, padded with `<|endoftext|>` to a
  multiple of the block size N (the batch is padded to its longest sequence);
- it is run as `[clean ; noisy]`: the clean copy is block-causal among itself; the noisy copy holds the
  blocks from the first block containing answer tokens on, with each block's answer/stop positions
  masked at a ratio t ~ U(0, 1] drawn per (sequence, block); a noisy block-k query sees clean blocks
  < k and its own noisy block. The noisy copy reuses the clean positions (RoPE is absolute);
- loss = cross-entropy on the masked positions (prompt positions are never masked; the stop token
  and the padding up to the end of the block that holds it are trained, so the model learns to stop).

Progress (loss, tokens/s, ETA, held-out masked-token accuracy and, every few minutes, greedy decoding
accuracy on held-out problems) goes to stdout. A resumable checkpoint (model, optimizer, step, data and
torch RNG state) is written to `DIR/ckpt.pt` every `--save-minutes`, and the HF checkpoint folder
(config.json, model.safetensors, tokenizer files, heldout.jsonl) is exported into DIR every
`--export-minutes` and at the end. Rerunning the same command resumes.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from specfold.models import transformer as _transformer
from specfold.models.spec import ModelSpec, resolve_spec
from specfold.models.tokenizer import Tokenizer
from specfold.models.transformer import Transformer
from specfold.tiny import data as D
from specfold.tiny import tokenizer as T

PACKAGE_MODEL_DIR = Path(__file__).resolve().parent / "model"

# Model sizes. "base" is the shipped model; "micro" is for the test suite.
SIZES = {
    "base": dict(hidden_size=192, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=512),
    "micro": dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                  intermediate_size=64),
}
DEFAULT_STEPS = 2700  # the shipped model's length
BLOCK_SIZE = 16
SUB_BLOCK_SIZE = 8
VOCAB_PAD = 64  # config vocab_size is the tokenizer size rounded up to this


def model_config(size: str, vocab_size: int, mask_id: int, stop_ids: list[int], eos_id: int,
                 pad_id: int) -> dict:
    s = SIZES[size]
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        **s,
        "head_dim": s["hidden_size"] // s["num_attention_heads"],
        "vocab_size": int(math.ceil(vocab_size / VOCAB_PAD) * VOCAB_PAD),
        "hidden_act": "silu",
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": s["num_hidden_layers"],
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "float32",
        "bos_token_id": None,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        # diffusion fields read by specfold (models/spec.py)
        "mask_token_id": mask_id,
        "stop_token_ids": stop_ids,
        "block_size": BLOCK_SIZE,
        "sub_block_size": SUB_BLOCK_SIZE,
        "logits_shift": False,
        "attention": "block_causal",
        "alignment": "absolute",
        "seed_token": False,
        "rule": "sub_block",
        "threshold": 0.9,
    }


_ATTENTION = _transformer.attention


def _fused_attention(q, k, v, pk, pv, mask, scale):
    """`specfold.models.transformer.attention` without a prefix cache, through torch's fused SDPA
    (the same math, ~20% faster for a training step on one CPU thread); with a prefix it defers to
    the original."""
    if pk is not None:
        return _ATTENTION(q, k, v, pk, pv, mask, scale)
    B, H, T, D_ = q.shape
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                         enable_gqa=k.shape[1] != H)
    return out.transpose(1, 2).reshape(B, T, H * D_)


class fused_attention:
    """Context manager: the Transformer uses `_fused_attention` inside (training and monitoring)."""

    def __enter__(self):
        _transformer.attention = _fused_attention

    def __exit__(self, *exc):
        _transformer.attention = _ATTENTION


def init_weights(model: Transformer, std: float = 0.02) -> None:
    n = model.spec.num_layers
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                p.normal_(0.0, std / math.sqrt(2 * n))
            else:
                p.normal_(0.0, std)


# ----------------------------------------------------------------------------------------- batches
class Encoder:
    """Problem -> (token ids, prompt length) through the checkpoint's own chat template."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self.im_end = tok.token_to_id("<|im_end|>")
        self.pad = tok.token_to_id("<|endoftext|>")
        self.mask = tok.token_to_id("<|mask|>")

    def prompt(self, question: str) -> list[int]:
        return self.tok.encode(self.tok.apply_chat_template([{"role": "user", "content": question}]))

    def example(self, p: dict) -> tuple[list[int], int]:
        ids = self.prompt(p["question"])
        return ids + self.tok.encode(p["answer"]) + [self.im_end], len(ids)


def train_mask(L: int, start: int, N: int, copies: int = 1) -> torch.Tensor:
    """Attention mask of `[clean (positions 0..L-N) ; noisy copy 1 (start..L) ; ...]`, True = may attend.

    The last clean block is left out: only noisy queries carry loss, and a noisy block-k query sees
    clean blocks < k only."""
    C = L - N
    cb = torch.arange(C) // N
    nb = (torch.arange(start, L) // N).repeat(copies)
    cid = torch.arange(copies).repeat_interleave(L - start)
    T_ = C + copies * (L - start)
    m = torch.zeros(T_, T_, dtype=torch.bool)
    m[:C, :C] = cb[:, None] >= cb[None, :]
    m[C:, :C] = nb[:, None] > cb[None, :]
    m[C:, C:] = (nb[:, None] == nb[None, :]) & (cid[:, None] == cid[None, :])
    return m


def make_batch(examples: list[tuple[list[int], int]], enc: Encoder, N: int, gen: torch.Generator,
               copies: int = 1):
    """Returns tokens [B, T], positions [T], mask [T, T], targets [B, n], loss mask [B, n] where
    the last n = copies * (L - start) window positions are the noisy copies."""
    B = len(examples)
    L = max(math.ceil(len(ids) / N) * N for ids, _ in examples)
    start = min(pl // N for _, pl in examples) * N
    clean = torch.full((B, L), enc.pad, dtype=torch.long)
    valid = torch.zeros(B, L, dtype=torch.bool)
    for b, (ids, pl) in enumerate(examples):
        clean[b, : len(ids)] = torch.tensor(ids)
        end = math.ceil(len(ids) / N) * N  # the stop token's block, padding included
        valid[b, pl:end] = True
    nblocks = L // N
    noisy, masks = [], []
    for _ in range(copies):
        ratio = 1.0 - torch.rand(B, nblocks, generator=gen)  # (0, 1] per (sequence, block)
        ratio = ratio.repeat_interleave(N, dim=1)
        masked = (torch.rand(B, L, generator=gen) < ratio) & valid
        noisy.append(torch.where(masked, torch.full_like(clean, enc.mask), clean)[:, start:])
        masks.append(masked[:, start:])
    tokens = torch.cat([clean[:, : L - N]] + noisy, dim=1)
    positions = torch.cat([torch.arange(L - N)] + [torch.arange(start, L)] * copies)
    targets = clean[:, start:].repeat(1, copies)
    return tokens, positions, train_mask(L, start, N, copies), targets, torch.cat(masks, dim=1)


def loss_fn(model: Transformer, batch, autocast: bool) -> tuple[torch.Tensor, torch.Tensor]:
    tokens, positions, mask, targets, lmask = batch
    L = tokens.shape[1] - targets.shape[1]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(tokens, positions, mask=mask, logits_at=torch.arange(L, tokens.shape[1]))
    logits = logits.float()[lmask]
    tgt = targets[lmask]
    loss = F.cross_entropy(logits, tgt)
    acc = (logits.argmax(-1) == tgt).float().mean()
    return loss, acc


# ------------------------------------------------------------------------- monitoring decoder
@torch.no_grad()
def greedy_decode(model: Transformer, spec: ModelSpec, prompt: list[int], max_new: int = 96,
                  rule: str = "sub_block") -> tuple[list[int], int]:
    """Reference-free monitoring decoder (no cache; the engine's own decoder is the real one).

    rule "sub_block": threshold(spec.threshold) in the first sub-block with masks; "static": one
    token per forward. Returns (generated ids truncated at the first stop token, forwards)."""
    N, M = spec.block_size, spec.mask_token_id
    sub = spec.sub_block_size or N
    stops = set(spec.stop_token_ids)
    seq = list(prompt)
    end = len(prompt) + max_new
    nfe = 0
    while len(seq) < end:
        b0 = (len(seq) // N) * N
        blk = seq[b0:] + [M] * (b0 + N - len(seq))
        limit = end - b0  # positions of this block past max_new stay unfilled
        while any(t == M for t in blk[: min(N, limit)]):
            x = torch.tensor([seq[:b0] + blk])
            pos = torch.arange(x.shape[1])
            blkid = pos // N
            am = blkid[:, None] >= blkid[None, :]
            logits = model(x, pos, mask=am, logits_at=torch.arange(b0, b0 + N))[0].float()
            nfe += 1
            logits[:, M] = float("-inf")
            probs = torch.softmax(logits, -1)
            conf, tok = probs.max(-1)
            masked = [i for i in range(min(N, limit)) if blk[i] == M]
            if rule == "sub_block":
                first = masked[0] // sub * sub
                cand = [i for i in masked if first <= i < first + sub]
            else:
                cand = masked
            best = max(cand, key=lambda i: (conf[i].item(), -i))
            pick = {best}
            if rule == "sub_block":
                pick |= {i for i in cand if conf[i].item() > spec.threshold}
            for i in pick:
                blk[i] = int(tok[i])
        seq = seq[:b0] + blk[: min(N, limit)]
        gen = seq[len(prompt):]
        hit = [i for i, t in enumerate(gen) if t in stops]
        if hit:
            return gen[: hit[0]], nfe
    return seq[len(prompt):], nfe


def decode_accuracy(model, spec, enc: Encoder, problems: list[dict], rule: str) -> tuple[float, float]:
    """(accuracy of the final answer, generated tokens per forward) on `problems`."""
    model.eval()
    ok = toks = nfes = 0
    for p in problems:
        ids, nfe = greedy_decode(model, spec, enc.prompt(p["question"]), rule=rule)
        text = enc.tok.decode(ids)
        ok += D.final_answer(text) == D.final_answer(p["answer"])
        toks += len(ids) + 1
        nfes += nfe
    model.train()
    return ok / len(problems), toks / max(nfes, 1)


# ------------------------------------------------------------------------------------- export
def export(model: Transformer, config: dict, tok_dir: Path, heldout_path: Path, out: Path) -> None:
    """Write the HF checkpoint folder (Qwen2 names) into `out`, atomically per file."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    names = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
             "lm_head.weight": "lm_head.weight"}
    parts = {"q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
             "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
             "down_proj": "mlp.down_proj", "input_norm": "input_layernorm",
             "post_norm": "post_attention_layernorm"}
    for name, p in model.state_dict().items():
        if name in names:
            hf = names[name]
        else:
            _, i, part, kind = name.split(".")
            hf = f"model.layers.{i}.{parts[part]}.{kind}"
        tensors[hf] = p.detach().float().contiguous().clone()
    tmp = out / "model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": config["stop_token_ids"], "pad_token_id": config["pad_token_id"]}, indent=2) + "\n")
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tok_dir / f).resolve() != (out / f).resolve():
            shutil.copy(tok_dir / f, out / f)
    if heldout_path.resolve() != (out / "heldout.jsonl").resolve():
        shutil.copy(heldout_path, out / "heldout.jsonl")


# -------------------------------------------------------------------------------------- training
def _lr(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    prog = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * prog)))


def _log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def train_tiny(out: str, seed: int = 0, minutes: float | None = None, steps: int | None = None,
               micro: bool = False, batch_size: int = 32, lr: float = 2e-3, warmup: int = 200,
               autocast: bool | None = None, threads: int = 1, save_minutes: float = 3.0,
               export_minutes: float = 10.0, eval_minutes: float = 10.0, eval_problems: int = 40,
               ship: bool = False, log_every: int = 20, copies: int = 2) -> dict:
    """Train (or resume) the tiny model into `out`; returns the last metrics (see `_train_tiny`)."""
    with fused_attention():
        return _train_tiny(out, seed, minutes, steps, micro, batch_size, lr, warmup, autocast, threads,
                           save_minutes, export_minutes, eval_minutes, eval_problems, ship, log_every,
                           copies)


def _train_tiny(out, seed, minutes, steps, micro, batch_size, lr, warmup, autocast, threads,
                save_minutes, export_minutes, eval_minutes, eval_problems, ship, log_every, copies):
    """Train (or resume) the tiny model into `out`; returns a summary dict of the last metrics.

    Length: `steps` (deterministic) or, without it, `minutes` (the step count is then fixed from the
    throughput measured over the first steps and stored, so resuming continues the same schedule).
    """
    torch.set_num_threads(threads)
    outp = Path(out)
    outp.mkdir(parents=True, exist_ok=True)
    size = "micro" if micro else "base"
    if autocast is None:
        autocast = False
    # --- data and tokenizer (deterministic from the seed)
    held = D.heldout(seed, 40 if micro else D.HELDOUT_SIZE)
    held_path = outp / "heldout.jsonl"
    D.save_jsonl(held, held_path)
    exclude = {p["question"] for p in held}
    tok_dir = outp / "tokenizer"
    if not (tok_dir / "tokenizer.json").is_file():
        tok_rng = random.Random(f"tokenizer-{seed}")
        sample = []
        while len(sample) < (2000 if micro else 20000):
            p = D.make_problem(tok_rng)
            if p["question"] not in exclude:
                sample.append(p)
        hf_tok = T.train_tokenizer(T.corpus(sample))
        T.save_tokenizer(hf_tok, tok_dir)
    tok = Tokenizer.load(tok_dir)
    enc = Encoder(tok)
    stop_ids = [enc.im_end, enc.pad]
    config = model_config(size, len(tok.vocab), enc.mask, stop_ids, enc.im_end, enc.pad)
    spec = resolve_spec(config)
    torch.manual_seed(seed)
    model = Transformer(spec)
    init_weights(model)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    stream = D.TrainStream(seed, exclude)
    gen = torch.Generator().manual_seed(seed)
    step, total, tokens_seen, elapsed = 0, steps, 0, 0.0
    ckpt = outp / "ckpt.pt"
    if ckpt.is_file():
        st = torch.load(ckpt, weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        stream.set_state(st["data_state"])
        gen.set_state(st["gen_state"])
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
                    "torch_rng": torch.get_rng_state(), "config": config}, tmp)
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
        loss, acc = loss_fn(model, batch, autocast)
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
        PACKAGE_MODEL_DIR.mkdir(parents=True, exist_ok=True)
        for f in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                  "tokenizer_config.json", "special_tokens_map.json", "heldout.jsonl"):
            shutil.copy(outp / f, PACKAGE_MODEL_DIR / f)
        _log(f"shipped to {PACKAGE_MODEL_DIR}")
    last["first_losses"] = first_losses
    return last


def add_arguments(p: argparse.ArgumentParser) -> None:
    from specfold.cli import positive_int
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
               eval_minutes=a.eval_minutes, eval_problems=a.eval_problems, ship=a.ship)
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
