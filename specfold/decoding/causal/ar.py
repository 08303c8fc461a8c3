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

import torch

from specfold.decoding.causal.state import CausalState, choose
from specfold.decoding.layout import causal
from specfold.engine.forward import Forward, ForwardResult
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


def prefill_forward(st: CausalState, head: str) -> Forward:
    """The prompt through one causal forward that writes the cache; logits at its last position."""
    dev = st.cache.k.device
    L = len(st.prompt)
    pos = torch.arange(L, device=dev)
    return Forward(torch.tensor([st.prompt], dtype=torch.long, device=dev), pos, st.cache, causal(pos),
                   write_cache=True, logits_at=torch.tensor([L - 1], device=dev), head=head, kind="prefill")


class AR:
    """`next_forwards` / `absorb` program of autoregressive decoding (one request per state)."""
    name = "ar"

    N = 1  # rows of a decode forward (cache headroom)

    def __init__(self, spec: ModelSpec):
        self.M = spec.mask_token_id
        self.head = causal_head(spec, "ar")

    def next_forwards(self, st: CausalState) -> list[Forward]:
        if st.done:
            return []
        if st.phase == "prefill":
            return st.ask([prefill_forward(st, self.head)])
        dev = st.cache.k.device
        pos = torch.tensor([st.start], device=dev)
        tok = torch.tensor([[st.generated[-1]]], dtype=torch.long, device=dev)
        return st.ask([Forward(tok, pos, st.cache, None, write_cache=True, head=self.head, kind="decode")])

    def absorb(self, st: CausalState, results: list[ForwardResult]) -> None:
        kind = "prefill" if st.phase == "prefill" else "decode"
        st.count(kind)
        q = len(st.prompt) + len(st.generated)  # the position this forward predicts
        tok = choose(results[0].logits[0, -1:], torch.tensor([q]), self.M, st.temperature, st.seed)
        if not st.emit([int(tok[0])]):
            st.phase = "decode"
