"""Autoregressive decoding through a diffusion checkpoint's causal path (SPEC §10, `method="ar"`).

Prefill: one causal forward over the whole prompt writes its K/V and predicts the first token (counted).
Then one causal forward per token: the last token at its position, against the cached prefix, writes
its K/V and predicts the next. Stop at the first stop token or after exactly `max_new_tokens`; the
stop token's own K/V are never computed (no forward after the last token).

Which families: a causal next-token head is needed.
- `causal_prefix` (Nemotron-Labs-Diffusion): the causal forwards of its diffusion mode; head "ar",
  which is the `diffusion_head` unless the checkpoint also ships an `lm_head` (upstream's
  `ar_generate` and `linear_spec_generate` use `diffusion_head` in every mode; its checkpoints ship no
  other head, so the two agree).
- `block_causal` with `logits_shift` (Fast-dLLM v2): with block size 1 the block-causal mask *is* the
  causal mask and the shifted head predicts the next token, so AR = vanilla decoding with block 1 at
  one forward per token (its seed-token path). Offered, head "lm".
- `block_causal` without shift (SDAR, the embedded tiny model unless its config shifts): a block of
  one is a masked position predicted in place, not a next-token prediction: refused, as are the
  bidirectional families (Dream, LLaDA).
"""
from __future__ import annotations

from specfold.decoding.causal.state import CausalState, causal_read, commit, count
from specfold.decoding.jobs import Job, JobResult
from specfold.errors import ParamsError
from specfold.models.spec import ModelSpec


def causal_head(spec: ModelSpec, method: str) -> str:
    """The head of `spec`'s causal next-token path, or ParamsError when it has none."""
    if spec.attention == "causal_prefix":
        return "ar"
    if spec.attention == "block_causal" and spec.logits_shift:
        return "lm"
    raise ParamsError(f"method {method!r} needs a causal next-token path: Nemotron-Labs-Diffusion (causal "
                      f"prefix) or a block-causal family with shifted logits (Fast-dLLM v2); "
                      f"{spec.family} is {spec.attention}{'' if spec.logits_shift else ' without logits shift'}")


def prefill_job(req, head: str) -> Job:
    """The context (the prompt, or after a preemption the prompt + output) through one causal forward
    that writes the cache after the prefix-cache hit [0, h); the choice at its last position."""
    ctx, h = req.context_ids, req.cache.length
    L = len(ctx)
    return Job([list(ctx[h:])], h, req.cache, ("causal",), write_cache=True, logits_at=[L - h - 1], head=head,
               kind="prefill", read=causal_read(req, [L]))


class AR:
    """Autoregressive decoding (host; one `CausalState` per request)."""
    name = "ar"
    N = 1  # rows of a decode forward (cache headroom)

    def __init__(self, spec: ModelSpec):
        self.M = spec.mask_token_id
        self.head = causal_head(spec, "ar")

    def plan(self, req, st: CausalState) -> list[Job]:
        if st.phase == "prefill":
            return [prefill_job(req, self.head)]
        q = len(req.prompt_ids) + len(st.generated)  # the position this forward predicts
        return [Job([[st.generated[-1]]], st.start, req.cache, None, write_cache=True, logits_at=[0], head=self.head,
                    kind="decode", read=causal_read(req, [q]))]

    def update(self, req, st: CausalState, results: list[JobResult]) -> None:
        if st.phase == "prefill":
            count(req, "prefill", len(req.prompt_ids))
            req.counters.prefill_forwards += 1
        else:
            count(req, "decode", 1)
        row = results[0].rows[0]
        if not commit(req, st, [row.token_t], self.M, [row]):
            st.phase = "decode"
