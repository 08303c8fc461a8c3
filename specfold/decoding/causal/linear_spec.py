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

import torch

from specfold.decoding.causal import branches as alt
from specfold.decoding.causal.ar import causal_head, prefill_forward
from specfold.decoding.causal.state import CausalState, choose
from specfold.decoding.layout import causal
from specfold.decoding.rules import Rule, score
from specfold.engine.forward import Forward, ForwardResult
from specfold.errors import ParamsError
from specfold.models.spec import ModelSpec


@dataclass
class Round:
    block: torch.Tensor  # [n] main draft: [last committed, drafted tokens / masks]
    masks_at_start: int
    record: alt.DraftRecord
    step: int = 0
    batch: torch.Tensor | None = None  # [B, n] the verified drafts (branch 0 = main)


def draft_mask(a: int, n: int, device) -> torch.Tensor:
    """[a+n, a+n]: `a` pending rows causal among themselves; the n block rows see everything."""
    m = torch.ones(a + n, a + n, dtype=torch.bool, device=device)
    if a:
        m[:a, :a] = causal(torch.arange(a, device=device))
        m[:a, a:] = False
    return m


class LinearSpec:
    """`next_forwards` / `absorb` program of LinearSpec (one request per state)."""
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

    # ------------------------------------------------------------------ forwards
    def next_forwards(self, st: CausalState) -> list[Forward]:
        if st.done:
            return []
        if st.phase == "prefill":
            return st.ask([prefill_forward(st, self.head)])
        r: Round = st.round
        dev = st.cache.k.device
        pend = torch.tensor(st.pending, dtype=torch.long, device=dev)
        a, n = len(st.pending), r.block.shape[0]
        pos = torch.arange(st.start - a, st.start + n, device=dev)
        if st.phase == "draft":
            region = self.rule.region(r.block == self.M, 0).nonzero()[:, 0]
            toks = torch.cat([pend, r.block])[None]
            return st.ask([Forward(toks, pos, st.cache, draft_mask(a, n, dev), write_cache=a > 0,
                                   logits_at=a + region, head="lm", kind="draft")])
        drafts = [r.block] if self.branches == 1 else alt.build(r.record, r.block, self._budget(st))
        r.batch = torch.stack(drafts)
        toks = torch.cat([pend.expand(len(drafts), a), r.batch], dim=1)
        return st.ask([Forward(toks, pos, st.cache, causal(pos), write_cache=len(drafts) == 1,
                               logits_at=torch.arange(a, a + n, device=dev), head=self.head,
                               parents=[-1] + [0] * (len(drafts) - 1),
                               kind="verify" if len(drafts) > 1 else "commit")])

    def _budget(self, st: CausalState) -> int:
        """Drafts this round may verify: `branches`, capped at 1 + the engine's draft budget."""
        return self.branches if st.budget is None else max(1, min(self.branches, 1 + st.budget))

    # ------------------------------------------------------------------ results
    def absorb(self, st: CausalState, results: list[ForwardResult]) -> None:
        res = results[0]
        if st.phase == "prefill":
            st.count("prefill")
            q = torch.tensor([len(st.prompt)])
            tok = choose(res.logits[0, -1:], q, self.M, st.temperature, st.seed)
            if not st.emit([int(tok[0])]):
                self._new_round(st)
        elif st.phase == "draft":
            self._absorb_draft(st, res)
        else:
            self._absorb_verify(st, res)

    def _new_round(self, st: CausalState) -> None:
        n = min(self.N, st.remaining)
        dev = st.cache.k.device
        block = torch.full((n,), self.M, dtype=torch.long, device=dev)
        block[0] = st.generated[-1]
        st.round = Round(block, n - 1, alt.DraftRecord.empty(n, dev))
        st.phase = "draft" if n > 1 else "verify"

    def _absorb_draft(self, st: CausalState, res: ForwardResult) -> None:
        st.count("draft")
        r: Round = st.round
        if st.pending:  # this forward wrote the pending K/V (and the block's): keep the pending only
            st.cache.truncate(st.start)
            st.pending = []
        region = self.rule.region(r.block == self.M, 0).nonzero()[:, 0]
        logits = res.logits[0]
        scored = score(logits, region, self.M, self.confidence, 0.0, None)
        nxt = self.rule.apply(r.block, scored, r.step, r.masks_at_start)
        if self.branches > 1:
            alt.observe(r.record, r.block, nxt, region, logits, self.M)
        r.block, r.step = nxt, r.step + 1
        if not bool((nxt == self.M).any()):
            st.phase = "verify"

    def _absorb_verify(self, st: CausalState, res: ForwardResult) -> None:
        st.count("verify")
        r: Round = st.round
        B, n = r.batch.shape
        q = torch.arange(st.start + 1, st.start + n + 1)
        best, best_len, best_tok = 0, 0, None
        for b in range(B):
            ar = choose(res.logits[b], q, self.M, st.temperature, st.seed)
            match = (ar[: n - 1] == r.batch[b, 1:]).long()
            acc = int(match.cumprod(0).sum()) + 1
            if acc > best_len:
                best, best_len, best_tok = b, acc, ar
        ex = st.stats.extra
        ex["rounds"] = ex.get("rounds", 0) + 1
        ex.setdefault("accept_lengths", []).append(best_len)  # tokens made final by this round
        ex["accepted_drafts"] = ex.get("accepted_drafts", 0) + best_len - 1
        ex["branches_verified"] = ex.get("branches_verified", 0) + B
        if best > 0:
            ex["alternative_wins"] = ex.get("alternative_wins", 0) + 1
        if B == 1:  # this forward wrote pending + block: keep the committed part
            st.cache.truncate(st.start + best_len)
            st.pending = []
        else:
            st.pending = st.pending + r.batch[best, :best_len].tolist()
        st.round = None
        if not st.emit(best_tok[:best_len].tolist()):
            self._new_round(st)
