"""Outputs of `LLM.generate`: one `RequestOutput` per prompt, with its `DecodeStats`.

`RequestOutput.logprobs` (when `SamplingParams(logprobs=N)` asked for them; None otherwise): one dict
per token of `token_ids`, token id -> log-probability, like vLLM's: the N most likely tokens in rank
order, then the chosen token if it is not among them (so N or N + 1 entries; the chosen one is
`logprobs[i][token_ids[i]]`). The numbers are those of the forward that committed the token, at
temperature 1 with the mask token excluded (docs/SERVING.md, "Log-probabilities").
"""
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
    logprobs: list[dict[int, float]] | None = None  # per token: {token id: log-probability} (asked for)
