"""Causal decode programs (SPEC §10): Nemotron-Labs-Diffusion's own fast modes.

- `ar.py`: autoregressive decoding, one causal forward per token;
- `linear_spec.py`: LinearSpec self-speculation (bidirectional drafts, one causal verify per round),
  single- and multi-branch;
- `branches.py`: the alternative drafts of multi-branch LinearSpec, built from the draft forwards'
  distributions (no extra forward);
- `state.py`: the per-request state object and the token choice shared by both programs;
- `driver.py`: runs one request by executing each `Forward` with `model.forward` (or a verifier).

A program never calls the model: `next_forwards(state) -> list[Forward]` says what it needs now and
`absorb(state, results)` takes the `ForwardResult`s. All per-request state lives on the state object.
"""
