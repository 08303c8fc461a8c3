"""The Bayes-optimal denoiser of the tiny task, to design the task and to read a trained model's curve.

For one problem, `specfold.tiny.choices.enumerate_answers` lists every answer the generator can write,
with its probability. Tokenised (answer + `<|im_end|>`, then `<|endoftext|>` padding), they give the
exact posterior a perfect model would have: at a masked position, the marginal of the answers that
agree with every token decoded so far. `oracle_decode` runs block decoding (blocks of N aligned to
absolute position 0, the prompt fixed) with that posterior under the engine's rules:

- `static`: one token per forward, the most confident masked position of the block (ties: leftmost);
- `threshold`: the most confident one plus every masked position of the block with confidence > τ;
- `sub_block`: the same inside the first sub-block that still has masks.

Several positions unmasked in one forward can form a combination that no answer has (each is likely
alone, not together): the decode is then `broken` and counted wrong. That is the failure of parallel
decoding that lossless speculative decoding avoids, in its pure form (a trained model adds its own
errors). Invariant: with `static` a decode is never broken and always yields a generator answer.
"""
from __future__ import annotations

import numpy as np

from specfold.tiny import choices as C
from specfold.tiny import data as D


def answer_matrix(facts: dict, encode, im_end: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens [K, L] of every answer + stop, padded; probabilities [K])."""
    answers = C.enumerate_answers(facts)
    seqs = [encode(t) + [im_end] for t in answers]
    L = max(len(s) for s in seqs)
    S = np.full((len(seqs), L + 32), pad, dtype=np.int64)
    for k, s in enumerate(seqs):
        S[k, : len(s)] = s
    return S, np.array(list(answers.values()))


def oracle_decode(S: np.ndarray, w: np.ndarray, prompt_len: int, rule: str, threshold: float = 0.9,
                  N: int = 16, sub: int = 8, stops: frozenset = frozenset()) -> dict:
    """Decode one problem with the exact posterior. Returns {"tokens": answer ids (up to the first
    stop), "nfe": forwards, "broken": bool}."""
    alive = np.ones(len(w), dtype=bool)
    out: list[int] = []
    nfe = 0
    b0 = (prompt_len // N) * N
    while True:
        lo, hi = max(0, b0 - prompt_len), b0 + N - prompt_len
        if hi > S.shape[1]:
            return {"tokens": out, "nfe": nfe, "broken": True}
        masked = list(range(lo, hi))
        while masked:
            ww = np.where(alive, w, 0.0)
            tot = ww.sum()
            if tot <= 0:
                return {"tokens": out, "nfe": nfe, "broken": True}
            nfe += 1
            conf, tok = {}, {}
            for j in masked:
                counts = np.bincount(S[:, j], weights=ww)
                t = int(counts.argmax())
                conf[j], tok[j] = counts[t] / tot, t
            if rule == "sub_block":
                first = ((masked[0] + prompt_len) // sub) * sub - prompt_len
                cand = [j for j in masked if first <= j < first + sub]
            else:
                cand = masked
            best = max(cand, key=lambda j: (conf[j], -j))
            pick = {best}
            if rule != "static":
                pick |= {j for j in cand if conf[j] > threshold}
            for j in pick:
                alive &= S[:, j] == tok[j]
                masked.remove(j)
            if not alive.any():
                return {"tokens": out, "nfe": nfe, "broken": True}
        k = int(np.flatnonzero(alive)[0])
        block = S[k, lo:hi].tolist()
        hit = [i for i, t in enumerate(block) if t in stops]
        if hit:
            return {"tokens": out + block[: hit[0]], "nfe": nfe, "broken": False}
        out += block
        b0 += N


def curve(problems: list[dict], tok, rules: dict[str, dict], N: int = 16, sub: int = 8) -> dict:
    """{rule name: {"accuracy", "broken", "tokens_per_forward"}} of the oracle on `problems`
    (each with "facts"); `tok` is a specfold Tokenizer with the tiny model's special tokens."""
    im_end, pad = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    stops = frozenset({im_end, pad})
    res = {name: {"ok": 0, "broken": 0, "tokens": 0, "nfe": 0} for name in rules}
    for p in problems:
        S, w = answer_matrix(p["facts"], tok.encode, im_end, pad)
        plen = len(tok.encode(tok.apply_chat_template([{"role": "user", "content": p["question"]}])))
        truth = str(C.result(p["facts"]))
        for name, r in rules.items():
            o = oracle_decode(S, w, plen, r["rule"], r.get("threshold", 0.9), N, sub, stops)
            acc = res[name]
            acc["ok"] += (not o["broken"]) and D.final_answer(tok.decode(o["tokens"])) == truth
            acc["broken"] += o["broken"]
            acc["tokens"] += len(o["tokens"]) + 1
            acc["nfe"] += o["nfe"]
    n = len(problems)
    return {name: {"accuracy": a["ok"] / n, "broken": a["broken"] / n,
                   "tokens_per_forward": a["tokens"] / max(a["nfe"], 1)} for name, a in res.items()}
