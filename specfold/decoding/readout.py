"""What a program reads from logits, computed on the device for every row of a step, read back once.

A program never reads a tensor. With each forward it asks for a `Read`: for every logits row the
forward returns, the argmax token with the mask token excluded and its confidence (of the engine's
confidence kind), optionally the K most likely ids with their probabilities, and at temperature
T > 0 a sampled token and its confidence. The runner computes `read_rows` for all forwards of a step,
concatenates the results and copies them to the host in one read (`ModelRunner`); `split_rows`
turns the flat host list back into per-row values.

Sampling at T > 0 is Gumbel-max with noise that is a function of a per-row key alone (`Read.keys`):
the block program keys a row by (seed, block start, exact block state, position), the causal programs
by (seed, position). So a row's sampled token does not depend on which forward computed it, which is
what keeps speculative methods lossless against vanilla at any temperature and any batch.

Log-probabilities (`Read.logprobs = N`, only for requests that asked for them, so other rows cost
nothing more): the chosen token's (the argmax at T = 0, the sampled token at T > 0) log-probability
under the raw logits at temperature 1 with the mask token excluded (the distribution the engine picks
from, before any temperature), and the N most likely ids with theirs. On the host a row's
`logprobs` is a dict token id -> log-probability: the N most likely in rank order (ties: lower id
first), then the chosen token if it is not among them.

Row layout (float64): [tok0, conf0, (tokT, confT if T > 0), top ids × K, top probs × K if probs,
(chosen logprob, top-N ids × N, top-N logprobs × N if logprobs is not None)].
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

_STRIDE = 1_000_003  # (seed, position) -> one generator seed (causal programs)


@dataclass(slots=True)
class Read:
    kind: str = "max_prob"  # confidence kind: max_prob | margin | neg_entropy
    temperature: float = 0.0
    topk: int = 0  # K most likely ids per row (0 = none)
    probs: bool = False  # also their probabilities (at T = 0)
    keys: list[int] | None = None  # per row (b-major), the noise key at T > 0
    logprobs: int | None = None  # the chosen token's log-probability and the N most likely (None = none)

    @property
    def width(self) -> int:
        lp = 0 if self.logprobs is None else 1 + 2 * self.logprobs
        return 2 + (2 if self.temperature > 0 else 0) + self.topk * (2 if self.probs else 1) + lp


@dataclass(slots=True)
class Row:
    token: int  # argmax (T = 0), mask excluded
    conf: float
    token_t: int  # the sampled token at T > 0 (= token at T = 0)
    conf_t: float
    top: list[int] | None
    top_probs: list[float] | None
    logprobs: dict[int, float] | None = None  # token id -> log-probability (Read.logprobs; see above)


def position_key(seed: int, position: int) -> int:
    return seed * _STRIDE + position


def state_key(seed: int, start: int, state: list[int], position: int) -> int:
    """Noise key of a row that scores absolute `position` of the block state `state` at `start`."""
    h = hash((seed, start, tuple(state))) & 0x7FFF_FFFF_FFFF
    return (h * _STRIDE + position) & 0x7FFF_FFFF_FFFF_FFFF


def read_rows(logits: torch.Tensor, mask_id: int, r: Read, owned: bool = False) -> torch.Tensor:
    """logits [R, V] -> [R, r.width] float64 on the same device (no host read). `owned`: the caller
    will not use `logits` again, so the mask token's column is overwritten in place (no copy)."""
    f = torch.float64 if logits.dtype == torch.float64 else torch.float32
    lg = logits.to(f)
    index = _index(mask_id, logits.device)
    lg = lg.index_fill_(1, index, float("-inf")) if owned or lg is not logits else lg.index_fill(1, index, float("-inf"))
    logp = torch.log_softmax(lg, dim=-1)
    tok0 = lg.argmax(-1)
    # every probability only for the reads that need it (see _conf)
    probs = logp.exp() if r.kind != "max_prob" or (r.topk and r.probs) else None
    # max_prob of the argmax: its log-probability is the row's largest (0 - logsumexp; every other
    # entry is (x - max) - logsumexp <= that), so amax reads it without a gather
    conf0 = logp.amax(-1).exp().double() if r.kind == "max_prob" else _conf(probs, logp, tok0, r.kind)
    cols = [tok0.double(), conf0]
    if r.temperature > 0:
        lt = lg / r.temperature
        logpt = torch.log_softmax(lt, dim=-1)
        tokt = _gumbel(logpt.double(), r.keys)
        cols += [tokt.double(), _conf(None if r.kind == "max_prob" else logpt.exp(), logpt, tokt, r.kind)]
    out = torch.stack(cols, dim=1)
    parts = [out]
    if r.topk:
        top = lg.topk(min(r.topk, lg.shape[-1]), dim=-1).indices
        top[:, 0] = tok0  # ties: the argmax (lowest index) is vocabulary rank 0
        parts.append(top.double())
        if r.probs:
            parts.append(probs.gather(-1, top).double())
    if r.logprobs is not None:
        chosen = tokt if r.temperature > 0 else tok0
        parts.append(logp.gather(-1, chosen[:, None]).double())
        if r.logprobs:
            best = logp.topk(min(r.logprobs, logp.shape[-1]), dim=-1)
            parts += [best.indices.double(), best.values.double()]
    return torch.cat(parts, dim=1) if len(parts) > 1 else out


