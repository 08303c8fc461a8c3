"""Load a local HuggingFace checkpoint folder: config.json + safetensors (single or sharded) + tokenizer.

Weight names are mapped from each family's layout to specfold's canonical names (`embed`,
`layers.{i}.q_proj`, ..., `norm`, `lm_head`; LLaDA2's fused q/k/v and per-expert tensors through
models/llada2.py; Qwen3-MoE's `mlp.gate` router and `mlp.experts.E.*_proj` by `canonical_name`;
an expert's tensor filling slot e of a stacked `layers.{i}.moe.w_*`). Invariants:
every parameter (every expert slot) of the model must be found (else CheckpointError naming the
missing ones); shapes must match; tensors are read one at a time straight into the model's dtype
and device. Under tensor/expert parallelism (`par`, models/parallel.py) each tensor is read as the
slice this rank holds, copied out of a memory map of the file (`Mapped`: only the pages of the
slice are read, and the copy owns no more than the slice), and an expert another rank holds is not
read at all: no rank materialises the full model (LLaDA2's fused q/k/v of one layer, and its q/k norms, are
read whole and split, one layer's tensor at a time).
"""
from __future__ import annotations


import json
import math
import mmap
import os
import re
import warnings
from importlib import resources
from pathlib import Path

import torch
from safetensors import safe_open

from specfold.errors import CheckpointError
from specfold.models.parallel import ONE, Parallel, check_divisible, expert_slot_split, shard
from specfold.models.spec import ModelSpec, resolve_spec
from specfold.models.transformer import Transformer, make_rope

_LAYER_PARTS = {  # HF suffix inside a layer -> canonical
    "self_attn.q_proj": "q_proj", "self_attn.k_proj": "k_proj", "self_attn.v_proj": "v_proj",
    "self_attn.o_proj": "o_proj", "self_attn.q_norm": "q_norm", "self_attn.k_norm": "k_norm",
    "mlp.gate_proj": "gate_proj", "mlp.up_proj": "up_proj", "mlp.down_proj": "down_proj",
    "input_layernorm": "input_norm", "post_attention_layernorm": "post_norm",
}
_OLMO_PARTS = {  # LLaDA (OLMo names) suffix inside a block -> canonical
    "q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "attn_out": "o_proj",
    "ff_proj": "gate_proj", "up_proj": "up_proj", "ff_out": "down_proj",
    "attn_norm": "input_norm", "ff_norm": "post_norm",
}


def canonical_name(name: str, layout: str) -> str | None:
    """Map a checkpoint tensor name to specfold's name (None: not a model weight, e.g. inv_freq)."""
    if layout == "olmo":
        m = re.fullmatch(r"model\.transformer\.blocks\.(\d+)\.(\w+)\.(weight|bias)", name)
        if m and m.group(2) in _OLMO_PARTS:
            return f"layers.{m.group(1)}.{_OLMO_PARTS[m.group(2)]}.{m.group(3)}"
        return {"model.transformer.wte.weight": "embed.weight",
                "model.transformer.ln_f.weight": "norm.weight",
                "model.transformer.ff_out.weight": "lm_head.weight"}.get(name)
    root = "encoder" if layout == "nemotron" else "model"
    m = re.fullmatch(rf"{root}\.layers\.(\d+)\.([\w.]+)\.(weight|bias)", name)
    if m and m.group(2) in _LAYER_PARTS:
        return f"layers.{m.group(1)}.{_LAYER_PARTS[m.group(2)]}.{m.group(3)}"
    if m and m.group(3) == "weight":  # Qwen3-MoE (SDAR-MoE): the router, one expert's slot e
        if m.group(2) == "mlp.gate":
            return f"layers.{m.group(1)}.moe.router"
        e = re.fullmatch(r"mlp\.experts\.(\d+)\.(gate|up|down)_proj", m.group(2))
        if e:
            return f"layers.{m.group(1)}.moe.w_{e.group(2)}[{e.group(1)}]"
    table = {f"{root}.embed_tokens.weight": "embed.weight", f"{root}.norm.weight": "norm.weight"}
    if layout == "nemotron":
        table.update({"diffusion_head.weight": "lm_head.weight", "lm_head.weight": "ar_head.weight"})
    else:
        table["lm_head.weight"] = "lm_head.weight"
    return table.get(name)


def read_config(path: Path) -> dict:
    if not path.is_dir():
        raise CheckpointError(f"checkpoint folder {str(path)!r} does not exist (expected a local "
                              f"HuggingFace folder with config.json and *.safetensors, or 'tiny')")
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{str(path)!r} has no config.json")
    try:
        return json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{cfg_path} is not valid JSON: {e}") from None


