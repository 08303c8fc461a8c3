"""A cache-free reference decoder for block-causal models (SPEC §3): every step recomputes the whole
sequence [0, block end) under the block-causal mask; no prefix cache, no stored logits. It shares only
the unmask rules with the engine (tested on their own in test_rules.py)."""
from __future__ import annotations

import torch

from specfold.decoding.layout import block_causal
from specfold.decoding.readout import score
from specfold.decoding.rules import make_rule


def reference_decode(model, spec, p, prompt: list[int], logprobs: dict | None = None) -> list[int]:
    """`logprobs` (a dict): filled with absolute position -> the log-probability (mask excluded,
    temperature 1) of the token the step that wrote it chose, in that step's forward."""
    c = p.resolve(spec)
    N, L, M = c.block_size, len(prompt), spec.mask_token_id
    limit = L + p.max_new_tokens
    stop = set(spec.stop_token_ids)
    shift = 1 if spec.logits_shift else 0
    rule = make_rule(c)
    seq = list(prompt)
    start = (L // N) * N

    def full_logits(tokens: list[int]) -> torch.Tensor:
        t = torch.tensor(tokens)[None]
        pos = torch.arange(len(tokens))
        return model(t, pos, mask=block_causal(pos, N))[0]

    with torch.inference_mode():
        while True:
            block = seq[start:] + [M] * (start + N - len(seq))
            if spec.seed_token and start >= L:
                lg = full_logits(seq[:start])[-1].clone()
                lg[M] = float("-inf")
                block[0] = int(lg.argmax())
                if logprobs is not None:
                    logprobs[start] = float(torch.log_softmax(lg.double(), -1)[block[0]])
            allowed = [start + i >= L and start + i < limit for i in range(N)]
            state = list(block)
            step, n0 = 0, sum(1 for t, a in zip(state, allowed) if a and t == M)
            while True:
                masked = [t == M and a for t, a in zip(state, allowed)]
                if not any(masked):
                    break
                gen = [(i, t) for i, t in enumerate(state) if allowed[i] or (start + i >= L and t != M)]
                first_stop = next((i for i, t in gen if t in stop), None)
                if p.early_stop and first_stop is not None and not any(
                        state[j] == M for j, _ in gen if j < first_stop):
                    break
                pos = [i for i, f in enumerate(rule.region(masked, 0)) if f]
                logits = full_logits(seq[:start] + state)[[start + i - shift for i in pos]]
                s = score(logits, pos, M, c.confidence)
                nxt = rule.apply(state, s, step, n0)
                if logprobs is not None:
                    lg = logits.double().clone()
                    lg[:, M] = float("-inf")
                    lp = torch.log_softmax(lg, -1)
                    for r, i in enumerate(pos):
                        if nxt[i] != state[i]:
                            logprobs[start + i] = float(lp[r, nxt[i]])
                state = nxt
                step += 1
            seq = seq[:start] + state
            out = [t for t in seq[L:limit]]
            cut = next((i for i, t in enumerate(out) if t in stop), None)
            if cut is not None:
                return out[:cut]
            if start + N >= limit:
                return out
            start += N
