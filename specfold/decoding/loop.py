"""The one advance loop (SPEC §3-5): every decode method is this loop with a draft policy and a verifier.

Per request: prefill the prompt into the prefix cache, then block by block
    root = current block state
    if root's logits are not stored: verify [root] + drafts(root) in one batched forward (1 NFE) and
        store every (exact state -> logits at its candidate positions);
    next = rule(root, logits(root)); repeat while the next state's logits are stored (no NFE);
    when the block has no mask left in its allowed region: commit it (1 NFE writes its K/V and, for
    families with a seed token, yields the next block's first token).
Vanilla decoding has no drafts, so every step is one forward.

Invariants:
- the rule only ever reads the logits of the exact state it is applied to (store keyed by the whole
  window, its start position and nothing else);
- rules are applied in the same order with the same generator in every method, so trajectories are
  identical to vanilla's given identical logits;
- positions at or beyond `prompt_len + max_new_tokens` are never unmasked; the output is truncated at
  the first stop token (excluded), and nothing after a committed stop token changes the output, so a
  block stops early once a stop token has no mask before it (`early_stop`).
Bidirectional families decode the whole canvas (prompt + max_new_tokens masks) with no cache, one
semi-autoregressive block of candidates at a time.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specfold.decoding.layout import commit_mask, prefill_mask, window_mask
from specfold.decoding.rules import Rule, Scored, make_rule, score
from specfold.models.spec import ModelSpec
from specfold.models.transformer import Transformer
from specfold.outputs import DecodeStats
from specfold.params import DecodeParams


@dataclass(slots=True)
class Step:
    """One applied rule step: the state, its scored candidates and the state it led to."""
    state: torch.Tensor  # [W]
    scored: Scored
    next: torch.Tensor  # [W]
    region: torch.Tensor  # [W] bool candidates of `state`


@dataclass(slots=True)
class Draft:
    tokens: torch.Tensor  # [W]
    parent: int  # index into the verification batch (0 = root)
    node: int = -1  # policy-specific id (Spiffy graph node, FreeDave depth), for hit statistics


@dataclass
class BlockContext:
    """What a draft policy may read about the active block."""
    start: int  # absolute position of window index 0
    allowed: torch.Tensor  # [W] bool: positions that may be unmasked (current block, within limit)
    block_origin: int  # window index where the current block starts
    mask_id: int
    rule: Rule
    step: int
    masks_at_start: int


class DraftPolicy:
    """Vanilla: no drafts. Subclasses build future states from the parent step's scores."""
    name = "none"

    def drafts(self, root: torch.Tensor, parent: Step | None, ctx: BlockContext) -> list[Draft]:
        return []

    def on_advance(self, hit: bool, node: int) -> None:
        """Called when the trajectory reaches a stored state (hit) produced by draft `node`."""


@dataclass
class Request:
    prompt_ids: list[int]
    params: DecodeParams
    stats: DecodeStats = field(default_factory=DecodeStats)


