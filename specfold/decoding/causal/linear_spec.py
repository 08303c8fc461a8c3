"""LinearSpec self-speculation (SPEC §10, upstream `linear_spec_generate`), single- and multi-branch.

Per request: the prompt goes through one causal forward that writes the cache and predicts the first
token (counted). Each round, with `n = min(block_size, tokens still allowed)`:
- the block is `[last committed token, M × (n−1)]` at positions `[start, start+n)`;
- **draft**: bidirectional forwards of the block against the cached prefix, writing nothing; each
  applies the unmask rule (the family's: NLD thresholds with `>=`; threshold 0 fills every mask in
  one forward; any other rule works too) until no mask is left;
- **verify**: one causal forward of the drafted block(s); `logits[i]` predicts position `start+i+1`;
- **accept** the longest prefix on which the draft equals the causal choice, plus one bonus token (the
  causal choice at the first mismatch): 1 to n new tokens, each exactly what AR would produce;
- stop at the first stop token, or when `max_new_tokens` tokens are final (the last round is shortened
  to the budget, so no position past prompt + max_new_tokens is ever computed).

Single-branch (`branches=1`): the verify has one branch, writes the block's K/V and the cache is
cropped to the accepted length (`PrefixCache.truncate`). Multi-branch: `branches` drafts (branches.py)
go through ONE batched causal forward that reads the shared prefix view and writes nothing; the
accepted branch's committed tokens become `pending` and their K/V are recomputed as the causal head
rows of the next forward that has a single branch (the next round's first draft forward, whose window
is `pending + block`: pending rows causal among themselves, block rows see them; the forward writes
and the block's rows are cropped away). Draft forwards are those of single-branch LinearSpec on the
same state, so a multi-branch round never costs more forwards than a single-branch round and
accepts at least as many tokens; a whole generation is compared in the tests.

Invariants: the rule only ever sees draft logits of the exact block state it is applied to; every
committed token is a causal choice (`state.choose`) given the committed prefix, so the output equals
`method="ar"` token for token (float64, and for a fixed seed at T > 0).
"""
from __future__ import annotations

from dataclasses import dataclass

from specfold.decoding.causal import branches as alt
from specfold.decoding.causal.ar import causal_head, prefill_job
from specfold.decoding.causal.state import CausalState, causal_read, commit, count, remaining
from specfold.decoding.jobs import Job, JobResult
from specfold.decoding.readout import Read
from specfold.decoding.rules import Rule, Scored, indices
from specfold.errors import ParamsError
from specfold.models.spec import ModelSpec


@dataclass
class Round:
    block: list[int]  # [n] main draft: [last committed, drafted tokens / masks]
    masks_at_start: int
    record: alt.DraftRecord
    step: int = 0
    batch: list[list[int]] | None = None  # [B][n] the verified drafts (branch 0 = main)


