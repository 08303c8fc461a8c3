"""Causal decode programs (SPEC §10): Nemotron-Labs-Diffusion's own fast modes.

- `ar.py`: autoregressive decoding, one causal forward per token;
- `linear_spec.py`: LinearSpec self-speculation (bidirectional drafts, one causal verify per round),
  single- and multi-branch;
- `branches.py`: the alternative drafts of multi-branch LinearSpec, built from the draft forwards'
  distributions (no extra forward);
- `state.py`: the per-request state object, how the causal choice is read, and forward counts;
- `program.py`: the engine hooks (start / plan / update), as for the block program.

A program never calls the model or reads a tensor: `plan(req, state) -> [Job]` says what it needs
now and `update(req, state, results)` takes the host `JobResult`s.
"""
