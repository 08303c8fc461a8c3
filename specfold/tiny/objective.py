"""The tiny model's training objective: block diffusion that matches inference.

- a sequence is `chat-templated prompt + worked answer + <|im_end|>`, padded with `<|endoftext|>` to a
  multiple of the block size N (the batch is padded to its longest sequence);
- it is run as `[clean ; noisy_1 ; ...]`: the clean copy is block-causal among itself (its last block
  dropped: no noisy query reads it); each noisy copy holds the blocks from the first block containing
  answer tokens on, with each block's answer/stop/padding positions masked at a ratio t ~ U(0, 1]
  drawn per (sequence, block); a noisy block-k query sees clean blocks < k and its own noisy block,
  and reuses the clean positions (RoPE is absolute);
- loss = cross-entropy on the masked positions (prompt positions are never masked; the stop token
  and the padding up to the end of the block that holds it are trained, so the model learns to stop).

Invariant (tests/tiny/test_objective.py): the logits of every noisy block equal the inference-time
forward of the same block state with a clean prefix, with specfold's attention and with the fused
SDPA attention used during training.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from specfold.models import transformer as _transformer
from specfold.models.tokenizer import Tokenizer
from specfold.models.transformer import Transformer

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


def loss_fn(model: Transformer, batch, autocast: bool,
            token_weight: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked-token cross entropy (mean over masked positions; with `token_weight` [V], the mean
    weighted by each target token's weight) and accuracy."""
    tokens, positions, mask, targets, lmask = batch
    L = tokens.shape[1] - targets.shape[1]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(tokens, positions, mask=mask, logits_at=torch.arange(L, tokens.shape[1]))
    logits = logits.float()[lmask]
    tgt = targets[lmask]
    if token_weight is None:
        loss = F.cross_entropy(logits, tgt)
    else:
        w = token_weight[tgt]
        loss = (F.cross_entropy(logits, tgt, reduction="none") * w).sum() / w.sum()
    acc = (logits.argmax(-1) == tgt).float().mean()
    return loss, acc