_INDEX: dict[tuple[int, str], torch.Tensor] = {}


def _index(i: int, device: torch.device) -> torch.Tensor:
    """A one-element index tensor on `device`, made once (no host-to-device copy per read)."""
    key = (i, str(device))
    t = _INDEX.get(key)
    if t is None:
        t = _INDEX[key] = torch.tensor([i], device=device)
    return t


def _conf(probs: torch.Tensor | None, logp: torch.Tensor, tok: torch.Tensor, kind: str) -> torch.Tensor:
    """Per row, the confidence of `tok`. max_prob is exp of the gathered log-probability: the same
    number as gathering from exp(logp), without exponentiating every vocabulary entry."""
    if kind == "max_prob":
        c = logp.gather(-1, tok[:, None])[:, 0].exp()
    elif kind == "margin":
        top2 = probs.topk(min(2, probs.shape[-1]), dim=-1).values
        c = top2[:, 0] - top2[:, -1] if top2.shape[1] > 1 else top2[:, 0]
    elif kind == "neg_entropy":
        c = torch.where(probs > 0, probs * logp, torch.zeros_like(probs)).sum(-1)
    else:
        raise ValueError(kind)
    return c.double()


def _gumbel(logp: torch.Tensor, keys: list[int] | None) -> torch.Tensor:
    """Gumbel-max per row with noise from a generator seeded by the row's key (on logp's device)."""
    if keys is None or len(keys) != logp.shape[0]:
        raise ValueError("a read at temperature > 0 needs one noise key per row")
    dev, V = logp.device, logp.shape[1]
    u = torch.empty_like(logp)
    for i, k in enumerate(keys):
        g = torch.Generator(device=dev).manual_seed(int(k))
        u[i] = torch.rand(V, generator=g, dtype=torch.float64, device=dev)
    u.clamp_(1e-20, 1.0)
    return (logp - torch.log(-torch.log(u))).argmax(-1)


def split_rows(flat: list[float], n: int, r: Read) -> list[Row]:
    """The host list of `n` rows of layout `r` -> Row objects."""
    w, out = r.width, []
    if w == 2:  # [token, conf] rows (the common read)
        return [Row(int(t), c, int(t), c, None, None) for t, c in zip(flat[0::2], flat[1::2])]
    k = r.topk
    for i in range(n):
        v = flat[i * w: (i + 1) * w]
        tok, conf = int(v[0]), v[1]
        j = 2
        tok_t, conf_t = tok, conf
        if r.temperature > 0:
            tok_t, conf_t, j = int(v[2]), v[3], 4
        top = [int(x) for x in v[j: j + k]] if k else None
        tp = v[j + k: j + 2 * k] if k and r.probs else None
        j += k * (2 if r.probs else 1)
        lp = _logprobs(v[j:], tok_t, r.logprobs) if r.logprobs is not None else None
        out.append(Row(tok, conf, tok_t, conf_t, top, tp, lp))
    return out


def _logprobs(v: list[float], chosen: int, n: int) -> dict[int, float]:
    """[chosen logprob, ids × n, logprobs × n] -> {id: logprob}: the n most likely by rank (ties to the
    lower id), then the chosen token if it is not among them. The mask token (-inf) never appears."""
    top = sorted(((int(i), x) for i, x in zip(v[1: 1 + n], v[1 + n: 1 + 2 * n]) if x != float("-inf")),
                 key=lambda p: (-p[1], p[0]))
    out = dict(top)
    out.setdefault(chosen, v[0])
    return out


def read_now(logits: torch.Tensor, mask_id: int, r: Read) -> list[Row]:
    """Read rows right away (tests and reference code; the engine batches reads per step)."""
    return split_rows(read_rows(logits, mask_id, r).reshape(-1).tolist(), logits.shape[0], r)


def score(logits: torch.Tensor, positions: list[int], mask_id: int, kind: str = "max_prob", topk: int = 0):
    """Rows of logits [C, V] at candidate `positions` -> host `rules.Scored` at T = 0 (tests and
    reference code; programs get theirs from the engine's one read per step)."""
    from specfold.decoding.rules import Scored
    rows = read_now(logits, mask_id, Read(kind=kind, topk=topk))
    return Scored(list(positions), [r.token for r in rows], [r.conf for r in rows],
                  [r.top for r in rows] if topk else None)
