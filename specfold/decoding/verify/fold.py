"""Folded verification (SpecFold, SPEC §6): the verifier that replaces the dense batched forward.

Same call signature as DenseVerifier. Per layer it runs `specfold.kernels.fold_pack` on the
branches' hidden states: draft rows whose residual barely differs from their parent's (ρ ≤ δ) skip
QKV and FFN work and get an exactly corrected attention. δ = 0 reproduces dense verification. The
gate runs once per layer, after attention (its decision covers the layer's FFN and the next layer's
QKV), plus once on the embeddings: L + 1 host syncs for L layers.

Two entry points:
- `__call__(tokens, parents, positions, cache, mask, out_idx)`: one forward (tests, benchmarks). A
  batch with no drafts (B == 1) is the plain dense `model(...)` forward. Its fold statistics are
  `last_stats[0]`.
- `verify_many(forwards) -> list[ForwardResult]` (the engine's runner): the `Forward`s of
  one engine step in one packed pass. Folding stays inside each forward's branch tree
  (`Forward.parents`), never across forwards; the position-wise work (norms, fused QKV, o_proj, FFN,
  head) runs over the rows of all forwards at once, attention per forward over its own prefix cache
  and window mask. Statistics per forward, in the same order, are left in `self.last_stats`
  (`list[FoldStats]`) and in `result.stats` as
  `FoldStats.counts()` (per-layer count lists): the engine adds them to request i's counters
  (`FoldStats.add` / `from_counts`) and derives ratios with `FoldStats.report()` (None where no
  draft position was verified).

The last layer runs its FFN only on the rows the head reads (`head_rows` / `logits_at`) and the
rows they take their FFN output from: no row's output past the last layer is read anywhere else.
A forward with `return_hidden` computes all its rows.

Eager windows: `return_hidden` gives every row's hidden states (folded rows: the folded values), so
an eager commit writes the block's K/V from them. At δ = 0 they are the dense ones; at δ > 0 a block
committed from a draft branch carries its folded rows' approximation into the prefix cache (the root
branch always recomputes, so a block committed from the root is exact).

Invariants: the prefix cache is read through zero-copy views; the root branch always recomputes;
`parents[b]` is branch b's parent inside the batch (-1 for the root); the index structures of a
verification (`PackPlan`) are built once per call, not per layer; fused q/k/v and gate/up weights
are fused once per model (`layer_weights`: the model's own weights become views of the fused ones,
so there is no second copy).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch

from specfold.models.forward import Forward, ForwardResult
from specfold.kernels import LayerWeights, get_backend
from specfold.kernels.fold_pack import PackPlan, Segment, packed_fold_layer
from specfold.models.cache import PrefixCache
from specfold.models.transformer import Transformer


@dataclass
class FoldStats:
    """Fold counters per layer of one request (or of one forward): python ints."""

    folded: list[int]
    positions: list[int]
    ffn_folded: list[int]
    verifications: int = 0
    root_only: int = field(default=0)  # verifications with no draft (dense forward, nothing to fold)

    @classmethod
    def zeros(cls, layers: int) -> "FoldStats":
        return cls([0] * layers, [0] * layers, [0] * layers)

    @classmethod
    def from_counts(cls, counts: dict) -> "FoldStats":
        """From the per-layer count lists of `counts()` (the `ForwardResult.stats` dict)."""
        return cls(list(counts["folded"]), list(counts["positions"]), list(counts["ffn_folded"]),
                   counts.get("verifications", 0), counts.get("root_only", 0))

    def counts(self) -> dict:
        """Per-layer "folded", "positions", "ffn_folded" lists (+ verification counts): what the engine
        adds to a request's counters (sum them with `add`, derive ratios with `report`)."""
        return {"folded": list(self.folded), "positions": list(self.positions), "ffn_folded": list(self.ffn_folded),
                "verifications": self.verifications, "root_only": self.root_only}

    def add(self, other: "FoldStats") -> None:
        for mine, theirs in ((self.folded, other.folded), (self.positions, other.positions),
                             (self.ffn_folded, other.ffn_folded)):
            for li, x in enumerate(theirs):
                mine[li] += x
        self.verifications += other.verifications
        self.root_only += other.root_only

    def report(self, delta: float | None = None) -> dict:
        """fold_ratio (all layers), fold_ratio_excl_layer0, fold_ratio_per_layer, ffn_fold_ratio:
        folded / verified draft positions, None where no draft position was verified."""
        def ratio(num: list[int], den: list[int]) -> float | None:
            return sum(num) / sum(den) if sum(den) else None

        out = {
            "fold_ratio": ratio(self.folded, self.positions),
            "fold_ratio_excl_layer0": ratio(self.folded[1:], self.positions[1:]),
            "fold_ratio_per_layer": [f / p if p else None for f, p in zip(self.folded, self.positions)],
            "ffn_fold_ratio": ratio(self.ffn_folded, self.positions),
            "ffn_fold_ratio_per_layer": [f / p if p else None for f, p in zip(self.ffn_folded, self.positions)],
            "fold_verifications": self.verifications,
            "fold_root_only": self.root_only,
        }
        if delta is not None:
            out["delta"] = delta
        return out


