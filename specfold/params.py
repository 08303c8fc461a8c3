"""DecodeParams: what a user asks of one generate call, validated in two stages.

`__post_init__` rejects settings that are impossible for any model (δ < 0, max_new_tokens ≤ 0,
threshold outside (0, 1], unknown names). `resolve(spec)` fills unset fields from the model family's
defaults and rejects settings impossible for this model (block not a multiple of the sub-block,
Nemotron's max_new_tokens not a multiple of the block). Nothing is silently clamped.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from specfold.errors import ParamsError

RULES = ("static", "threshold", "sub_block", "dynamic", "llada", "dream")
CONFIDENCES = ("max_prob", "margin", "neg_entropy")


@dataclass(slots=True)
class DecodeParams:
    method: str = "vanilla"
    rule: str | None = None
    block_size: int | None = None
    sub_block_size: int | None = None
    tokens_per_step: int | None = None  # k of static / dynamic
    threshold: float | None = None
    threshold_ge: bool | None = None  # `>=` instead of `>` (Nemotron-Labs-Diffusion, FreeDave)
    confidence: str | None = None
    steps: int | None = None  # llada: steps per block; dream: total steps
    max_new_tokens: int = 256
    temperature: float = 0.0
    seed: int = 0
    chat_template: bool = False
    early_stop: bool = True  # stop denoising a block once a stop token is committed with no mask before it
    # speculative decoding (FreeDave, Spiffy) and SpecFold
    draft_depth: int = 8
    eager: bool = False
    branches: int = 7
    graph: object = None  # path to a Spiffy graph JSON or a DraftGraph
    delta: float = 0.1
    drafts: str = "spiffy"
    backend: str = "torch"

    def __post_init__(self) -> None:
        if self.max_new_tokens <= 0:
            raise ParamsError(f"max_new_tokens must be > 0, got {self.max_new_tokens}")
        if self.rule is not None and self.rule not in RULES:
            raise ParamsError(f"unknown rule {self.rule!r}; accepted: {list(RULES)}")
        if self.confidence is not None and self.confidence not in CONFIDENCES:
            raise ParamsError(f"unknown confidence {self.confidence!r}; accepted: {list(CONFIDENCES)}")
        if self.threshold is not None and not 0.0 < self.threshold <= 1.0:
            raise ParamsError(f"threshold must be in (0, 1], got {self.threshold}")
        for name in ("block_size", "sub_block_size", "tokens_per_step", "steps"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ParamsError(f"{name} must be a positive integer, got {v}")
        if self.temperature < 0:
            raise ParamsError(f"temperature must be >= 0, got {self.temperature}")
        if self.delta < 0:
            raise ParamsError(f"delta must be >= 0 (0 = dense verification), got {self.delta}")
        if not 1 <= self.draft_depth <= 64:
            raise ParamsError(f"draft_depth must be in [1, 64], got {self.draft_depth}")
        if not 1 <= self.branches <= 64:
            raise ParamsError(f"branches must be in [1, 64], got {self.branches}")

    def replace(self, **kw) -> "DecodeParams":
        return dataclasses.replace(self, **kw)

    def resolve(self, spec) -> "DecodeParams":
        """A copy with every decode field set: unset ones take the family's defaults."""
        p = dataclasses.replace(self)
        p.rule = p.rule or spec.rule
        if p.rule == "dream" and spec.attention != "bidirectional":
            from specfold.models.spec import FAMILIES
            fams = sorted({f["family"] for f in FAMILIES.values() if f.get("attention") == "bidirectional"})
            raise ParamsError(f"rule 'dream' decodes the whole answer as one bidirectional canvas: it is for "
                              f"bidirectional models ({', '.join(fams)}), not {spec.family} ({spec.attention} "
                              f"attention); use this family's default rule ({spec.rule!r}) or another one")
        if p.rule == "dream" and p.block_size is None:
            p.block_size = p.max_new_tokens  # Dream decodes the whole canvas as one block
        p.block_size = p.block_size or spec.block_size
        if p.sub_block_size is None:
            p.sub_block_size = spec.sub_block_size if p.rule == "sub_block" else None
        if p.rule == "sub_block" and p.sub_block_size is None:
            raise ParamsError("rule 'sub_block' needs sub_block_size (the model's config has none)")
        if p.sub_block_size is not None and p.block_size % p.sub_block_size:
            raise ParamsError(f"block_size={p.block_size} is not a multiple of sub_block_size={p.sub_block_size}")
        p.tokens_per_step = p.tokens_per_step or spec.tokens_per_step
        if p.tokens_per_step > p.block_size:
            raise ParamsError(f"tokens_per_step={p.tokens_per_step} exceeds block_size={p.block_size}")
        p.threshold = spec.threshold if p.threshold is None else p.threshold
        p.threshold_ge = spec.threshold_ge if p.threshold_ge is None else p.threshold_ge
        p.confidence = p.confidence or spec.confidence
        if p.steps is None:
            p.steps = p.block_size if p.rule in ("llada", "dream") else None
        if spec.max_new_tokens_multiple_of_block and p.max_new_tokens % p.block_size:
            raise ParamsError(f"{spec.family} decodes whole blocks: max_new_tokens={p.max_new_tokens} must be "
                              f"a multiple of block_size={p.block_size}")
        if p.eager and spec.attention != "block_causal":
            raise ParamsError(f"eager mode needs a block-causal model; {spec.family} uses {spec.attention!r}")
        return p
