"""The block program (SPEC §3-5): every block-diffusion method is this state machine with a draft
policy and a verifier. Host only: it reads no tensor and calls no model.

Per request: prefill the prompt into the prefix cache, then block by block
    root = current block state
    if root's scores are not stored: verify [root] + drafts(root) in one batched forward (1 NFE) and
        store every (exact state -> scores at its candidate positions);
    next = rule(root, scores(root)); repeat while the next state's scores are stored (no NFE);
    when the block has no mask left in its allowed region: its tokens are final (emitted to the
    request); commit it (1 NFE writes its K/V and, for families with a seed token, yields the next
    block's first token).
Vanilla decoding has no drafts, so every step is one forward.

The engine drives it for a whole batch (engine/engine.py): `start(req)` once, then every step
`propose(req)` (a verification's root and drafts, before they are chosen), `plan(req, pick) -> [Job]`
(what the request needs now, with the drafts the engine's chooser picked; [] = finished), the
runner runs the jobs of all requests, and `update(req, results)` absorbs the host results and
advances the request through every rule step it can take without the model. Everything per request
is in `req.state`, a `BlockState`: plain Python data (and the prefix cache), never a generator frame.

Eager windows (`eager=True`, block-causal families): see decoding/windows.py.

Invariants:
- the rule only ever reads the scores of the exact state it is applied to (decoding/store.py);
- rules are applied in the same order in every method and at any batch, and a sampled token's noise
  is keyed by its exact state (decoding/readout.py), so trajectories are identical to vanilla's
  alone given identical logits;
- positions at or beyond `prompt_len + max_new_tokens` are never unmasked; the output is cut at the
  first stop token (excluded), and nothing after a committed stop token changes the output, so a
  block stops early once a stop token has no mask before it (`early_stop`);
- `propose` and `plan` may be called again before `update` (a request the scheduler did not pick):
  they change nothing but the plan they return.
Bidirectional families decode the whole canvas (prompt + max_new_tokens masks) with no cache, one
semi-autoregressive block of candidates at a time.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from specfold.decoding.jobs import Job, JobResult
from specfold.decoding.layout import commit_mask, prefill_mask, window_mask
from specfold.decoding.plugins import BlockContext, Draft, DraftPolicy, Step
from specfold.decoding.proposal import Pick, Proposal, subset
from specfold.decoding.readout import Read, state_key
from specfold.decoding.request import DecodeRequest
from specfold.decoding.rules import Rule, Scored, indices, make_rule
from specfold.decoding.store import Entry, ScoreStore
from specfold.decoding.windows import EagerWindows, PlainWindows
from specfold.models.spec import ModelSpec
from specfold.params import EngineConfig


@dataclass
class Verification:
    """What `plan` decided for one verification, for `update` to file the scores."""
    branches: list[list[int]]
    drafts: list[Draft]
    regions: list[tuple[list[list[int]], list[list[int]]]]  # per branch: (parts, aheads) index lists
    rows: list[dict[int, int]]  # per branch: window index -> its row in the job's read (rows_at order)
    extra: int
    read: Read
    drafting: bool = False  # it verifies drafts, or the chooser said the request still drafts


@dataclass
class BlockState:
    """One request's decoding state (the block program's own)."""
    phase: str  # "prefill" | "denoise" | "commit" | "reuse" | "done"
    tokens: list[int] = field(default_factory=list)  # the current block (or canvas) state
    ctx: BlockContext | None = None
    start: int = 0  # absolute position of the block (cached) / 0 (canvas)
    n_prompt: int = 0  # prompt tokens at the start of the block
    lo: int = 0  # canvas: the current block's first position
    mask: tuple | None = None  # the window's attention mask description
    parent: Step | None = None
    fresh: bool = False  # the store was just filled for the current state (no reuse to count)
    seed: int | None = None  # seed token of the next block
    seed_lp: dict | None = None  # its log-probabilities (requests that asked for them)
    lps: dict = field(default_factory=dict)  # index in `tokens` -> log-probabilities of the token written there
    store: ScoreStore = field(default_factory=ScoreStore)
    seq: list[int] = field(default_factory=list)  # committed tokens by absolute position (eager keys)
    last_batch: tuple | None = None  # eager: (branch tokens, device hidden states, window start)
    prelude: list[Job] = field(default_factory=list)  # jobs to run first in the next step (reuse)
    reuse: list | None = None  # hidden rows of a reused commit that must read a seed token
    verification: Verification | None = None
    drafting: bool = True  # the last verification verified drafts (its branches scored look-aheads)
    seen: dict = field(default_factory=dict)  # non-monotone rules: block state -> its Entry (this block's)


class BlockProgram:
    """Block diffusion decoding (vanilla, FreeDave, Spiffy, SpecFold) for every request of an engine."""
    whole_blocks = True

    def __init__(self, spec: ModelSpec, config: EngineConfig, policy: DraftPolicy, verifier):
        self.spec, self.config = spec, config
        self.policy, self.verifier = policy, verifier
        self.M = spec.mask_token_id
        self.head = "ar" if spec.attention == "causal_prefix" else "lm"
        self._rules: dict[tuple, Rule] = {}
        eager = bool(config.eager) and spec.attention == "block_causal" and spec.uses_cache
        self.windows = EagerWindows(getattr(verifier, "returns_hidden", False)) if eager else PlainWindows()
        self.drafts = self._max_drafts() > 0  # the policy makes drafts (the engine's chooser picks them)

    def rule(self, req: DecodeRequest) -> Rule:
        c = req.config
        key = (c.rule, c.block_size, c.steps)
        if key not in self._rules:
            self._rules[key] = make_rule(c)
        return self._rules[key]

    def report(self, req: DecodeRequest) -> None:
        """Per-request statistics the policy derives from the counters (written into stats.extra)."""
        self.policy.summarize(req.stats)

    # ================================================================ the engine's hooks
    def start(self, req: DecodeRequest, new_cache) -> None:
        """`new_cache(capacity)` makes the request's prefix cache (the engine owns the device)."""
        c, L = req.config, len(req.prompt_ids)
        if not self.spec.uses_cache:
            st = req.state = BlockState("denoise", tokens=list(req.prompt_ids) + [self.M] * (req.limit - L),
                                        drafting=req.config.draft_budget != 0)
            st.store.clear(0)
            self._canvas_block(req, st, L)
            return
        N, ctx = c.block_size, req.context_ids  # the prompt (+ the committed output, after a preemption)
        L = len(ctx)
        req.cache = new_cache(req.limit + N)  # it may hold a cached prefix of ctx already (never all of it)
        pre = (L // N) * N if self.spec.alignment == "absolute" else L
        st = req.state = BlockState("prefill", start=pre, drafting=req.config.draft_budget != 0)
        st.seq = list(ctx) + [self.M] * (req.limit + 2 * N - L)
        if req.cache.length == pre:
            self._new_block(req, st)

    def propose(self, req: DecodeRequest) -> Proposal | None:
        """The verification this request needs now, before its drafts are chosen (None: it does not
        verify this step). Pure: the same proposal until `update`."""
        st: BlockState = req.state
        if st is None or st.phase != "denoise":
            return None
        return self._propose(req, st)

    def plan(self, req: DecodeRequest, pick: Pick | None = None) -> list[Job]:
        """This step's jobs; a verification verifies the drafts `pick` names (the engine's chooser's,
        made from this step's `propose(req)`). None: no choice, the program proposes itself and
        verifies every draft."""
        st: BlockState = req.state
        jobs = list(st.prelude)
        if st.phase == "done":
            return jobs  # the K/V of reused commits are still written (the cache stays vanilla's)
        if st.phase == "prefill":
            jobs.append(self._prefill_job(req, st))
        elif st.phase == "denoise":
            jobs.append(self._verify_job(req, st, pick if pick is not None else Pick(self.propose(req))))
        elif st.phase == "commit":
            jobs.append(self._commit_job(req, st))
        else:  # "reuse": a reused commit whose seed token must be read
            jobs.append(self._reuse_job(req, st, st.reuse, read=True))
        return jobs

    def update(self, req: DecodeRequest, results: list[JobResult]) -> None:
        st: BlockState = req.state
        results = results[len(st.prelude):]
        st.prelude = []
        if st.phase == "done":
            return
        res = results[0]
        if st.phase == "prefill":
            req.stats.nfe += 1
            req.counters.prefill_forwards += 1
            st.seed, st.seed_lp = (res.rows[0].token, res.rows[0].logprobs) if res.rows else (None, None)
            self._new_block(req, st)
        elif st.phase == "denoise":
            self._file(req, st, res)
        elif st.phase == "commit":
            req.stats.nfe += 1
            req.counters.commit_forwards += 1
            st.seed, st.seed_lp = (res.rows[0].token, res.rows[0].logprobs) if res.rows else (None, None)
            self._next_block(req, st)
        else:
            st.seed, st.seed_lp, st.reuse = res.rows[0].token, res.rows[0].logprobs, None
            self._next_block(req, st)

    def done(self, req: DecodeRequest) -> bool:
        return req.state is None or (req.state.phase == "done" and not req.state.prelude)

    # ================================================================ blocks
    def _new_block(self, req: DecodeRequest, st: BlockState) -> None:
        N, L, start = req.config.block_size, len(req.context_ids), st.start
        n_prompt = max(0, min(L - start, N))
        tokens = [self.M] * N
        tokens[:n_prompt] = req.context_ids[start: start + n_prompt]
        st.lps = {}
        if st.seed is not None:  # seed-token families: the block's first position, predicted before it
            tokens[n_prompt] = st.seed
            st.lps[n_prompt] = st.seed_lp  # committed by the forward that predicted it
            st.seed, st.seed_lp = None, None
        full = self.spec.full_last_block  # LLaDA2: the last block is decoded past the limit (emit cuts)
        allowed = [(full or start + i < req.limit) and i >= n_prompt for i in range(N)]
        st.tokens, st.n_prompt, st.phase, st.seen = tokens, n_prompt, "denoise", {}
        st.ctx = self._ctx(req, start, allowed, 0, tokens)
        st.mask = window_mask(self.spec.attention, N, self._origin(req))
        self._begin(req, st)

    def _canvas_block(self, req: DecodeRequest, st: BlockState, lo: int) -> None:
        hi = min(lo + req.config.block_size, req.limit)
        allowed = [lo <= i < hi for i in range(req.limit)]
        st.lo, st.ctx, st.mask = lo, self._ctx(req, 0, allowed, lo, st.tokens), None
        self._begin(req, st)

    def _origin(self, req: DecodeRequest) -> int:
        """Absolute position block boundaries are counted from."""
        return 0 if self.spec.alignment == "absolute" else len(req.prompt_ids)

    def _ctx(self, req, start, allowed, origin, tokens) -> BlockContext:
        n0 = sum(1 for t, a in zip(tokens, allowed) if a and t == self.M)
        return BlockContext(start=start, allowed=allowed, block_origin=origin, mask_id=self.M, rule=self.rule(req),
                            step=0, masks_at_start=n0, seed_token=self.spec.seed_token)

    def _begin(self, req: DecodeRequest, st: BlockState) -> None:
        self.windows.new_block(st, st.ctx.start)
        st.parent, st.fresh = None, False
        self._advance(req, st)

    def _block_done(self, req: DecodeRequest, st: BlockState) -> None:
        if not self.spec.uses_cache:
            hi = min(st.lo + req.config.block_size, req.limit)
            if req.emit(st.tokens[st.lo: hi], self.M, self._lps(req, st, st.lo, hi)) or \
                    self._stopped(req, st.tokens, len(req.prompt_ids), hi):
                st.phase = "done"
            elif hi >= req.limit:
                st.phase = "done"
            else:
                self._canvas_block(req, st, hi)
            return
        N, start = req.config.block_size, st.start
        n_allowed = sum(st.ctx.allowed)
        lo, hi = st.n_prompt, st.n_prompt + n_allowed
        if req.emit(st.tokens[lo: hi], self.M, self._lps(req, st, lo, hi)) or start + N >= req.limit:
            st.phase = "done"
            return
        st.seq[start: start + N] = st.tokens
        hidden = self.windows.reuse(st, st.tokens, start)
        if hidden is None:
            st.phase = "commit"
            return
        req.counters.commits_reused += 1
        if self.spec.seed_token:
            st.phase, st.reuse = "reuse", hidden
            return
        st.prelude.append(self._reuse_job(req, st, hidden, read=False))
        self._next_block(req, st)

    @staticmethod
    def _lps(req: DecodeRequest, st: BlockState, lo: int, hi: int) -> list | None:
        """The log-probabilities of tokens[lo:hi] (None: the request did not ask for them)."""
        return None if req.params.logprobs is None else [st.lps.get(i) for i in range(lo, hi)]

    def _next_block(self, req: DecodeRequest, st: BlockState) -> None:
        st.start += req.config.block_size
        self._new_block(req, st)

    # ================================================================ denoising (host)
    def _advance(self, req: DecodeRequest, st: BlockState) -> None:
        """Apply the rule while the current state's scores are stored; stop at the first state that
        needs a verification (phase stays "denoise") or at the end of the block."""
        ctx, cnt = st.ctx, req.counters
        gen_lo = st.n_prompt if self.spec.uses_cache else len(req.prompt_ids)
        allowed = ctx.allowed
        hi = max(indices(allowed), default=-1) + 1
        rule = ctx.rule
        while True:
            masked = [t == self.M and a for t, a in zip(st.tokens, allowed)]
            has_mask = any(masked)
            if not rule.wants_forward(has_mask, ctx) or (
                    req.config.early_stop and rule.mid_block_stop and self._stopped(req, st.tokens, gen_lo, hi)):
                self._block_done(req, st)
                return
            entry = st.store.get(st.store.key(ctx.start, st.tokens, st.seq))
            if entry is None and not rule.monotone:  # a state this block visited before (edits oscillate)
                entry = st.seen.get(tuple(st.tokens))
            if entry is None:
                return
            if not rule.monotone:
                st.seen.setdefault(tuple(st.tokens), Entry(entry.scored, -1, entry.ahead))
            if not st.fresh:
                cnt.reused_states += 1
                if entry.node >= 0:
                    cnt.node_hits[entry.node] += 1
            st.fresh = False
            region = rule.region(rule.candidates(st.tokens, allowed, self.M), ctx.block_origin)
            nxt, ctx.settled = rule.advance(st.tokens, entry.scored, ctx)
            if entry.scored.logprobs is not None:
                _keep_logprobs(st, entry.scored, nxt)
            cnt.filled += sum(1 for a, b in zip(st.tokens, nxt) if a != b)
            st.parent = Step(st.tokens, entry.scored, nxt, region, entry.ahead)
            self.policy.on_step(st.parent, ctx)
            st.tokens = nxt
            ctx.step += 1
            ctx.post += not has_mask

    def _stopped(self, req: DecodeRequest, state: list[int], lo: int, hi: int) -> bool:
        """A stop token in state[lo:hi] with no mask before it (in that range)."""
        for t in state[lo:hi]:
            if t == self.M:
                return False
            if t in req.stop_ids:
                return True
        return False

    # ================================================================ jobs
    def _prefill_job(self, req: DecodeRequest, st: BlockState) -> Job:
        pre, L, h = st.start, len(req.context_ids), req.cache.length  # [0, h): from the prefix cache
        seed = self.spec.seed_token and pre == L
        return Job([req.context_ids[h:pre]], h, req.cache, prefill_mask(self.spec.attention, req.config.block_size),
                   write_cache=True, logits_at=[pre - h - 1] if seed else [], head=self.head, kind="prefill",
                   read=Read(logprobs=req.params.logprobs) if seed else None)

    def _commit_job(self, req: DecodeRequest, st: BlockState) -> Job:
        N = req.config.block_size
        seed = self.spec.seed_token
        return Job([list(st.tokens)], st.start, req.cache, commit_mask(self.spec.attention, N, self._origin(req)), write_cache=True,
                   logits_at=[N - 1] if seed else [], head=self.head, kind="commit",
                   read=Read(logprobs=req.params.logprobs) if seed else None)

    def _reuse_job(self, req: DecodeRequest, st: BlockState, hidden: list, read: bool) -> Job:
        return Job([list(st.tokens)], st.start, req.cache, kind="reuse", hidden=hidden, head=self.head,
                   read=Read(logprobs=req.params.logprobs) if read else None)

    def _propose(self, req: DecodeRequest, st: BlockState) -> Proposal:
        """[root] + the policy's drafts over the window (the block, or the block and later blocks in
        eager mode), drafts made lazily."""
        ctx, state = st.ctx, st.tokens
        N = len(state)
        masked = sum(1 for t, a in zip(state, ctx.allowed) if a and t == self.M)
        extra = self.windows.extra_blocks(st, self.policy, masked, ctx, N, req.limit)
        W = N * (1 + extra)
        ctx.width, ctx.window_allowed = W, ctx.allowed
        if extra:
            ctx.window_allowed = ctx.allowed + [ctx.start + i < req.limit for i in range(N, W)]
        root = _pad(state, W, self.M)
        region = self._regions(root, ctx, N, extra, extra > 0)
        if self._reads_ahead(st, extra, drafts=False):  # the root's look-ahead: the next drafts' material
            region = self._regions(root, ctx, N, extra, True)
        parent = st.parent
        nodes = self._max_drafts() if parent is not None else 0
        return Proposal(W, extra, nodes, make=lambda: self.policy.drafts(state, parent, ctx), root_region=region)

    def _reads_ahead(self, st: BlockState, extra: int, drafts: bool) -> bool:
        """Whether a verification's branches also score the region the rule reads next (draft
        material, never read by the rule): in eager windows, for a policy that reads it but never
        drafts (calibration's recorder), and for a drafting policy while the request drafts (this
        verification has drafts, or its last one had): a request that verifies no drafts pays no
        head rows for material nobody uses."""
        if not self.policy.reads_ahead:
            return extra > 0
        return extra > 0 or self._material(st, drafts)

    def _material(self, st: BlockState, drafts: bool) -> bool:
        """Whether this verification scores draft material (look-aheads, top-k ids): always for a
        policy that reads it but never drafts (calibration's recorder), else while the request drafts."""
        return not self.drafts or drafts or st.drafting

    def _max_drafts(self) -> int:
        """Drafts the policy proposes at most (its graph's nodes; 64 for a policy without a graph)."""
        if type(self.policy).drafts is DraftPolicy.drafts:
            return 0
        graph = getattr(self.policy, "graph", False)
        return len(graph) if graph is not False and graph is not None else (0 if graph is None else 64)

    @staticmethod
    def _need(region: tuple[list[list[int]], list[list[int]]]) -> list[int]:
        """The window indices one branch's scores are read at: its rule regions and look-aheads."""
        parts, aheads = region
        return sorted({i for r in parts + aheads for i in r})

    def _verify_job(self, req: DecodeRequest, st: BlockState, pick: Pick) -> Job:
        """[root] + the picked drafts in one batched forward; the head runs only on each branch's own
        rows (its rule region and look-ahead), never on rows only another branch reads."""
        ctx, state = st.ctx, st.tokens
        prop, chosen = pick.proposal, pick.drafts
        N, W, extra = len(state), prop.width, prop.extra
        drafts = subset(prop.drafts, chosen) if prop.nodes and chosen != [] else []
        req.counters.draft_seconds += prop.seconds
        prop.seconds = 0.0
        branches = [_pad(state, W, self.M)] + [_pad(d.tokens, W, self.M) for d in drafts]
        ahead = self._reads_ahead(st, extra, bool(drafts))
        root = prop.root_region
        if ahead != self._reads_ahead(st, extra, False):  # drafts after all: the root's look-ahead too
            root = self._regions(branches[0], ctx, N, extra, ahead)
        regions = [root] + [self._regions(b, ctx, N, extra, ahead) for b in branches[1:]]
        shift = 1 if self.spec.logits_shift else 0
        rows_at, rows = [], []
        for b, region in enumerate(regions):
            need = self._need(region)
            rows.append({u: len(rows_at) + i for i, u in enumerate(need)})
            rows_at += [b * W + u - shift for u in need]
        read = self._read(req, ctx, branches, rows, N, self.policy.topk if self._material(st, bool(drafts)) else 0)
        st.verification = Verification(branches, drafts, regions, rows, extra, read,
                                       bool(drafts) or pick.drafting)
        return Job(branches, ctx.start, req.cache, st.mask, rows_at=rows_at,
                   parents=[-1] + [d.parent for d in drafts], return_hidden=self.windows.wants_hidden,
                   kind="verify", read=read)

    def _read(self, req, ctx, branches, rows, N, topk: int) -> Read:
        c, T = req.config, req.params.temperature
        keys = None
        if T > 0:  # noise keyed by each row's exact block state (lossless at any temperature)
            keys = [state_key(req.seed, ctx.start + (u // N) * N, b[(u // N) * N: (u // N + 1) * N], ctx.start + u)
                    for b, need in zip(branches, rows) for u in need]
        return Read(kind=c.confidence, temperature=T, topk=topk, keys=keys, logprobs=req.params.logprobs)

    def _regions(self, toks: list[int], ctx: BlockContext, N: int, extra: int,
                 ahead: bool) -> tuple[list[list[int]], list[list[int]]]:
        """Window indices, per block j of the window: the rule's candidate region, and (when `ahead`)
        the region it reads next once that one is filled: the next sub-block of block j, or the
        region of block j+1 when block j has no other mask (draft material)."""
        allowed = ctx.window_allowed
        avail = ctx.rule.candidates(toks, allowed, self.M)
        parts, aheads = [], []
        for j in range(extra + 1):
            lo, origin = j * N, (ctx.block_origin if j == 0 else 0)
            parts.append([lo + i for i in indices(ctx.rule.region(avail[lo: lo + N], origin))])
        if ahead:
            for j in range(extra + 1):
                lo, origin = j * N, (ctx.block_origin if j == 0 else 0)
                taken = set(parts[j])
                rest = [a and (lo + i) not in taken for i, a in enumerate(avail[lo: lo + N])]
                if any(rest):
                    aheads.append([lo + i for i in indices(ctx.rule.region(rest, origin))])
                else:
                    aheads.append(parts[j + 1] if j < extra else [])
        return parts, aheads

    def _file(self, req: DecodeRequest, st: BlockState, res: JobResult) -> None:
        """Store every branch state's scores (the newest batch only: bounded memory), then advance."""
        v, ctx, cnt = st.verification, st.ctx, req.counters
        N = len(st.tokens)
        req.stats.nfe += 1
        req.stats.verify_forwards += 1
        cnt.add_fold(res.stats)
        cnt.drafts_verified += len(v.drafts)
        cnt.eager_windows += int(v.extra > 0)
        if st.parent is not None:  # a block's first step cannot draft: it says nothing
            st.drafting = v.drafting
        for d in v.drafts:
            cnt.node_drafts[d.node] += 1
        cnt.budgets[len(v.drafts)] += 1
        st.store.clear(ctx.start)
        self.windows.remember(st, v.branches, res.hidden, ctx.start)
        T = v.read.temperature > 0
        for b, (parts, aheads) in enumerate(v.regions):
            toks, lookup = v.branches[b], v.rows[b]
            node = -1 if b == 0 else v.drafts[b - 1].node
            for j in range(1 + v.extra):
                # block j's scores are exact only if every earlier block of the window is complete
                if j > 0 and self.M in toks[: j * N]:
                    break
                rows = [res.rows[lookup[p]] for p in parts[j]]
                scored = Scored([p - j * N for p in parts[j]], [r.token_t if T else r.token for r in rows],
                                [r.conf_t if T else r.conf for r in rows], [r.top for r in rows] if v.read.topk else None,
                                [r.logprobs for r in rows] if v.read.logprobs is not None else None)
                ahead = None
                if aheads and aheads[j]:
                    arows = [res.rows[lookup[p]] for p in aheads[j]]
                    ahead = Scored([p - j * N for p in aheads[j]], [r.token for r in arows], [r.conf for r in arows],
                                   [r.top for r in arows] if v.read.topk else None)
                st.store.put((ctx.start + j * N, tuple(toks[: (j + 1) * N])), Entry(scored, node, ahead))
        st.verification, st.fresh = None, True
        self._advance(req, st)


def _keep_logprobs(st: BlockState, scored: Scored, nxt: list[int]) -> None:
    """The log-probabilities of every token this rule step wrote, from the scores of the exact state it
    was applied to (the forward that committed it; for a lossless method that state's scores are
    vanilla's). A later edit (llada2_edit) overwrites them: a token's numbers come from the forward
    that committed its final value."""
    at = {p: i for i, p in enumerate(scored.positions)}
    for p, (a, b) in enumerate(zip(st.tokens, nxt)):
        if a != b:
            st.lps[p] = scored.logprobs[at[p]]


def _pad(t: list[int], W: int, M: int) -> list[int]:
    return list(t) if len(t) == W else list(t) + [M] * (W - len(t))