class FoldVerifier:
    name = "fold"
    returns_hidden = True  # eager commits write K/V from the verification's hidden states

    packs_with_model = False
    # the last layer's FFN on the rows the head reads only (False: on every row, as before; kept for
    # side-by-side benchmarks, benchmarks/draft_budgets.py --ab-last-layer)
    prune_last_layer = True

    def __init__(self, model: Transformer, delta: float, backend: str = "torch"):
        self.model, self.delta, self.backend = model, float(delta), backend
        self.be = get_backend(backend)
        self.weights = layer_weights(model)
        self.last_stats: list[FoldStats] = []

    # ------------------------------------------------------------------ entry points
    def __call__(self, tokens: torch.Tensor, parents: list[int], positions: torch.Tensor,
                 cache: PrefixCache | None, mask: torch.Tensor | None, out_idx: torch.Tensor,
                 return_hidden: bool = False):
        """One forward: tokens [B, W] (branch 0 = root), parents[b] = parent branch (-1 for the root)
        -> logits [B, len(out_idx), V] at window indices `out_idx` (and, when asked, the hidden
        states: every layer's input [B, W, d] and the final one, as the dense forward returns them).
        Its statistics are `self.last_stats[0]`. B == 1 is the plain dense forward."""
        if tokens.shape[0] == 1:  # nothing to fold
            self.last_stats = [FoldStats(*([[0] * len(self.weights)] * 3), verifications=1, root_only=1)]
            return self.model(tokens, positions, cache=cache, mask=mask, logits_at=out_idx,
                              return_hidden=return_hidden)
        res = self.verify_many([Forward(tokens, positions, cache, mask, logits_at=out_idx, parents=list(parents),
                                        return_hidden=return_hidden)])
        return (res[0].logits, res[0].hidden) if return_hidden else res[0].logits

    def verify_many(self, forwards: list[Forward]) -> list[ForwardResult]:
        """One packed folded pass over the `kind="verify"` forwards of an engine step; per-forward
        statistics in `self.last_stats`. Equal to calling `__call__` on each forward alone."""
        m, s = self.model, self.model.spec
        L = len(self.weights)
        for f in forwards:
            if f.write_cache:
                raise ValueError("verify_many takes verification forwards (write_cache=False)")
        if not forwards:
            self.last_stats = []
            return []
        dtype = m.dtype
        segs, cos, sin = [], [], []
        for f in forwards:
            B, W = f.tokens.shape
            par = list(f.parents) if f.parents else ([-1] if B == 1 else [])
            if len(par) != B:
                raise ValueError(f"a forward with {B} branches needs {B} parents, got {len(f.parents)}")
            c, sn = m.rope.cos_sin(f.positions, dtype)
            qscale = m.rope.query_scale(f.positions, dtype)
            if qscale is not None and not bool((qscale == 1).all()):
                raise NotImplementedError("folded verification does not support Llama-4 query scaling past the "
                                          "original context; use method='spiffy' (dense) for such positions")
            segs.append(Segment(B, W, par, f.mask))  # None = full (the runner passes no all-true mask)
            cos.append(c)
            sin.append(sn)
        plan = PackPlan(segs, cos, sin, m.device)
        X = m.embed(torch.cat([f.tokens.reshape(-1) for f in forwards]))            # [T, d]
        empty = X.new_zeros(s.num_kv_heads, 0, s.head_dim)
        stats = [FoldStats.zeros(L) for _ in forwards]
        hidden: list[list[torch.Tensor]] = [[] for _ in forwards]
        want_hidden = [f.return_hidden for f in forwards]
        carried = None  # layer l's post-attention gate decides layer l+1's q/k/v rows (one sync per layer)
        picks = self._picks(forwards, segs)
        need = self._need(picks, forwards, segs, plan.T) if self.prune_last_layer else None
        for li, w in enumerate(self.weights):
            if any(want_hidden):
                self._keep(hidden, X, segs, want_hidden)
            prefixes = [f.cache.view(li) if f.cache is not None else (empty, empty) for f in forwards]
            X, layer_stats, carried = packed_fold_layer(X, plan, w, prefixes, self.delta, m.attn_scale, self.be,
                                                        qkv=carried, need=need if li == L - 1 else None)
            for st, ls in zip(stats, layer_stats):
                st.folded[li] += ls.folded
                st.positions[li] += ls.draft_positions
                st.ffn_folded[li] += ls.ffn_folded
        if any(want_hidden):
            self._keep(hidden, X, segs, want_hidden)
        for st, sg in zip(stats, segs):
            st.verifications = 1
            st.root_only = int(sg.B1 == 1)
        self.last_stats = stats
        return self._heads(X, forwards, segs, hidden, picks)

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _keep(hidden, X, segs, want) -> None:
        for h, sg, wnt in zip(hidden, segs, want):
            if wnt:
                h.append(X[sg.offset: sg.offset + sg.size].view(sg.B1, sg.N, -1))

    @staticmethod
    def _picks(forwards: list[Forward], segs: list[Segment]) -> list[torch.Tensor]:
        """Per forward, the flat rows (over all segments) the head reads."""
        picks = []
        for f, sg in zip(forwards, segs):
            if f.head_rows is not None:  # each branch's own rows (flat b·N + t)
                picks.append(sg.offset + f.head_rows)
                continue
            dev = f.tokens.device
            at = f.logits_at if f.logits_at is not None else torch.arange(sg.N, device=dev)
            idx = sg.offset + (torch.arange(sg.B1, device=dev)[:, None] * sg.N + at[None, :])  # at: on the model's device
            picks.append(idx.reshape(-1))
        return picks

    @staticmethod
    def _need(picks: list[torch.Tensor], forwards: list[Forward], segs: list[Segment], T: int) -> torch.Tensor | None:
        """The rows whose last-layer output is read: the head's rows, and every row of a forward that
        returns its hidden states. None when that is every row (nothing to skip)."""
        parts = [torch.arange(sg.offset, sg.offset + sg.size, device=p.device) if f.return_hidden else p
                 for p, f, sg in zip(picks, forwards, segs)]
        need = torch.unique(torch.cat(parts))  # sorted, each row once
        return None if need.numel() == T else need

    def _heads(self, X: torch.Tensor, forwards: list[Forward], segs: list[Segment],
               hidden: list[list[torch.Tensor]], picks: list[torch.Tensor]) -> list[ForwardResult]:
        """The head once per head kind, over the selected rows of every forward at once."""
        logits: list[torch.Tensor | None] = [None] * len(forwards)
        for kind in dict.fromkeys(f.head for f in forwards):
            sel = [i for i, f in enumerate(forwards) if f.head == kind]
            out = self.model.head(X[torch.cat([picks[i] for i in sel])], kind)
            for i, part in zip(sel, out.split([len(picks[i]) for i in sel])):
                b = 1 if forwards[i].head_rows is not None else segs[i].B1
                logits[i] = part.view(b, -1, part.shape[-1])
        return [ForwardResult(lg, h if f.return_hidden else None, st.counts())
                for lg, h, f, st in zip(logits, hidden, forwards, self.last_stats)]


