"""Reference-free monitoring decoder used while training (no cache; the engine's decoder is the real one)."""
from __future__ import annotations

import torch

from specfold.models.spec import ModelSpec
from specfold.models.transformer import Transformer
from specfold.tiny import data as D
from specfold.tiny.objective import Encoder


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
