"""The one advance loop (SPEC §3-5): every decode method is this loop with a draft policy and a verifier.

Per request: prefill the prompt into the prefix cache, then block by block
    root = current block state
    if root's logits are not stored: verify [root] + drafts(root) in one batched forward (1 NFE) and
        store every (exact state -> logits at its candidate positions);
    next = rule(root, logits(root)); repeat while the next state's logits are stored (no NFE);
    when the block has no mask left in its allowed region: commit it (1 NFE writes its K/V and, for
    families with a seed token, yields the next block's first token).
Vanilla decoding has no drafts, so every step is one forward.

Eager windows (`eager=True`, block-causal families, a policy whose `lookahead` asks for it): the
verification window spans the current block and the next block(s) with block-causal masking, so a
branch's block j logits are exact for (committed prefix + its blocks < j) whenever those earlier
blocks are complete; only then are they stored, keyed by the block's start and every token from the
window start through the block. A block is committed from the window's K/V (recomputed from the
returned per-layer hidden states, no forward) when a branch of the last batch holds exactly the
committed tokens through it; otherwise by the usual commit forward.

Invariants:
- the rule only ever reads the logits of the exact state it is applied to (store keyed by the block's
  start and its exact tokens, plus the tokens committed since the stored batch's window start);
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
from dataclasses import dataclass

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
    ahead: Scored | None = None  # eager windows: scores (T = 0) at the next block(s)' candidates (window
    # indices >= the block size), from the same forward as `scored`: draft material only


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
    # eager windows (block-causal, cached): this verification's window spans `width` positions from
    # `start` (the current block first); `window_allowed` [width] marks positions that may be unmasked
    width: int = 0
    window_allowed: torch.Tensor | None = None
    seed_token: bool = False


class DraftPolicy:
    """Vanilla: no drafts. Subclasses build future states from the parent step's scores."""
    name = "none"
    topk = 0  # vocabulary ranks the drafts read (`Scored.top`); 0 = the argmax only

    def drafts(self, root: torch.Tensor, parent: Step | None, ctx: BlockContext) -> list[Draft]:
        return []

    def lookahead(self, masked: int, ctx: BlockContext) -> int:
        """Eager mode: how many positions beyond the current block's `masked` masks the drafts want
        (0 = the window is the block)."""
        return 0

    def on_advance(self, hit: bool, node: int) -> None:
        """Called when the trajectory reaches a stored state (hit) produced by draft `node`."""

    def on_step(self, step: Step, ctx: BlockContext) -> None:
        """Called after every rule step of the main trajectory (calibration records them)."""

    def summarize(self, stats: DecodeStats) -> None:
        """Derive per-request statistics from the loop's counters in `stats.extra`."""


