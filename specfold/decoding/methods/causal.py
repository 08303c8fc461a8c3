"""Nemotron-Labs-Diffusion's own fast modes as registered methods: `ar`, `linear_spec` (one branch),
`linear_spec_multi` (dense multi-branch) and `linear_specfold` (folded multi-branch). They are
per-request programs (decoding/causal/), not draft policies of the block program: each builder returns
a `CausalProgram` (the engine runs it as is) and is marked `whole_blocks = False` (any
max_new_tokens, where the family's diffusion mode decodes whole blocks)."""
from functools import partial

from specfold.decoding.causal.methods import NAMES, build, supports
from specfold.decoding.methods import register

for _name in NAMES:
    _fn = partial(build, _name)
    _fn.whole_blocks = False
    _fn.supports = partial(supports, _name)
    register(_name)(_fn)