class LinearSpec:
    """LinearSpec rounds (host; one `CausalState` per request)."""
    name = "linear_spec"

    def __init__(self, spec: ModelSpec, rule: Rule, block_size: int, branches: int = 1,
                 confidence: str = "max_prob"):
        if spec.attention != "causal_prefix":
            raise ParamsError(f"method 'linear_spec' needs a causal-prefix family (Nemotron-Labs-Diffusion): "
                              f"its drafts are bidirectional blocks placed right after the last committed "
                              f"token; {spec.family} is {spec.attention}")
        self.M, self.rule, self.N = spec.mask_token_id, rule, int(block_size)
        self.head = causal_head(spec, "linear_spec")
        self.branches, self.confidence = int(branches), confidence

    # ------------------------------------------------------------------ jobs
    def plan(self, req, st: CausalState) -> list[Job]:
        if st.phase == "prefill":
            return [prefill_job(req, self.head)]
        r: Round = st.round
        a, n = len(st.pending), len(r.block)
        if st.phase == "draft":
            region = self._region(r)
            read = Read(kind=self.confidence, topk=2 if self.branches > 1 else 0, probs=self.branches > 1)
            return [Job([st.pending + r.block], st.start - a, req.cache, ("pending", a), write_cache=a > 0,
                        logits_at=[a + i for i in region], head="lm", kind="draft", read=read)]
        drafts = [r.block] if self.branches == 1 else alt.build(r.record, r.block, self._budget(req))
        r.batch = drafts
        q = [st.start + i + 1 for i in range(n)]
        return [Job([st.pending + d for d in drafts], st.start - a, req.cache, ("causal",),
                    write_cache=len(drafts) == 1, logits_at=list(range(a, a + n)), head=self.head,
                    parents=[-1] + [0] * (len(drafts) - 1), kind="verify" if len(drafts) > 1 else "commit",
                    read=causal_read(req, q * len(drafts)))]

    def _region(self, r: Round) -> list[int]:
        return indices(self.rule.region([t == self.M for t in r.block], 0))

    def _budget(self, req) -> int:
        """Drafts this round may verify: `branches`, capped at 1 + a fixed draft budget (under "auto":
        `branches`)."""
        b = req.config.draft_budget
        return self.branches if b == "auto" else max(1, min(self.branches, 1 + b))

    # ------------------------------------------------------------------ results
    def update(self, req, st: CausalState, results: list[JobResult]) -> None:
        res = results[0]
        if st.phase == "prefill":
            count(req, "prefill", len(req.prompt_ids))
            req.counters.prefill_forwards += 1
            if not commit(req, st, [res.rows[0].token_t], self.M, res.rows[:1]):
                self._new_round(req, st)
        elif st.phase == "draft":
            self._absorb_draft(req, st, res)
        else:
            self._absorb_verify(req, st, res)

    def _new_round(self, req, st: CausalState) -> None:
        n = min(self.N, remaining(req, st))
        block = [self.M] * n
        block[0] = st.generated[-1]
        st.round = Round(block, n - 1, alt.DraftRecord.empty(n))
        st.phase = "draft" if n > 1 else "verify"

    def _absorb_draft(self, req, st: CausalState, res: JobResult) -> None:
        r: Round = st.round
        count(req, "draft", len(st.pending) + len(r.block))
        if st.pending:  # this forward wrote the pending K/V (and the block's): keep the pending only
            req.cache.truncate(st.start)
            st.pending = []
        region = self._region(r)
        scored = Scored(region, [x.token for x in res.rows], [x.conf for x in res.rows])
        nxt = self.rule.apply(r.block, scored, r.step, r.masks_at_start)
        if self.branches > 1:
            alt.observe(r.record, r.block, nxt, region, res.rows, self.M)
        r.block, r.step = nxt, r.step + 1
        if self.M not in nxt:
            st.phase = "verify"

    def _absorb_verify(self, req, st: CausalState, res: JobResult) -> None:
        r: Round = st.round
        B, n = len(r.batch), len(r.block)
        count(req, "verify", B * (len(st.pending) + n))
        best, best_len, best_tok = 0, 0, None
        for b in range(B):
            ar = [x.token_t for x in res.rows[b * n: (b + 1) * n]]
            acc = 1
            while acc < n and ar[acc - 1] == r.batch[b][acc]:
                acc += 1
            if acc > best_len:
                best, best_len, best_tok = b, acc, ar
        ex = req.stats.extra
        ex["rounds"] = ex.get("rounds", 0) + 1
        ex.setdefault("accept_lengths", []).append(best_len)  # tokens made final by this round
        ex["accepted_drafts"] = ex.get("accepted_drafts", 0) + best_len - 1
        ex["branches_verified"] = ex.get("branches_verified", 0) + B
        if best > 0:
            ex["alternative_wins"] = ex.get("alternative_wins", 0) + 1
        if B == 1:  # this forward wrote pending + block: keep the committed part
            req.cache.truncate(st.start + best_len)
            st.pending = []
        else:
            st.pending = st.pending + r.batch[best][:best_len]
        st.round = None
        if not commit(req, st, best_tok[:best_len], self.M, res.rows[best * n: best * n + best_len]):
            self._new_round(req, st)
