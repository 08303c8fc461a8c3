"""The one advance loop (SPEC §3-5), as a per-request program: every decode method is this loop with
a draft policy and a verifier.

Per request: prefill the prompt into the prefix cache, then block by block
    root = current block state
    if root's logits are not stored: verify [root] + drafts(root) in one batched forward (1 NFE) and
        store every (exact state -> logits at its candidate positions);
    next = rule(root, logits(root)); repeat while the next state's logits are stored (no NFE);
    when the block has no mask left in its allowed region: its tokens are final (emitted to the
    request); commit it (1 NFE writes its K/V and, for families with a seed token, yields the next
    block's first token).
Vanilla decoding has no drafts, so every step is one forward.

The loop never calls the model: `BlockProgram.run(req)` is a generator that yields the `Forward`s
it needs and receives their results (`specfold.engine.program`); the engine runs the forwards of
all requests in one packed call. Everything that outlives a step is on the `Request` (cache, store,
committed tokens, counters, generator) or in the generator's frame (the block state, the parent
step), which is itself stored on the request. `Decoder` runs one request alone through the same
engine (the older API, and the reference the batch-invariance tests compare against).

Eager windows (`eager=True`, block-causal families): see decoding/windows.py.

Invariants:
- the rule only ever reads the logits of the exact state it is applied to (decoding/store.py);
- rules are applied in the same order with the request's own generator in every method and at any
  batch, so trajectories are identical to vanilla's alone given identical logits;
- positions at or beyond `prompt_len + max_new_tokens` are never unmasked; the output is cut at the
  first stop token (excluded), and nothing after a committed stop token changes the output, so a
  block stops early once a stop token has no mask before it (`early_stop`);
- every tensor created here lives on the model's device; store keys are host tuples.
Bidirectional families decode the whole canvas (prompt + max_new_tokens masks) with no cache, one
semi-autoregressive block of candidates at a time.
"""
from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Generator

import torch

from specfold.decoding.layout import commit_mask, prefill_mask, window_mask
from specfold.decoding.plugins import BlockContext, Draft, DraftPolicy, Step, Verifier  # noqa: F401 (re-exported)
from specfold.decoding.rules import Rule, make_rule, score
from specfold.decoding.store import StoredLogits
from specfold.decoding.windows import EagerWindows, PlainWindows
from specfold.engine.forward import Forward, ForwardResult
from specfold.engine.program import GeneratorProgram
from specfold.engine.request import Request
from specfold.models.spec import ModelSpec
from specfold.models.transformer import Transformer
from specfold.outputs import DecodeStats
from specfold.params import DecodeParams, EngineConfig

Program = Generator[list[Forward], list[ForwardResult], None]