def read_generation_config(path: Path) -> dict | None:
    """generation_config.json of a checkpoint folder (None: it has none); its eos_token_id is one
    source of the stop ids (spec.checkpoint_eos)."""
    gen_path = path / "generation_config.json"
    if not gen_path.is_file():
        return None
    try:
        gen = json.loads(gen_path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{gen_path} is not valid JSON: {e}") from None
    if not isinstance(gen, dict):
        raise CheckpointError(f"{gen_path} must hold a JSON object, got {type(gen).__name__}")
    return gen


def read_spec(path: str | os.PathLike, overrides: dict | None = None,
              vocab: dict[str, int] | None = None) -> tuple[ModelSpec, dict]:
    """(spec, config) of a checkpoint folder: config.json and generation_config.json, no weights."""
    path = Path(path)
    config = read_config(path)
    return resolve_spec(config, overrides, vocab, read_generation_config(path)), config


def weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"{index} is malformed ({e!r}); expected a 'weight_map'") from None
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise CheckpointError(f"{str(path)!r}: shard(s) listed in model.safetensors.index.json are "
                                  f"missing: {missing}")
        return [path / s for s in shards]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{str(path)!r} has no *.safetensors weights "
                              f"(model.safetensors or a sharded model.safetensors.index.json)")
    return files


def load_model(path: str | os.PathLike, dtype: torch.dtype, device: str | torch.device,
               overrides: dict | None = None, vocab: dict[str, int] | None = None, par: Parallel = ONE
               ) -> tuple[Transformer, ModelSpec, dict]:
    """Build the Transformer of a checkpoint folder and load its weights (rank `par.rank`'s shard).
    Returns (model, spec, config); `spec` is the checkpoint's, `model.spec` the shard's."""
    path = Path(path)
    spec, config = read_spec(path, overrides, vocab)
    check_divisible(spec, par.size, par.expert_parallel)
    files = weight_files(path)
    with torch.device("meta"):
        model = Transformer(spec, par)
    if spec.weight_layout == "nemotron" and "lm_head.weight" in _names(files):  # optional causal head
        model.ar_head = torch.nn.Linear(spec.hidden_size, spec.vocab_size, bias=False, device="meta")
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded: dict[str, torch.Tensor] = {}
    slots: dict[str, set[int]] = {}  # stacked expert parameters: the expert slots filled so far
    unused = []
    for f in files:
        try:
            with safe_open(str(f), framework="pt", device="cpu") as sf, Mapped(f) as mapped:
                for name in sf.keys():
                    pieces = _pieces(name, sf, spec, params, par, mapped)
                    if pieces is None:  # an expert another rank holds
                        continue
                    if not pieces and not name.endswith("inv_freq"):
                        unused.append(name)
                    for canon, t in pieces:
                        _place(loaded, slots, params, canon, t, f"{f.name}: tensor {name!r}", device, dtype)
        except (OSError, RuntimeError) as e:
            if isinstance(e, CheckpointError):
                raise
            raise CheckpointError(f"cannot read weights file {f}: {e}") from None
    if spec.tie_word_embeddings:
        loaded.pop("lm_head.weight", None)
    missing = sorted(n for n in params if n not in loaded
                     and not (spec.tie_word_embeddings and n == "lm_head.weight"))
    missing += [f"{n}[{e}]" for n, got in slots.items() for e in range(params[n].shape[0]) if e not in got]
    if missing:
        shown = ", ".join(missing[:8]) + (f" ... ({len(missing)} in all)" if len(missing) > 8 else "")
        raise CheckpointError(f"{str(path)!r}: weights missing from the checkpoint: {shown}")
    if unused:
        warnings.warn(f"{len(unused)} checkpoint tensor(s) not used by specfold, e.g. {unused[:3]}")
    model.load_state_dict(loaded, strict=False, assign=True)
    if spec.tie_word_embeddings:
        model.lm_head.weight = model.embed.weight
    # the rope tables were built under the meta device with the modules: rebuild them for real
    model.rope = make_rope(spec)
    model.eval().requires_grad_(False)
    return model, spec, config


def _pieces(name: str, sf, spec: ModelSpec, params: dict, par: Parallel,
            mapped: "Mapped") -> list[tuple[str, torch.Tensor]] | None:
    """The canonical (name, tensor) pieces of checkpoint tensor `name` that the model has: this
    rank's slice of each, an expert slot renumbered among the experts the rank holds (None: an
    expert another rank holds, not read)."""
    if spec.weight_layout == "llada2":  # fused q/k/v split, per-expert slots (models/llada2.py)
        from specfold.models.llada2 import reads_whole, tensors
        if reads_whole(name):
            return [(c, _narrow(c, t, par)) for c, t in tensors(name, sf.get_tensor(name), spec)
                    if _slot(c)[0] in params]
        canons = [c for c, _ in tensors(name, None, spec)]
    else:
        canons = [canonical_name(name, spec.weight_layout)]
    out, elsewhere = [], False
    for canon in canons:
        if canon is None or _slot(canon)[0] not in params:
            continue
        local = _local_slot(canon, params, par)
        if local is None:
            elsewhere = True
        else:
            out.append((local, _read(sf, mapped, name, local, par)))
    return None if elsewhere and not out else out


