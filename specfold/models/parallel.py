"""Tensor and expert parallelism (Megatron-style, as vLLM and SGLang shard): which slice of each weight
a rank holds, the shapes it computes with, and the one collective its layers need.

    par = Parallel(rank, size, expert_parallel, group)     # group: a torch.distributed process group
    local = local_spec(spec, par)                          # the shapes this rank's Transformer has
    rows = shard(canonical_name, full_shape, spec, par)    # the slice of a checkpoint tensor it loads

Sharding (rank r of N):
- q_proj / k_proj / v_proj (weight and bias): column-parallel, rows split by heads (q heads
  [r H/N, (r+1) H/N), kv heads [r Hkv/N, ...)): a rank's q heads read exactly its kv heads (GQA);
- o_proj: row-parallel (its input columns split the same way); down_proj likewise against gate/up,
  which split their rows by I/N;
- a MoE layer under TP alone: every expert's intermediate split by I/N (w_gate/w_up dim 1, w_down
  dim 2), the shared expert like a dense MLP. With `expert_parallel`, a rank holds experts
  [r E/N, (r+1) E/N) whole; the router (replicated) routes every row over all E experts and the
  rank runs only its own; the shared expert is still split like a dense MLP;
- embeddings, norms, the router and the heads are replicated: on the proxy measured (BENCHMARKS
  "Tensor parallelism", vocabulary 640) the head is under 1 % of a step, so splitting it by vocabulary
  would buy nothing there; a ~150k vocabulary was not measured. The step's read happens on rank 0.

So the attention output and the FFN output of a layer are partial sums on every rank, and each needs
one all-reduce (`Parallel.reduce`): two per layer. After it every rank holds the same hidden states
bit for bit (an all-reduce hands every rank the same sum), which is what keeps SpecFold's fold gate,
run on every rank, deciding the same rows everywhere.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from specfold.errors import ConfigError, DistributedError


@dataclass(frozen=True)
class Parallel:
    rank: int = 0
    size: int = 1
    expert_parallel: bool = False
    group: Any = None  # the process group of the collectives (ProcessGroupGloo / NCCL); None: one rank
    control: Any = None  # rank 0's channel to the other ranks (executor/groups.py: send / recv)
    fault: Any = None  # () -> str: what failed, when a collective raises (the executor knows)

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks (in place; returns it). One rank: `x` as it is."""
        if self.size > 1:
            try:
                self.group.allreduce([x]).wait()
            except RuntimeError as e:
                raise self.failed(e) from None
        return x

    def failed(self, e: BaseException) -> DistributedError:
        """The one-line error of a collective that raised `e` (a rank died, or it timed out)."""
        if isinstance(e, DistributedError):
            return e
        why = self.fault() if self.fault is not None else None
        return DistributedError(why or f"a tensor-parallel collective failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}")

    def expert_range(self, num_experts: int) -> tuple[int, int]:
        """The experts this rank holds whole ([lo, hi)); every expert without expert parallelism."""
        if not self.expert_parallel or self.size == 1:
            return 0, num_experts
        n = num_experts // self.size
        return self.rank * n, (self.rank + 1) * n


ONE = Parallel()


def _divisors(values: list[int]) -> list[int]:
    top = min(values) if values else 1
    return [n for n in range(1, top + 1) if all(v % n == 0 for v in values)]


def check_divisible(spec, size: int, expert_parallel: bool = False) -> None:
    """ConfigError (one line: what divides) unless every sharded dimension splits into `size` parts."""
    if size < 1:
        raise ConfigError(f"tensor_parallel_size must be >= 1, got {size}")
    dims = {"num_attention_heads": spec.num_heads, "num_key_value_heads": spec.num_kv_heads}
    dense = [i for i in range(spec.num_layers) if not spec.is_moe_layer(i)]
    if dense:
        dims["intermediate_size"] = spec.intermediate_size
    if spec.num_experts:
        if expert_parallel:
            dims["num_experts"] = spec.num_experts
        else:
            dims["moe_intermediate_size"] = spec.moe_intermediate_size
        if spec.shared_experts:
            dims["moe_intermediate_size x num_shared_experts"] = spec.moe_intermediate_size * spec.shared_experts
    bad = [f"{k}={v}" for k, v in dims.items() if v % size]
    if bad:
        ok = ", ".join(map(str, _divisors(list(dims.values()))))
        mode = " with expert parallelism" if expert_parallel else ""
        raise ConfigError(f"tensor_parallel_size={size} does not divide {', '.join(bad)} of this checkpoint; "
                          f"sizes that divide every sharded dimension{mode}: {ok}")


def local_spec(spec, par: Parallel):
    """The spec of one rank's shard: its heads and FFN widths (the decoding fields unchanged)."""
    if par.size == 1:
        return spec
    n = par.size
    moe_inter = spec.moe_intermediate_size if par.expert_parallel else spec.moe_intermediate_size // n
    return dataclasses.replace(spec, num_heads=spec.num_heads // n, num_kv_heads=spec.num_kv_heads // n,
                               intermediate_size=spec.intermediate_size // n, moe_intermediate_size=moe_inter)


# canonical parameter suffix -> the dimension its shard splits (row = 0 of [out, in])
_SPLIT = {"q_proj.weight": 0, "q_proj.bias": 0, "k_proj.weight": 0, "k_proj.bias": 0, "v_proj.weight": 0,
          "v_proj.bias": 0, "o_proj.weight": 1, "gate_proj.weight": 0, "up_proj.weight": 0,
          "down_proj.weight": 1}
_EXPERT_SPLIT = {"moe.w_gate": 1, "moe.w_up": 1, "moe.w_down": 2}  # [E, I, d] / [E, d, I] under TP


def shard(name: str, shape: tuple[int, ...], par: Parallel) -> tuple[int, int, int] | None:
    """(dim, start, stop) of the slice of canonical parameter `name` (full shape `shape`) that this
    rank holds; None: replicated (the whole tensor). Stacked expert parameters under expert
    parallelism split dim 0 (their experts); a single expert slot `name[e]` is sliced by the caller."""
    if par.size == 1:
        return None
    base = name.split("[")[0]
    suffix = base.split(".", 2)[-1] if base.startswith("layers.") else base
    if suffix in _EXPERT_SPLIT:
        if par.expert_parallel:
            lo, hi = par.expert_range(shape[0])
            return 0, lo, hi
        dim = _EXPERT_SPLIT[suffix]
    else:
        key = suffix.removeprefix("moe.shared.")
        if key not in _SPLIT:
            return None
        dim = _SPLIT[key]
    n = shape[dim] // par.size
    return dim, par.rank * n, (par.rank + 1) * n


def expert_slot_split(name: str, par: Parallel) -> int | None:
    """For one expert's tensor (slot `name[e]`, shape without the expert dim): the dim its TP shard
    splits (gate/up: 0, down: 1); None under expert parallelism (an expert is held whole)."""
    if par.size == 1 or par.expert_parallel:
        return None
    base = name.split("[")[0]
    suffix = base.split(".", 2)[-1]
    return _EXPERT_SPLIT[suffix] - 1 if suffix in _EXPERT_SPLIT else None


def parameter_bytes(model: torch.nn.Module) -> int:
    """Bytes of the distinct parameter storages a model holds (tied weights counted once)."""
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
    return sum(storages.values())