class BlockProgram(GeneratorProgram):
    """Block diffusion decoding (vanilla, FreeDave, Spiffy, SpecFold) for every request of an engine."""

    def __init__(self, model: Transformer, spec: ModelSpec, config: EngineConfig, policy: DraftPolicy, verifier):
        self.model, self.spec, self.config = model, spec, config
        self.policy, self.verifier = policy, verifier
        self.M = spec.mask_token_id
        self.device = model.device
        self._rules: dict[tuple, Rule] = {}
        eager = bool(config.eager) and spec.attention == "block_causal" and spec.uses_cache
        self.windows = EagerWindows(getattr(verifier, "returns_hidden", False)) if eager else PlainWindows()

    # ---------------------------------------------------------------- helpers
    def rule(self, req: Request) -> Rule:
        c = req.config
        key = (c.rule, c.block_size, c.steps)
        if key not in self._rules:
            self._rules[key] = make_rule(c)
        return self._rules[key]

    def _seed(self, logits: torch.Tensor) -> int:
        lg = logits.float().clone()
        lg[self.M] = float("-inf")
        return int(lg.argmax())

    def _stopped(self, req: Request, state: torch.Tensor, lo: int, hi: int) -> bool:
        """A stop token in window[lo:hi] with no mask before it (in that range)."""
        seg = state[lo:hi].tolist()
        for t in seg:
            if t == self.M:
                return False
            if t in req.stop_ids:
                return True
        return False

    def _full(self, n: int, value: int) -> torch.Tensor:
        return torch.full((n,), value, dtype=torch.long, device=self.device)

    def _arange(self, lo: int, hi: int) -> torch.Tensor:
        return torch.arange(lo, hi, device=self.device)

    def _idx(self, xs: list[int]) -> torch.Tensor:
        return torch.tensor(xs, dtype=torch.long, device=self.device)

    def report(self, req: Request) -> None:
        """Per-request statistics the policy derives from the counters (written into stats.extra)."""
        self.policy.summarize(req.stats)

    # ---------------------------------------------------------------- the program
    def run(self, req: Request) -> Program:
        if req.params.temperature > 0:
            req.generator = torch.Generator(device=self.device).manual_seed(req.seed)
        if self.spec.uses_cache:
            yield from self._run_cached(req)
        else:
            yield from self._run_canvas(req)
        if req.finish_reason is None:
            req.finish_reason = "length"

    def _run_cached(self, req: Request) -> Program:
        spec, model, c = self.spec, self.model, req.config
        N, L = c.block_size, len(req.prompt_ids)
        limit = req.limit
        req.cache = model.new_cache(capacity=limit + N)
        prompt_t = self._idx(req.prompt_ids)
        pre, origin = ((L // N) * N, 0) if spec.alignment == "absolute" else (L, L)
        head = "ar" if spec.attention == "causal_prefix" else "lm"
        seed = None
        if pre > 0:
            req.phase = "prefill"
            pos = self._arange(0, pre)
            res = yield [Forward(prompt_t[None, :pre], pos, req.cache, prefill_mask(spec.attention, pos, N),
                                 write_cache=True, logits_at=self._idx([pre - 1]), head=head, kind="prefill")]
            req.stats.nfe += 1
            req.counters.prefill_forwards += 1
            if spec.seed_token and pre == L:
                seed = self._seed(res[0].logits[0, -1])
        start = pre
        req.store.clear(start)
        req.seq = self._full(limit + 2 * N, self.M)
        req.seq[:L] = prompt_t
        req.align_origin = origin
        rule = self.rule(req)
        while True:
            positions = self._arange(start, start + N)
            state = self._full(N, self.M)
            n_prompt = max(0, min(L - start, N))
            state[:n_prompt] = prompt_t[start: start + n_prompt]
            if seed is not None:
                state[n_prompt] = seed
            allowed = positions < limit
            allowed[:n_prompt] = False
            ctx = BlockContext(start=start, allowed=allowed, block_origin=0, mask_id=self.M, rule=rule,
                               step=0, masks_at_start=int(((state == self.M) & allowed).sum()),
                               seed_token=spec.seed_token)
            mask = window_mask(spec.attention, positions, N, origin)
            req.phase = "denoise"
            state = yield from self._denoise(req, state, ctx, positions, mask, n_prompt)
            if req.emit(state[n_prompt: int(allowed.sum()) + n_prompt].tolist(), self.M) or start + N >= limit:
                return
            req.seq[start: start + N] = state
            done, seed_logits = self.windows.commit(req, model, state, start, positions, spec.seed_token)
            if not done:
                req.phase = "commit"
                res = yield [Forward(state[None], positions, req.cache,
                                     commit_mask(spec.attention, positions, N, origin), write_cache=True,
                                     logits_at=self._idx([N - 1]), head=head, kind="commit")]
                req.stats.nfe += 1
                req.counters.commit_forwards += 1
                seed_logits = res[0].logits[0, -1]
            seed = self._seed(seed_logits) if spec.seed_token else None
            start += N

    def _run_canvas(self, req: Request) -> Program:
        c = req.config
        N, L, limit = c.block_size, len(req.prompt_ids), req.limit
        state = self._full(limit, self.M)
        state[:L] = self._idx(req.prompt_ids)
        positions = self._arange(0, limit)
        req.store.clear(0)
        rule = self.rule(req)
        for lo in range(L, limit, N):
            hi = min(lo + N, limit)
            allowed = torch.zeros(limit, dtype=torch.bool, device=self.device)
            allowed[lo:hi] = True
            ctx = BlockContext(start=0, allowed=allowed, block_origin=lo, mask_id=self.M, rule=rule,
                               step=0, masks_at_start=int(((state == self.M) & allowed).sum()))
            req.phase = "denoise"
            state = yield from self._denoise(req, state, ctx, positions, None, L)
            if req.emit(state[lo:hi].tolist(), self.M) or self._stopped(req, state, L, hi):
                return

    # ---------------------------------------------------------------- denoising (shared)
    def _denoise(self, req: Request, state: torch.Tensor, ctx: BlockContext, positions: torch.Tensor,
                 mask: torch.Tensor | None, gen_lo: int) -> Generator:
        """Advance one block until no allowed mask is left. `gen_lo` = window index of the first
        generated position (for early stop)."""
        c, store, cnt = req.config, req.store, req.counters
        self.windows.new_block(req, ctx.start)
        parent: Step | None = None
        hi = len(state) if ctx.allowed is None else int(ctx.allowed.nonzero()[-1, 0]) + 1
        while True:
            masked = (state == self.M) & ctx.allowed
            if not masked.any():
                break
            if c.early_stop and self._stopped(req, state, gen_lo, hi):
                break
            region = ctx.rule.region(masked, ctx.block_origin)
            entry = store.get(store.key(ctx.start, state, req.seq))
            if entry is not None:
                cnt.reused_states += 1
                if entry.node >= 0:
                    cnt.node_hits[entry.node] += 1
            else:
                yield from self._verify(req, state, parent, ctx, positions, mask, int(masked.sum()))
                entry = store.get((ctx.start, tuple(state.tolist())))
            scored = score(entry.logits, entry.positions, self.M, c.confidence, req.params.temperature,
                           req.generator, self.policy.topk)
            ahead = None
            if entry.ahead_positions is not None and len(entry.ahead_positions):  # draft material: T = 0
                ahead = score(entry.ahead_logits, entry.ahead_positions, self.M, c.confidence, 0.0, None,
                              self.policy.topk)
            nxt = ctx.rule.apply(state, scored, ctx.step, ctx.masks_at_start)
            parent = Step(state, scored, nxt, region, ahead)
            self.policy.on_step(parent, ctx)
            state = nxt
            ctx.step += 1
        return state

    def _verify(self, req: Request, state: torch.Tensor, parent: Step | None, ctx: BlockContext,
                positions: torch.Tensor, mask: torch.Tensor | None, masked: int) -> Generator:
        """One verification (1 NFE): [root] + drafts in one batched forward over the window (the block,
        or the block and later blocks in eager mode); store every branch state's logits."""
        shift, N, cnt = (1 if self.spec.logits_shift else 0), len(state), req.counters
        extra = self.windows.extra_blocks(req, self.policy, masked, ctx, N)
        W = N * (1 + extra)
        wpos, wmask = positions, mask
        ctx.width, ctx.window_allowed = W, ctx.allowed
        if extra:
            wpos = self._arange(ctx.start, ctx.start + W)
            wmask = window_mask(self.spec.attention, wpos, N, req.align_origin)
            ctx.window_allowed = torch.cat([ctx.allowed, wpos[N:] < req.limit])
            cnt.eager_windows += 1
        t0 = time.perf_counter()
        drafts = self.policy.drafts(state, parent, ctx)
        if req.draft_budget is not None:
            drafts = drafts[: max(0, req.draft_budget)]
        cnt.draft_seconds += time.perf_counter() - t0
        branches = torch.stack([self._pad(state, W)] + [self._pad(d.tokens, W) for d in drafts])
        ahead = self.policy.reads_ahead or extra > 0
        regions = [self._regions(b, ctx, N, extra, ahead) for b in branches]  # per branch: (parts, aheads)
        union = torch.stack([r for parts, aheads in regions for r in parts + aheads]).any(0).nonzero()[:, 0]
        res = (yield [Forward(branches, wpos, req.cache, wmask, logits_at=union - shift,
                              parents=[-1] + [d.parent for d in drafts],
                              return_hidden=self.windows.wants_hidden, kind="verify")])[0]
        out = res.logits
        req.stats.nfe += 1
        req.stats.verify_forwards += 1
        cnt.add_fold(res.stats)
        cnt.drafts_verified += len(drafts)
        for d in drafts:
            cnt.node_drafts[d.node] += 1
        req.store.clear(ctx.start)  # keep only the newest batch: bounded memory
        self.windows.remember(req, branches, res.hidden, ctx.start)
        lookup = {int(u): i for i, u in enumerate(union.tolist())}
        for b, (parts, aheads) in enumerate(regions):
            toks = branches[b]
            node = -1 if b == 0 else drafts[b - 1].node
            for j in range(1 + extra):
                # block j's logits are exact only if every earlier block of the window is complete
                if j > 0 and bool((toks[: j * N] == self.M).any()):
                    break
                pos_b = parts[j].nonzero()[:, 0]
                rows = self._idx([lookup[x] for x in pos_b.tolist()])
                apos = alog = None
                if aheads and bool(aheads[j].any()):
                    apos = aheads[j].nonzero()[:, 0]
                    arows = self._idx([lookup[x] for x in apos.tolist()])
                    apos, alog = apos - j * N, out[b, arows]
                req.store.put((ctx.start + j * N, tuple(toks[: (j + 1) * N].tolist())),
                              StoredLogits(pos_b - j * N, out[b, rows], node, apos, alog))

    def _pad(self, t: torch.Tensor, W: int) -> torch.Tensor:
        if len(t) == W:
            return t
        return torch.cat([t, self._full(W - len(t), self.M).to(t.dtype)])

    def _regions(self, toks: torch.Tensor, ctx: BlockContext, N: int, extra: int,
                 ahead: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Window-wide bool masks, per block j of the window: the rule's candidate region, and (when
        `ahead`) the region it reads next once that one is filled: the next sub-block of block j, or
        the region of block j+1 when block j has no other mask (draft material)."""
        W = len(toks)
        avail = (toks == self.M) & ctx.window_allowed
        parts, aheads = [], []
        for j in range(extra + 1):
            sl, origin = slice(j * N, (j + 1) * N), (ctx.block_origin if j == 0 else 0)
            r = torch.zeros(W, dtype=torch.bool, device=self.device)
            r[sl] = ctx.rule.region(avail[sl], origin)
            parts.append(r)
        if ahead:
            for j in range(extra + 1):
                sl, origin = slice(j * N, (j + 1) * N), (ctx.block_origin if j == 0 else 0)
                rest = avail[sl] & ~parts[j][sl]
                a = torch.zeros(W, dtype=torch.bool, device=self.device)
                if bool(rest.any()):
                    a[sl] = ctx.rule.region(rest, origin)
                elif j < extra:
                    a = parts[j + 1]
                aheads.append(a)
        return parts, aheads


class Decoder:
    """One request at a time through the engine (the older API; calibration and tests use it to swap
    in recording policies or wrapped verifiers): `run(prompt_ids) -> (ids, finish_reason, stats)`."""

    def __init__(self, model: Transformer, spec: ModelSpec, params: DecodeParams, policy: DraftPolicy, verifier):
        self.model, self.spec, self.p = model, spec, params
        self.policy, self.verifier = policy, verifier

    def run(self, prompt: list[int]) -> tuple[list[int], str, DecodeStats]:
        from specfold.engine.engine import Engine
        config, sampling = self.p.split()
        program = BlockProgram(self.model, self.spec, config.resolve(self.spec), self.policy, self.verifier)
        host = SimpleNamespace(model=self.model, spec=self.spec, tokenizer=None)
        out = Engine(host, config, program=program).run_one(prompt, sampling)
        return out.token_ids, out.finish_reason, out.stats
