"""`Job`: one forward a program asks for, in host data; `JobResult`: what comes back, in host data.

The seam between the programs and the engine. A program says what it needs with plain Python lists
(branch tokens, the window's first absolute position, a mask description, where the head runs: the
same window indices for every branch (`logits_at`) or each branch's own rows (`rows_at`, flat
indices b·T + t, so a branch pays the head only for the positions its own scores are read at),
what to read from the logits) and gets back host values (`readout.Row`s). The runner
(engine/runner.py) turns every job of a step into device tensors with one host-to-device copy, runs
them in one packed model call, computes every read on the device and copies them back at once.

Mask descriptions (decoding/layout.py builds them on the device): None = full attention inside the
window; ("block", n, origin) = block-causal in blocks of n counted from absolute `origin`;
("causal",) = causal; ("pending", a) = `a` pending rows causal among themselves, the rest sees all.

A `kind="reuse"` job runs no forward: it writes a window's K/V from hidden states an earlier
verification returned (`hidden`: `HiddenRows`, one branch's rows of a `JobResult.hidden`, eager
commits) and, when `read` is set, runs the head on the window's last row.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from specfold.decoding.readout import Read, Row
from specfold.models.cache import PrefixCache


@dataclass(slots=True)
class HiddenRows:
    """Rows [start, stop) of branch `branch` of the hidden states a verification returned (`source`:
    its `JobResult.hidden`, device tensors [B, T, d] per layer + the final one); `rows()` slices them
    on the device. Host data says which rows, so another rank can slice its own copy."""
    source: list
    branch: int
    start: int
    stop: int

    def rows(self) -> list:
        return [h[self.branch, self.start: self.stop] for h in self.source]


@dataclass(slots=True)
class Job:
    tokens: list[list[int]]  # [B][T] branch tokens of one window
    start: int  # absolute position of window index 0 (positions start .. start+T-1)
    cache: PrefixCache | None = None
    mask: tuple | None = None
    write_cache: bool = False
    logits_at: list[int] | None = None  # window indices where the head runs (None = none read)
    rows_at: list[int] | None = None  # or per branch: flat rows b*T + t (b-major, ascending; overrides logits_at)
    head: str = "lm"
    parents: list[int] = field(default_factory=list)
    return_hidden: bool = False
    kind: str = "verify"  # "prefill" | "verify" | "commit" | "draft" | "decode" | "reuse"
    read: Read | None = None  # what to read at every (branch, logits_at) row, b-major (or every rows_at row)
    hidden: HiddenRows | None = None  # reuse jobs: the hidden states to write K/V from

    @property
    def rows(self) -> int:
        """Token rows this job costs (scheduling budget)."""
        return 0 if self.kind == "reuse" else len(self.tokens) * len(self.tokens[0])

    @property
    def width(self) -> int:
        return len(self.tokens[0])

    @property
    def head_rows(self) -> int:
        """Rows the LM head runs on (cost model)."""
        if self.rows_at is not None:
            return len(self.rows_at)
        return len(self.tokens) * len(self.logits_at or [])


@dataclass(slots=True)
class JobResult:
    rows: list[Row]  # b-major over (branch, logits_at), or in rows_at order
    hidden: list | None = None  # device: every layer's input [B, T, d] + the final one, when asked
    stats: dict | None = None  # verifier statistics (fold counts), host ints

    def row(self, b: int, k: int, per_branch: int) -> Row:
        return self.rows[b * per_branch + k]
