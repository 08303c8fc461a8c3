"""Outputs of `LLM.generate`: one `RequestOutput` per prompt, with its `DecodeStats`."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(slots=True)
class DecodeStats:
    nfe: int = 0  # forward passes, prefill and commit forwards included
    verify_forwards: int = 0  # denoising forwards (block states; speculative: verification batches)
    tokens: int = 0  # generated tokens returned
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)  # method-specific counters

    @property
    def tokens_per_forward(self) -> float:
        return self.tokens / self.nfe if self.nfe else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tokens_per_forward"] = self.tokens_per_forward
        d["tokens_per_second"] = self.tokens_per_second
        return d


@dataclass(slots=True)
class RequestOutput:
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated ids only, truncated at the first stop token (excluded)
    text: str
    finish_reason: str  # "stop" | "length" | "abort"
    stats: DecodeStats
    request_id: str | None = None