def _local_slot(canon: str, params: dict, par: Parallel) -> str | None:
    """An expert slot renumbered among this rank's experts; None: another rank holds it."""
    base, e = _slot(canon)
    if e is None or not par.expert_parallel:
        return canon
    lo, hi = par.expert_range(params[base].shape[0] * par.size)
    return f"{base}[{e - lo}]" if lo <= e < hi else None


def _read(sf, mapped: "Mapped", name: str, canon: str, par: Parallel) -> torch.Tensor:
    """This rank's slice of a checkpoint tensor (the whole tensor when it is replicated)."""
    cut = _cut(canon, tuple(mapped.header[name]["shape"]), par)
    if cut is None:
        return sf.get_tensor(name)
    return mapped.slice(name, *cut)


_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool}


class Mapped:
    """A safetensors file mapped into memory (copy-on-write, never written): `slice(name, dim, a, b)`
    copies rows [a, b) along `dim` of one tensor out of the mapping, so only their pages are read
    (safetensors' own slicing reads the whole tensor first)."""

    def __init__(self, path: Path):
        self.path = path
        self.file = open(path, "rb")
        self.mm = mmap.mmap(self.file.fileno(), 0, access=mmap.ACCESS_COPY)
        n = int.from_bytes(self.mm[:8], "little")
        self.header = json.loads(self.mm[8: 8 + n])
        self.base = 8 + n

    def slice(self, name: str, dim: int, a: int, b: int) -> torch.Tensor:
        info = self.header[name]
        dtype = _ST_DTYPES.get(info["dtype"])
        if dtype is None:
            raise CheckpointError(f"{self.path.name}: tensor {name!r} has dtype {info['dtype']}, which specfold "
                                  f"cannot split across ranks (accepted: {sorted(_ST_DTYPES)})")
        shape, (start, _) = info["shape"], info["data_offsets"]
        if not math.prod(shape):
            return torch.empty(shape, dtype=dtype).narrow(dim, a, b - a)
        full = torch.frombuffer(self.mm, dtype=dtype, count=math.prod(shape), offset=self.base + start)
        return full.view(shape).narrow(dim, a, b - a).clone()

    def __enter__(self) -> "Mapped":
        return self

    def __exit__(self, *exc) -> None:
        self.mm.close()
        self.file.close()


def _narrow(canon: str, t: torch.Tensor, par: Parallel) -> torch.Tensor:
    """This rank's slice of a tensor already read whole."""
    cut = _cut(canon, tuple(t.shape), par)
    return t if cut is None else t.narrow(cut[0], cut[1], cut[2] - cut[1]).clone()


def _cut(canon: str, shape: tuple[int, ...], par: Parallel) -> tuple[int, int, int] | None:
    if _slot(canon)[1] is None:
        return shard(canon, shape, par)
    dim = expert_slot_split(canon, par)
    if dim is None or dim >= len(shape):
        return None
    n = shape[dim] // par.size
    return dim, par.rank * n, (par.rank + 1) * n


def _slot(canon: str) -> tuple[str, int | None]:
    """'layers.1.moe.w_up[3]' -> ('layers.1.moe.w_up', 3); a plain name -> (name, None)."""
    if canon.endswith("]"):
        base, e = canon[:-1].rsplit("[", 1)
        return base, int(e)
    return canon, None


def _place(loaded: dict, slots: dict, params: dict, canon: str, t: torch.Tensor, what: str,
           device, dtype) -> None:
    base, e = _slot(canon)
    want = tuple(params[base].shape)[0 if e is None else 1:]
    if tuple(t.shape) != want:
        raise CheckpointError(f"{what} has shape {tuple(t.shape)}, config.json implies {want}")
    if e is None:
        loaded[base] = t.to(device=device, dtype=dtype)
        return
    if not 0 <= e < params[base].shape[0]:
        raise CheckpointError(f"{what}: expert {e} is outside [0, {params[base].shape[0]})")
    if base not in loaded:
        loaded[base] = torch.empty(params[base].shape, device=device, dtype=dtype)
    loaded[base][e] = t
    slots.setdefault(base, set()).add(e)


def _names(files: list[Path]) -> list[str]:
    out = []
    for f in files:
        with safe_open(str(f), framework="pt", device="cpu") as sf:
            out.extend(sf.keys())
    return out


def tiny_path() -> Path:
    """Folder of the embedded tiny model inside the installed package."""
    p = Path(str(resources.files("specfold.tiny") / "model"))
    if not (p / "config.json").is_file():
        raise CheckpointError(f"the embedded tiny model is missing from the installed package ({p}); "
                              f"reinstall specfold or run `specfold train-tiny --out DIR`")
    return p
