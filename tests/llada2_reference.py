"""Cache-free references for LLaDA2, written from the description (docs/LLADA2.md), not from
specfold's model code: `reference_logits` is the whole forward in one function over the checkpoint's
own tensors (public names, fused q/k/v, partial RoPE on the first dims of each head, per-row
routing in plain Python), and `reference_decode` the official decode loop on top of it, sharing
only the pure rules of specfold/decoding/rules_llada2.py with the engine.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from specfold.decoding import rules_llada2 as R


def reference_logits(w: dict, cfg: dict, tokens: list[int], block: int) -> tuple[torch.Tensor, float]:
    """Logits [T, V] of `tokens` at positions 0..T-1 under block-causal attention (query q sees key
    j iff q // block >= j // block), and the smallest routing margin met (the gap at the group cut
    and at the expert cut; a result that depends on a tie would show a margin near 0)."""
    T, d = len(tokens), cfg["hidden_size"]
    H, Hkv, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    rot, eps = int(D * cfg["partial_rotary_factor"]), cfg["rms_norm_eps"]
    E, k, G, kg = cfg["num_experts"], cfg["num_experts_per_tok"], cfg["n_group"], cfg["topk_group"]

    def rms(v, weight):
        return weight * v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + eps)

    pos = torch.arange(T)
    allowed = (pos[:, None] // block) >= (pos[None, :] // block)
    inv = 1.0 / cfg["rope_theta"] ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    ang = pos.double()[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1)[:, None], torch.cat([ang.sin(), ang.sin()], -1)[:, None]

    def rope(v):  # [T, heads, D]: rotate-half on the first `rot` dims, the rest passes through
        a, rest = v[..., :rot], v[..., rot:]
        half = torch.cat([-a[..., rot // 2:], a[..., : rot // 2]], -1)
        return torch.cat([a * cos + half * sin, rest], -1)

    def swiglu(v, p):
        return (F.silu(v @ w[p + "gate_proj.weight"].T) * (v @ w[p + "up_proj.weight"].T)) @ w[p + "down_proj.weight"].T

    margin = math.inf
    x = w["model.word_embeddings.weight"][tokens]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        qkv = (h @ w[p + "attention.query_key_value.weight"].T).view(T, H + 2 * Hkv, D)
        q = rope(rms(qkv[:, :H], w[p + "attention.query_layernorm.weight"]))
        kk = rope(rms(qkv[:, H: H + Hkv], w[p + "attention.key_layernorm.weight"])).repeat_interleave(H // Hkv, 1)
        v = qkv[:, H + Hkv:].repeat_interleave(H // Hkv, 1)
        s = torch.einsum("qhd,khd->hqk", q, kk) / math.sqrt(D)
        att = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1)
        x = x + torch.einsum("hqk,khd->qhd", att, v).reshape(T, H * D) @ w[p + "attention.dense.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        if i < cfg["first_k_dense_replace"]:
            x = x + swiglu(h, p + "mlp.")
            continue
        out = swiglu(h, p + "mlp.shared_experts.")
        for t in range(T):  # routing of one row, in plain Python
            score = torch.sigmoid(w[p + "mlp.gate.weight"] @ h[t]).tolist()
            choice = [s_ + b for s_, b in zip(score, w[p + "mlp.gate.expert_bias"].tolist())]
            per = E // G
            gscore = [sum(sorted(choice[g * per:(g + 1) * per], reverse=True)[:2]) for g in range(G)]
            order = sorted(range(G), key=lambda g: -gscore[g])
            if kg < G:
                margin = min(margin, gscore[order[kg - 1]] - gscore[order[kg]])
            pool = [e for g in order[:kg] for e in range(g * per, (g + 1) * per)]
            ranked = sorted(pool, key=lambda e: -choice[e])
            if k < len(ranked):
                margin = min(margin, choice[ranked[k - 1]] - choice[ranked[k]])
            chosen = ranked[:k]
            total = sum(score[e] for e in chosen) + 1e-20
            for e in chosen:
                wt = score[e] / total * cfg["routed_scaling_factor"]
                out[t] = out[t] + wt * swiglu(h[t], p + f"mlp.experts.{e}.")
        x = x + out
    return rms(x, w["model.norm.weight"]) @ w["lm_head.weight"].T, margin


def read_block(logits: torch.Tensor, mask_id: int) -> tuple[list[int], list[float]]:
    """Per position: argmax with the mask token excluded, and its softmax probability (float64)."""
    lg = logits.double().clone()
    lg[:, mask_id] = float("-inf")
    probs = torch.softmax(lg, -1)
    top = probs.argmax(-1)
    return top.tolist(), probs.gather(1, top[:, None])[:, 0].tolist()


def reference_decode(w: dict, cfg: dict, prompt: list[int], *, rule: str, max_new_tokens: int, mask_id: int,
                     eos_id: int, block: int = 32, steps: int = 32, threshold: float = 0.95,
                     edit_threshold: float = 0.0, max_post_steps: int = 16, trace: list | None = None,
                     logprobs: dict | None = None) -> tuple[list[int], int]:
    """The official decode loop at temperature 0 with the cache-free forward. Returns (tokens after
    the prompt, cut before the first eos and at max_new_tokens; forwards run). `trace`, when given,
    receives one dict per step (block start, step, masked, frozen, prob, writes, edits, post).
    `logprobs`, when given, receives absolute position -> the log-probability (mask excluded) of the
    token last written there, in the forward of the step that wrote it (an edit overwrites)."""
    L = len(prompt)
    total = -(-(L + max_new_tokens) // block) * block  # the last block is decoded in full
    x = list(prompt) + [mask_id] * (total - L)
    steps = R.steps_for(steps, max_new_tokens)
    nfe = 0
    for start in range((L // block) * block, total, block):
        frozen = [start + i < L for i in range(block)]
        step, post = 0, 0
        while True:
            cur = x[start: start + block]
            masked = [t == mask_id for t in cur]
            if rule == "llada2" and (not any(masked) or step >= steps):
                break
            if rule == "llada2_edit":
                if not R.edit_wants_forward(any(masked), post, max_post_steps):
                    break
                post += not any(masked)
            logits, _ = reference_logits(w, cfg, x[: start + block], block)
            nfe += 1
            top, prob = read_block(logits[start:], mask_id)
            if rule == "llada2":
                st = R.llada2_step(masked, top, prob, step, steps, threshold)
            else:
                st = R.llada2_edit_step(cur, masked, frozen, top, prob, threshold, edit_threshold)
            for i, t in st.writes:
                x[start + i] = t
                if logprobs is not None:
                    lg = logits[start + i].double().clone()
                    lg[mask_id] = float("-inf")
                    logprobs[start + i] = float(torch.log_softmax(lg, -1)[t])
            if trace is not None:
                trace.append(dict(start=start, step=step, masked=masked, frozen=frozen, prob=prob,
                                  writes=st.writes, edits=st.edits, post=post))
            step += 1
            if st.done:
                break
        gen = x[L: start + block]
        if R.settled_stop(gen, mask_id, [eos_id]) is not None:
            break
    out = x[L: L + max_new_tokens]
    return (out[: out.index(eos_id)] if eos_id in out else out), nfe


def cached_decode(model, prompt: list[int], *, rule: str, max_new_tokens: int, mask_id: int, eos_id: int,
                  block: int = 32, steps: int = 32, threshold: float = 0.95, edit_threshold: float = 0.0,
                  max_post_steps: int = 16) -> tuple[list[int], dict]:
    """The same decode on specfold's model with a prefix cache, as the engine must run it: the cache
    holds whole blocks only (prefill = the prompt's whole blocks; the prompt's partial block is the
    first active window, its prompt positions frozen); each step forwards the current block alone
    against the cache; a finished block's K/V are written by one commit forward, except after a
    LLaDA2.1 post step that changed nothing, whose forward already ran on the final state (its K/V
    come from the hidden states it returned, `write_kv`). Returns (tokens, forward counts)."""
    L = len(prompt)
    total = -(-(L + max_new_tokens) // block) * block
    x = list(prompt) + [mask_id] * (total - L)
    steps = R.steps_for(steps, max_new_tokens)
    counts = dict(prefill=0, steps=0, commits=0, reused=0)
    cache = model.new_cache()
    first = (L // block) * block
    if first:
        pos = torch.arange(first)
        blk = pos // block
        model(torch.tensor([prompt[:first]]), pos, cache=cache, mask=blk[:, None] >= blk[None, :], write_cache=True)
        counts["prefill"] += 1
    for start in range(first, total, block):
        frozen = [start + i < L for i in range(block)]
        pos = torch.arange(start, start + block)
        step, post, written = 0, 0, False
        while True:
            cur = x[start: start + block]
            masked = [t == mask_id for t in cur]
            if rule == "llada2" and (not any(masked) or step >= steps):
                break
            if rule == "llada2_edit":
                if not R.edit_wants_forward(any(masked), post, max_post_steps):
                    break
                post += not any(masked)
            logits, hidden = model(torch.tensor([cur]), pos, cache=cache, return_hidden=True)
            counts["steps"] += 1
            top, prob = read_block(logits[0], mask_id)
            if rule == "llada2":
                st = R.llada2_step(masked, top, prob, step, steps, threshold)
            else:
                st = R.llada2_edit_step(cur, masked, frozen, top, prob, threshold, edit_threshold)
            for i, t in st.writes:
                x[start + i] = t
            step += 1
            if st.done:
                if not st.writes:  # this forward saw the final state: its K/V are the commit's
                    model.write_kv(cache, [h[0] for h in hidden[:-1]], pos)
                    counts["reused"] += 1
                    written = True
                break
        if not written:
            model(torch.tensor([x[start: start + block]]), pos, cache=cache, write_cache=True)
            counts["commits"] += 1
        if R.settled_stop(x[L: start + block], mask_id, [eos_id]) is not None:
            break
    out = x[L: L + max_new_tokens]
    return (out[: out.index(eos_id)] if eos_id in out else out), counts