class Decoder:
    def __init__(self, model: Transformer, spec: ModelSpec, params: DecodeParams, policy: DraftPolicy,
                 verifier):
        self.model, self.spec, self.p = model, spec, params
        self.policy, self.verifier = policy, verifier
        self.rule = make_rule(params)
        self.M = spec.mask_token_id
        self.stop_ids = set(spec.stop_token_ids)
        self.stop = torch.tensor(sorted(self.stop_ids), dtype=torch.long)
        # eager windows reach into later blocks: block-causal, absolutely aligned families only
        self.eager = bool(params.eager) and spec.attention == "block_causal" and spec.uses_cache
        self._store: dict = {}  # (block start, tokens from `_origin` through the block) -> logits
        self._origin = 0  # window start of the stored batch
        self._last = None  # eager: (branch tokens, per-layer hidden, window start) of the last batch
        self._seq = torch.empty(0, dtype=torch.long)  # committed tokens by absolute position
        self._limit, self._align_origin = 0, 0

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
        p = self.p
        if not self.eager:
            self._store, self._origin = {}, ctx.start
        store = self._store
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
            key = self._key(ctx.start, state)
            if key in store:
                pos, logits, node, apos, alogits = store[key]
                ex["reused_states"] = ex.get("reused_states", 0) + 1
                if node >= 0:
                    hits = ex.setdefault("node_hits", {})
                    hits[node] = hits.get(node, 0) + 1
                self.policy.on_advance(True, node)
            else:
                self._verify_and_store(state, parent, ctx, positions, cache, mask, int(masked.sum()), stats)
                pos, logits, _, apos, alogits = store[(ctx.start, tuple(state.tolist()))]
                self.policy.on_advance(False, -1)
            scored = score(logits, pos, self.M, self.p.confidence, p.temperature, generator, self.policy.topk)
            ahead = None
            if apos is not None and len(apos):  # draft material only: T = 0, never the generator
                ahead = score(alogits, apos, self.M, self.p.confidence, 0.0, None, self.policy.topk)
            nxt = self.rule.apply(state, scored, ctx.step, ctx.masks_at_start)
            parent = Step(state, scored, nxt, region, ahead)
            self.policy.on_step(parent, ctx)
            state = nxt
            ctx.step += 1
        return state

    def _verify_and_store(self, state: torch.Tensor, parent: Step | None, ctx: BlockContext,
                          positions: torch.Tensor, cache, mask: torch.Tensor | None, masked: int,
                          stats: DecodeStats) -> None:
        """One verification (1 NFE): [root] + drafts in one batched forward over the window (the block,
        or the block and later blocks in eager mode); store every branch state's logits."""
        shift, N, ex, store = (1 if self.spec.logits_shift else 0), len(state), stats.extra, self._store
        extra = self._extra_blocks(masked, ctx, N)
        W = N * (1 + extra)
        wpos, wmask = positions, mask
        ctx.width, ctx.window_allowed = W, ctx.allowed
        if extra:
            wpos = torch.arange(ctx.start, ctx.start + W)
            wmask = window_mask(self.spec.attention, wpos, N, self._align_origin)
            ctx.window_allowed = torch.cat([ctx.allowed, wpos[N:] < self._limit])
        t0 = time.perf_counter()
        drafts = self.policy.drafts(state, parent, ctx)
        t1 = time.perf_counter()
        branches = [self._pad(state, W)] + [self._pad(d.tokens, W) for d in drafts]
        regions = [self._regions(b, ctx, N, extra) for b in branches]  # per branch: [parts] of [W] bool
        union = torch.stack([r for parts in regions for r in parts]).any(0).nonzero()[:, 0]
        kw = {"return_hidden": True} if self.eager and getattr(self.verifier, "returns_hidden", False) else {}
        out = self.verifier(torch.stack(branches), [-1] + [d.parent for d in drafts], wpos,
                            cache, wmask, union - shift, **kw)
        hidden = None
        if kw:
            out, hidden = out
        t2 = time.perf_counter()
        stats.nfe += 1
        stats.verify_forwards += 1
        ex["draft_seconds"] = ex.get("draft_seconds", 0.0) + (t1 - t0)
        ex["model_seconds"] = ex.get("model_seconds", 0.0) + (t2 - t1)
        ex["drafts_verified"] = ex.get("drafts_verified", 0) + len(drafts)
        if drafts:
            seen = ex.setdefault("node_drafts", {})
            for d in drafts:
                seen[d.node] = seen.get(d.node, 0) + 1
        if extra:
            ex["eager_windows"] = ex.get("eager_windows", 0) + 1
        store.clear()  # keep only the newest batch: bounded memory
        self._origin = ctx.start
        self._last = (torch.stack(branches), hidden, ctx.start) if hidden is not None else None
        lookup = {int(u): i for i, u in enumerate(union.tolist())}
        for b, (toks, parts) in enumerate(zip(branches, regions)):
            node = -1 if b == 0 else drafts[b - 1].node
            for j in range(1 + extra):
                # block j's logits are exact only if every earlier block of the window is complete
                if j > 0 and bool((toks[: j * N] == self.M).any()):
                    break
                pos_b = parts[j].nonzero()[:, 0]
                rows = torch.tensor([lookup[int(x)] for x in pos_b.tolist()], dtype=torch.long)
                apos = alog = None
                if j < extra:
                    apos = torch.stack(parts[j + 1:]).any(0).nonzero()[:, 0]
                    arows = torch.tensor([lookup[int(x)] for x in apos.tolist()], dtype=torch.long)
                    apos, alog = apos - j * N, out[b, arows]
                store.setdefault((ctx.start + j * N, tuple(toks[: (j + 1) * N].tolist())),
                                 (pos_b - j * N, out[b, rows], node, apos, alog))

    # ---------------------------------------------------------------- eager windows
    def _key(self, start: int, state: torch.Tensor) -> tuple[int, tuple[int, ...]]:
        """Store key of a block state: its start and every token from the stored batch's window start
        (committed since then) through the block: the exact state the logits belong to."""
        if start == self._origin:
            return start, tuple(state.tolist())
        return start, tuple(torch.cat([self._seq[self._origin: start], state]).tolist())

    def _pad(self, t: torch.Tensor, W: int) -> torch.Tensor:
        if len(t) == W:
            return t
        return torch.cat([t, torch.full((W - len(t),), self.M, dtype=t.dtype)])

    def _regions(self, toks: torch.Tensor, ctx: BlockContext, N: int, extra: int) -> list[torch.Tensor]:
        """Candidate positions (window-wide bool) of the current block and of each later block."""
        W = len(toks)
        first = torch.zeros(W, dtype=torch.bool)
        first[:N] = self.rule.region((toks[:N] == self.M) & ctx.allowed, ctx.block_origin)
        parts = [first]
        for j in range(1, extra + 1):
            sl = slice(j * N, (j + 1) * N)
            r = torch.zeros(W, dtype=torch.bool)
            r[sl] = self.rule.region((toks[sl] == self.M) & ctx.window_allowed[sl], 0)
            parts.append(r)
        return parts

    def _extra_blocks(self, masked: int, ctx: BlockContext, N: int) -> int:
        """Eager mode: later blocks the verification window reaches into (each one still decoded)."""
        if not self.eager:
            return 0
        want = self.policy.lookahead(masked, ctx)
        if want <= 0:
            return 0
        extra = -(-want // N)
        while extra and ctx.start + extra * N >= self._limit:
            extra -= 1
        return extra

    def _reuse_commit(self, state: torch.Tensor, start: int, positions: torch.Tensor, cache,
                      stats: DecodeStats) -> tuple[bool, int | None]:
        """Commit from the last verification's K/V when one of its branches holds exactly the committed
        tokens from its window start through this block: block-causal attention makes those K/V what
        the commit forward would write. Returns (done, seed token)."""
        if self._last is None:
            return False, None
        toks, hidden, origin = self._last
        off, N = start - origin, len(state)
        if off < 0 or off + N > toks.shape[1]:
            return False, None
        target = torch.cat([self._seq[origin: start], state])
        match = (toks[:, : off + N] == target).all(1).nonzero()
        if len(match) == 0:
            return False, None
        b = int(match[0, 0])
        model = self.model
        x0 = hidden[0]
        cos, sin = model.rope.cos_sin(positions, x0.dtype)
        qscale = model.rope.query_scale(positions, x0.dtype)
        for li, layer in enumerate(model.layers):
            _, k, v = model.qkv(layer, hidden[li][b: b + 1, off: off + N], cos, sin, qscale)
            cache.write(li, k[0], v[0])
        cache.commit_write()
        seed = None
        if self.spec.seed_token:
            seed = self._seed(model.head(hidden[-1][b: b + 1, off + N - 1: off + N])[0, -1])
        stats.extra["commits_reused"] = stats.extra.get("commits_reused", 0) + 1
        return True, seed

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
            t0 = time.perf_counter()
            logits = model(prompt_t[None, :pre], pos, cache=cache, mask=prefill_mask(spec.attention, pos, N),
                           write_cache=True, logits_at=torch.tensor([pre - 1]),
                           head="ar" if spec.attention == "causal_prefix" else "lm")
            stats.nfe += 1
            stats.extra["prefill_forwards"] = 1
            stats.extra["model_seconds"] = stats.extra.get("model_seconds", 0.0) + time.perf_counter() - t0
            if need_seed:
                seed = self._seed(logits[0, -1])
        start = pre
        generated: list[int] = []
        self._store, self._origin, self._last = {}, start, None
        self._limit, self._align_origin = limit, origin
        self._seq = torch.full((limit + 2 * N,), self.M, dtype=torch.long)
        self._seq[:L] = prompt_t
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
                               step=0, masks_at_start=int(((state == self.M) & allowed).sum()),
                               seed_token=spec.seed_token)
            mask = window_mask(spec.attention, positions, N, origin)
            state = self.denoise(state, ctx, positions, cache, mask, n_prompt, stats, generator)
            block_gen = state[n_prompt: int(allowed.sum()) + n_prompt].tolist()
            generated.extend(block_gen)
            if not self.stop_ids.isdisjoint(block_gen) or start + N >= limit:
                break
            self._seq[start: start + N] = state
            if self.eager:
                done, seed = self._reuse_commit(state, start, positions, cache, stats)
                if done:
                    start += N
                    continue
            t0 = time.perf_counter()
            logits = model(state[None], positions, cache=cache, mask=commit_mask(spec.attention, positions, N, origin),
                           write_cache=True, logits_at=torch.tensor([N - 1]),
                           head="ar" if spec.attention == "causal_prefix" else "lm")
            stats.nfe += 1
            stats.extra["commit_forwards"] = stats.extra.get("commit_forwards", 0) + 1
            stats.extra["model_seconds"] = stats.extra.get("model_seconds", 0.0) + time.perf_counter() - t0
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
        self.policy.summarize(stats)
        stop = self.stop_ids
        cut = next((i for i, t in enumerate(generated) if t in stop), None)
        finish = "stop" if cut is not None else "length"
        out = generated[:cut] if cut is not None else generated[: self.p.max_new_tokens]
        if self.M in out:
            raise RuntimeError("internal error: a mask token reached the output")
        stats.tokens = len(out)
        return out, finish, stats