class Decoder:
    def __init__(self, model: Transformer, spec: ModelSpec, params: DecodeParams, policy: DraftPolicy,
                 verifier):
        self.model, self.spec, self.p = model, spec, params
        self.policy, self.verifier = policy, verifier
        self.rule = make_rule(params)
        self.M = spec.mask_token_id
        self.stop = torch.tensor(sorted(set(spec.stop_token_ids)), dtype=torch.long)

    # ---------------------------------------------------------------- helpers
    def _is_stop(self, t: torch.Tensor) -> torch.Tensor:
        return torch.isin(t, self.stop)

    def _seed(self, logits: torch.Tensor) -> int:
        lg = logits.float().clone()
        lg[self.M] = float("-inf")
        return int(lg.argmax())

    def _stopped(self, state: torch.Tensor, lo: int, hi: int) -> bool:
        """A stop token in window[lo:hi] with no mask before it (in that range)."""
        seg = state[lo:hi]
        stops = self._is_stop(seg).nonzero()
        if len(stops) == 0:
            return False
        return not bool((seg[: stops[0, 0]] == self.M).any())

    # ---------------------------------------------------------------- denoising (shared)
    def denoise(self, state: torch.Tensor, ctx: BlockContext, positions: torch.Tensor, cache,
                mask: torch.Tensor | None, gen_lo: int, stats: DecodeStats,
                generator: torch.Generator | None) -> torch.Tensor:
        """Advance one block until no allowed mask is left. `gen_lo` = window index of the first
        generated position (for early stop)."""
        p, shift = self.p, 1 if self.spec.logits_shift else 0
        store: dict[bytes, tuple[torch.Tensor, torch.Tensor, int]] = {}
        parent: Step | None = None
        ex = stats.extra
        hi = len(state) if ctx.allowed is None else int(ctx.allowed.nonzero()[-1, 0]) + 1
        while True:
            masked = (state == self.M) & ctx.allowed
            if not masked.any():
                break
            if p.early_stop and self._stopped(state, gen_lo, hi):
                break
            region = self.rule.region(masked, ctx.block_origin)
            key = state.numpy().tobytes()
            if key in store:
                pos, logits, node = store[key]
                ex["reused_states"] = ex.get("reused_states", 0) + 1
                self.policy.on_advance(True, node)
            else:
                t0 = time.perf_counter()
                drafts = self.policy.drafts(state, parent, ctx)
                t1 = time.perf_counter()
                branches = [state] + [d.tokens for d in drafts]
                regions = [region] + [self.rule.region((d.tokens == self.M) & ctx.allowed, ctx.block_origin)
                                      for d in drafts]
                union = torch.stack(regions).any(0).nonzero()[:, 0]
                out = self.verifier(torch.stack(branches), [-1] + [d.parent for d in drafts], positions,
                                    cache, mask, union - shift)
                t2 = time.perf_counter()
                stats.nfe += 1
                stats.verify_forwards += 1
                ex["draft_seconds"] = ex.get("draft_seconds", 0.0) + (t1 - t0)
                ex["model_seconds"] = ex.get("model_seconds", 0.0) + (t2 - t1)
                ex["drafts_verified"] = ex.get("drafts_verified", 0) + len(drafts)
                store.clear()  # keep only the newest batch: bounded memory
                lookup = {int(u): i for i, u in enumerate(union.tolist())}
                for b, (toks, reg) in enumerate(zip(branches, regions)):
                    pos_b = reg.nonzero()[:, 0]
                    rows = torch.tensor([lookup[int(x)] for x in pos_b.tolist()], dtype=torch.long)
                    store.setdefault(toks.numpy().tobytes(),
                                     (pos_b, out[b, rows], -1 if b == 0 else drafts[b - 1].node))
                pos, logits, _ = store[key]
                self.policy.on_advance(False, -1)
            scored = score(logits, pos, self.M, self.p.confidence, p.temperature, generator)
            nxt = self.rule.apply(state, scored, ctx.step, ctx.masks_at_start)
            parent = Step(state, scored, nxt, region)
            state = nxt
            ctx.step += 1
        return state

    # ---------------------------------------------------------------- cached families
    def run_cached(self, prompt: list[int], stats: DecodeStats, generator) -> list[int]:
        spec, p, model = self.spec, self.p, self.model
        N, L = p.block_size, len(prompt)
        limit = L + p.max_new_tokens
        cache = model.new_cache(capacity=limit + N)
        prompt_t = torch.tensor(prompt, dtype=torch.long)
        if spec.alignment == "absolute":
            pre = (L // N) * N
            origin = 0
        else:
            pre, origin = L, L
        seed = None
        if pre > 0:
            pos = torch.arange(pre)
            need_seed = spec.seed_token and pre == L
            logits = model(prompt_t[None, :pre], pos, cache=cache, mask=prefill_mask(spec.attention, pos, N),
                           write_cache=True, logits_at=torch.tensor([pre - 1]),
                           head="ar" if spec.attention == "causal_prefix" else "lm")
            stats.nfe += 1
            stats.extra["prefill_forwards"] = 1
            if need_seed:
                seed = self._seed(logits[0, -1])
        start = pre
        generated: list[int] = []
        while True:
            positions = torch.arange(start, start + N)
            state = torch.full((N,), self.M, dtype=torch.long)
            n_prompt = max(0, min(L - start, N))
            state[:n_prompt] = prompt_t[start: start + n_prompt]
            if seed is not None:
                state[n_prompt] = seed
            allowed = positions < limit
            allowed[:n_prompt] = False
            ctx = BlockContext(start=start, allowed=allowed, block_origin=0, mask_id=self.M, rule=self.rule,
                               step=0, masks_at_start=int(((state == self.M) & allowed).sum()))
            mask = window_mask(spec.attention, positions, N, origin)
            state = self.denoise(state, ctx, positions, cache, mask, n_prompt, stats, generator)
            block_gen = state[n_prompt: int(allowed.sum()) + n_prompt].tolist()
            generated.extend(block_gen)
            if any(t in self.stop.tolist() for t in block_gen) or start + N >= limit:
                break
            logits = model(state[None], positions, cache=cache, mask=commit_mask(spec.attention, positions, N, origin),
                           write_cache=True, logits_at=torch.tensor([N - 1]),
                           head="ar" if spec.attention == "causal_prefix" else "lm")
            stats.nfe += 1
            stats.extra["commit_forwards"] = stats.extra.get("commit_forwards", 0) + 1
            seed = self._seed(logits[0, -1]) if spec.seed_token else None
            start += N
        return generated

    # ---------------------------------------------------------------- bidirectional families
    def run_canvas(self, prompt: list[int], stats: DecodeStats, generator) -> list[int]:
        p = self.p
        N, L = p.block_size, len(prompt)
        limit = L + p.max_new_tokens
        state = torch.full((limit,), self.M, dtype=torch.long)
        state[:L] = torch.tensor(prompt, dtype=torch.long)
        positions = torch.arange(limit)
        for lo in range(L, limit, N):
            allowed = torch.zeros(limit, dtype=torch.bool)
            allowed[lo: min(lo + N, limit)] = True
            ctx = BlockContext(start=0, allowed=allowed, block_origin=lo, mask_id=self.M, rule=self.rule,
                               step=0, masks_at_start=int(((state == self.M) & allowed).sum()))
            state = self.denoise(state, ctx, positions, None, None, L, stats, generator)
            if self._stopped(state, L, min(lo + N, limit)):
                break
        return state[L:limit].tolist()

    def run(self, prompt: list[int]) -> tuple[list[int], str, DecodeStats]:
        stats = DecodeStats()
        generator = torch.Generator().manual_seed(self.p.seed) if self.p.temperature > 0 else None
        t0 = time.perf_counter()
        with torch.inference_mode():
            if self.spec.uses_cache:
                generated = self.run_cached(prompt, stats, generator)
            else:
                generated = self.run_canvas(prompt, stats, generator)
        stats.seconds = time.perf_counter() - t0
        stop = set(self.stop.tolist())
        cut = next((i for i, t in enumerate(generated) if t in stop), None)
        finish = "stop" if cut is not None else "length"
        out = generated[:cut] if cut is not None else generated[: self.p.max_new_tokens]
        if self.M in out:
            raise RuntimeError("internal error: a mask token reached the output")
        stats.tokens = len(out)
        return out, finish, stats