_WEIGHTS: "weakref.WeakKeyDictionary[Transformer, list[LayerWeights]]" = weakref.WeakKeyDictionary()


def layer_weights(model: Transformer) -> list[LayerWeights]:
    """Every layer's `LayerWeights` with fused q/k/v and gate/up, built once per model and shared by
    all its verifiers (a `generate` call with DecodeParams builds a new engine and verifier). The
    fusion is gpt-fast's load-time one: the layer's own q/k/v and gate/up weights become row views of
    the fused tensors (same values and shapes, contiguous), so the model holds one copy of them, not
    two. A layer whose weight tensors were replaced since is fused again."""
    cached = _WEIGHTS.get(model)
    if cached is None or any(not _same(w, layer) for w, layer in zip(cached, model.layers)):
        cached = [_fuse(layer, model.spec.head_dim) for layer in model.layers]
        _WEIGHTS[model] = cached
    return cached


def _fuse(layer, head_dim: int) -> LayerWeights:
    """(A MoE layer fuses q/k/v only: its FFN is the layer's own `moe`, run on the packed rows.)"""
    fused = []
    moe = getattr(layer, "moe", None) is not None
    with torch.no_grad():
        for names in (("q_proj", "k_proj", "v_proj"),) + (() if moe else (("gate_proj", "up_proj"),)):
            mods = [getattr(layer, n) for n in names]
            whole = torch.cat([m.weight for m in mods])
            off = 0
            for m in mods:
                rows = m.weight.shape[0]
                m.weight = torch.nn.Parameter(whole[off: off + rows], requires_grad=m.weight.requires_grad)
                off += rows
            fused.append(whole)
    w = LayerWeights.from_layer(layer, head_dim)
    w.share_fused(fused[0], None if moe else fused[1])
    return w


def _same(w: LayerWeights, layer) -> bool:
    """Whether `w` still holds the layer's current tensors (identity, no copy)."""
    now = LayerWeights.from_layer(layer, w.head_dim)
    return w.moe is now.moe and all(getattr(w, f) is getattr(now, f) for f in LayerWeights.__slots__
               if isinstance(getattr(now, f), torch.Tensor))
