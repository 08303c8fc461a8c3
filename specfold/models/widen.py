"""Function-preserving widening of a checkpoint (SPEC §9): the source's function at a wider shape.

`widen_checkpoint(source, out, shape)` writes an ordinary HF checkpoint folder (config.json with the
source's diffusion fields, safetensors, the source's tokenizer and other files) whose logits equal the
source's: a **cost proxy** for benchmarks. Only HF Llama/Qwen weight names (`model.layers.*`) are
widened: Qwen2 (q/k/v bias), Qwen3 (per-head q/k norm), Llama, and the diffusion families built on them.

How each piece stays exact (hidden d -> d', FFN F -> F', heads H/Hkv -> H'/Hkv', layers L -> L'):
- Hidden vectors are zero in the new dims: the embedding and every matrix that writes into the
  residual stream (o_proj, down_proj) have zero rows there; the head has zero columns there.
- RMSNorm over d' dims: weights `w·sqrt(d/d')` (the new dims get `sqrt(d/d')` too; they multiply 0)
  and `eps' = eps·d/d'`, so `rsqrt(mean'(x²)+eps') = sqrt(d'/d)·rsqrt(mean(x²)+eps)` and the
  normalised old dims are unchanged.
- HF configs have one `rms_norm_eps` for every norm, so the per-head q/k norms (Qwen3) get eps' too
  although their width (head_dim) does not change. The original heads' q/k projections (and biases)
  are therefore multiplied by `sqrt(d/d') = sqrt(eps'/eps)`: `norm_eps'(s·q) = norm_eps(q)` exactly.
  The q/k norm weights (shared by all heads) are kept.
- Extra query/KV heads get random q/k/v rows (normal, the std of the source tensor) and random q/k/v
  bias where the layout has bias; the o_proj columns of every head that is not an original query head
  are zero. Extra FFN units get random gate/up rows and zero down_proj columns. Matrices that read
  the hidden state are random in the new input dims (they multiply zeros).
- head_dim never changes (RoPE tables and the attention scale depend on it).

Head layout (GQA). Query head h uses KV head h // g with g = H/Hkv; after widening head h' uses
h' // g' with g' = H'/Hkv'. Appending the new heads after the old ones would move old query heads
into the wrong group as soon as g' != g (with 4/2 -> 8/2, old head 2 of KV group 1 would land in
group 0). So every original KV head j occupies c = ceil(g/g') consecutive new KV slots
[j·c, (j+1)·c), all exact copies of it (c = 1 whenever g' >= g, the usual case), and original query
head h = j·g + r (r < g) moves to slot j·c·g' + r, whose KV head j·c + r // g' is a copy of j.
Every other slot is a new random head. Needs Hkv' >= c·Hkv (else a one-line WidenError).

Extra layers (L' > L) are identities: random q/k/v and gate/up, zero o_proj and down_proj, so the
residual passes through unchanged. They are spread evenly, each placed *before* a real layer
(source layer i is preceded by (L'-L)//L identities, one more for the first (L'-L)%L layers). An
identity layer's input is exactly the input of the real layer it precedes, so SpecFold's QKV gate
computes the same ρ there and folds exactly the same rows: its entry in `fold_ratio_per_layer`
equals that real layer's, and the overall fold ratio becomes the average of the real layers' ratios
weighted by their copies (equal to the source's when L divides L'). Its FFN-gate fold ratio is its
QKV-gate one (zero o_proj leaves the post-attention residual unchanged). Folding an identity layer
never changes any output (its contributions are zero either way), so tokens at δ > 0 are the
source's too. What a widened model measures is time at the wider/deeper shape; fold ratios,
accepted drafts and tokens are the source's.

Presets set the *width* of Qwen2.5-0.5B / 1.5B / 7B (hidden, FFN, KV heads); depth stays the
source's unless `layers` is given (the named depth is in PRESETS). Because head_dim is the
source's, the query head count is the multiple of the KV head count whose H'·D is nearest the named
model's H·D (its q/o projection width); with a source of the named head_dim this is the named shape
exactly. Explicit values override the preset.

Exactness is a float64 statement: write with dtype=float64 to compare at 1e-9. In float32 the
rescaled norm weights round (relative 6e-8), far below float32 inference noise.
"""
from __future__ import annotations

import json
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specfold.errors import SpecfoldError
from specfold.models.loader import read_config, weight_files
from specfold.models.spec import ModelSpec, resolve_spec, fingerprint


class WidenError(SpecfoldError):
    """A widening that cannot be done (smaller target, bad GQA layout, unsupported layout)."""


# named shapes, from the models' public config.json files
PRESETS: dict[str, dict] = {
    "0.5b": dict(name="Qwen2.5-0.5B", hidden=896, intermediate=4864, heads=14, kv_heads=2, head_dim=64, layers=24),
    "1.5b": dict(name="Qwen2.5-1.5B", hidden=1536, intermediate=8960, heads=12, kv_heads=2, head_dim=128, layers=28),
    "7b": dict(name="Qwen2.5-7B", hidden=3584, intermediate=18944, heads=28, kv_heads=4, head_dim=128, layers=28),
}
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
SHARD_BYTES = 2 << 30

_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")
_MLP = ("gate_proj", "up_proj", "down_proj")
_NORMS = ("input_layernorm", "post_attention_layernorm")


@dataclass(frozen=True, slots=True)
class Shape:
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    layers: int

    @classmethod
    def of(cls, spec: ModelSpec) -> "Shape":
        return cls(spec.hidden_size, spec.intermediate_size, spec.num_heads, spec.num_kv_heads, spec.num_layers)


def resolve_shape(source: Shape, head_dim: int, preset: str | None = None, hidden: int | None = None,
                  intermediate: int | None = None, heads: int | None = None, kv_heads: int | None = None,
                  layers: int | None = None) -> Shape:
    """Target shape: the source's, or a preset's width (see the module docstring), then explicit values."""
    base = asdict(source)
    if preset is not None:
        if preset not in PRESETS:
            raise WidenError(f"unknown preset {preset!r}; accepted: {sorted(PRESETS)}")
        p = PRESETS[preset]
        kv = kv_heads or p["kv_heads"]
        group = max(1, int(p["heads"] * p["head_dim"] / (head_dim * kv) + 0.5))
        base.update(hidden=p["hidden"], intermediate=p["intermediate"], kv_heads=kv, heads=kv * group)
    given = dict(hidden=hidden, intermediate=intermediate, heads=heads, kv_heads=kv_heads, layers=layers)
    base.update({k: v for k, v in given.items() if v is not None})
    return Shape(**base)


@dataclass(frozen=True, slots=True)
class Plan:
    """Where the source's pieces go: q_slot[h] = new index of source query head h; kv_source[t] =
    the source KV head that new KV head t copies (-1: a new random head); layer_source[i] = the
    source layer of new layer i (None: identity); template[i] = the source layer it sits before."""
    q_slot: tuple[int, ...]
    kv_source: tuple[int, ...]
    layer_source: tuple[int | None, ...]
    template: tuple[int, ...]


def plan(src: Shape, dst: Shape) -> Plan:
    for name in ("hidden", "intermediate", "heads", "kv_heads", "layers"):
        if getattr(dst, name) < getattr(src, name):
            raise WidenError(f"--{name.replace('_', '-')} {getattr(dst, name)} is below the source's "
                             f"{getattr(src, name)}: widening only adds")
    if dst.heads % dst.kv_heads:
        raise WidenError(f"--heads {dst.heads} is not a multiple of --kv-heads {dst.kv_heads}")
    g, g2 = src.heads // src.kv_heads, dst.heads // dst.kv_heads
    c = -(-g // g2)
    if src.kv_heads * c > dst.kv_heads:
        raise WidenError(f"--heads {dst.heads} --kv-heads {dst.kv_heads} (groups of {g2}) cannot keep the "
                         f"source's groups of {g} query heads: need --kv-heads >= {src.kv_heads * c} or "
                         f"groups of >= {g}")
    kv_source = [j for j in range(src.kv_heads) for _ in range(c)] + [-1] * (dst.kv_heads - src.kv_heads * c)
    q_slot = [(h // g) * c * g2 + h % g for h in range(src.heads)]
    extra = dst.layers - src.layers
    layer_source: list[int | None] = []
    template: list[int] = []
    for i in range(src.layers):
        n = extra // src.layers + (i < extra % src.layers)
        layer_source += [None] * n + [i]
        template += [i] * (n + 1)
    return Plan(tuple(q_slot), tuple(kv_source), tuple(layer_source), tuple(template))


@dataclass(slots=True)
class _Ctx:
    src: Shape
    dst: Shape
    head_dim: int
    plan: Plan
    norm_scale: float  # sqrt(d/d')
    qk_scale: float  # sqrt(d/d') with per-head q/k norms, else 1
    gen: torch.Generator


def _rand(shape: tuple[int, ...], like: torch.Tensor, ctx: _Ctx) -> torch.Tensor:
    std = float(like.std()) if like.numel() > 1 else 0.02
    return torch.randn(shape, generator=ctx.gen, dtype=torch.float64) * std


def _norm(w: torch.Tensor | None, ctx: _Ctx) -> torch.Tensor:
    out = torch.full((ctx.dst.hidden,), ctx.norm_scale, dtype=torch.float64)
    if w is not None:
        out[: ctx.src.hidden] = w * ctx.norm_scale
    return out


def _heads_in(w: torch.Tensor, n_new: int, slots: list[tuple[int, int]], scale: float, ctx: _Ctx) -> torch.Tensor:
    """A q/k/v weight [n·D, d] or bias [n·D] -> [n_new·D, d'] / [n_new·D]: random, with source head
    `s` copied (times `scale`) into new head `t` for each (t, s) in `slots`."""
    D, d = ctx.head_dim, ctx.src.hidden
    bias = w.dim() == 1
    src = w.view(-1, D) if bias else w.view(-1, D, d)
    out = _rand((n_new, D) if bias else (n_new, D, ctx.dst.hidden), w, ctx)
    for t, s in slots:
        if bias:
            out[t] = src[s] * scale
        else:
            out[t, :, :d] = src[s] * scale
    return out.reshape(n_new * D) if bias else out.reshape(n_new * D, ctx.dst.hidden)


def _layer(src: dict[str, torch.Tensor], identity: bool, ctx: _Ctx) -> dict[str, torch.Tensor]:
    """One widened layer from source layer tensors keyed by HF suffix (`self_attn.q_proj.weight`, ...)."""
    s, t, p, D = ctx.src, ctx.dst, ctx.plan, ctx.head_dim
    q_pairs = [] if identity else list(zip(p.q_slot, range(s.heads)))
    kv_pairs = [] if identity else [(i, j) for i, j in enumerate(p.kv_source) if j >= 0]
    out: dict[str, torch.Tensor] = {}
    for name, w in src.items():
        part = name.rsplit(".", 1)[0].split(".")[-1]
        if part in _NORMS:
            out[name] = _norm(None if identity else w, ctx)
        elif part in ("q_norm", "k_norm"):
            out[name] = torch.ones_like(w) if identity else w.clone()
        elif part == "q_proj":
            out[name] = _heads_in(w, t.heads, q_pairs, ctx.qk_scale, ctx)
        elif part in ("k_proj", "v_proj"):
            out[name] = _heads_in(w, t.kv_heads, kv_pairs, ctx.qk_scale if part == "k_proj" else 1.0, ctx)
        elif part == "o_proj":
            o = torch.zeros(t.hidden, t.heads, D, dtype=torch.float64)
            for slot, h in q_pairs:
                o[: s.hidden, slot] = w.view(s.hidden, s.heads, D)[:, h]
            out[name] = o.reshape(t.hidden, t.heads * D)
        elif part in ("gate_proj", "up_proj"):
            g = _rand((t.intermediate, t.hidden), w, ctx)
            if not identity:
                g[: s.intermediate, : s.hidden] = w
            out[name] = g
        elif part == "down_proj":
            dn = torch.zeros(t.hidden, t.intermediate, dtype=torch.float64)
            if not identity:
                dn[: s.hidden, : s.intermediate] = w
            out[name] = dn
        else:
            raise WidenError(f"cannot widen the layer tensor {name!r} (known: {_ATTN + _MLP + _NORMS})")
    return out


def _pad_cols(w: torch.Tensor, ctx: _Ctx) -> torch.Tensor:
    return torch.cat([w, w.new_zeros(w.shape[0], ctx.dst.hidden - ctx.src.hidden)], dim=1)


class _Source:
    """The source's tensors, read one at a time as float64, grouped by layer."""

    def __init__(self, path: Path):
        self.where: dict[str, Path] = {}
        for f in weight_files(path):
            with safe_open(str(f), framework="pt", device="cpu") as sf:
                for name in sf.keys():
                    if not name.endswith("inv_freq"):
                        self.where[name] = f
        self.dtype = self.get(next(iter(self.where))).dtype if self.where else torch.float32

    def get(self, name: str) -> torch.Tensor:
        with safe_open(str(self.where[name]), framework="pt", device="cpu") as sf:
            return sf.get_tensor(name)

    def layer(self, i: int) -> dict[str, torch.Tensor]:
        prefix = f"model.layers.{i}."
        return {n[len(prefix):]: self.get(n).double() for n in self.where if n.startswith(prefix)}


def _units(source: _Source, ctx: _Ctx) -> Iterator[dict[str, torch.Tensor]]:
    """The widened tensors (HF names, float64), one group at a time: globals, then each new layer."""
    glob = {}
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        if name in source.where:
            glob[name] = _pad_cols(source.get(name).double(), ctx)
    glob["model.norm.weight"] = _norm(source.get("model.norm.weight").double(), ctx)
    yield glob
    for i, (src_i, tmpl) in enumerate(zip(ctx.plan.layer_source, ctx.plan.template)):
        layer = _layer(source.layer(tmpl), src_i is None, ctx)
        yield {f"model.layers.{i}.{k}": v for k, v in layer.items()}


def _check_source(path: Path, config: dict, spec: ModelSpec, source: _Source) -> None:
    if spec.weight_layout != "hf":
        raise WidenError(f"widen supports HF Llama/Qwen weight names (model.layers.*); model_type "
                         f"{spec.model_type!r} uses the {spec.weight_layout!r} layout")
    if config.get("use_sliding_window"):
        raise WidenError("widen does not support sliding-window attention (use_sliding_window=true)")
    known = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for n in source.where:
        parts = n.split(".")
        if n not in known and not (n.startswith("model.layers.") and len(parts) >= 5
                                   and parts[-2] in _ATTN + _MLP + _NORMS):
            raise WidenError(f"{str(path)!r}: cannot widen the tensor {n!r}")
    for n in ("model.embed_tokens.weight", "model.norm.weight"):
        if n not in source.where:
            raise WidenError(f"{str(path)!r}: the checkpoint has no {n!r}")


def _new_config(config: dict, spec: ModelSpec, src: Shape, dst: Shape, pl: Plan, dtype: torch.dtype,
                source_name: str, seed: int) -> dict:
    cfg = dict(config)
    cfg.update(hidden_size=dst.hidden, intermediate_size=dst.intermediate, num_attention_heads=dst.heads,
               num_key_value_heads=dst.kv_heads, num_hidden_layers=dst.layers, head_dim=spec.head_dim,
               rms_norm_eps=spec.rms_eps * src.hidden / dst.hidden)
    if "max_window_layers" in cfg:
        cfg["max_window_layers"] = dst.layers
    if isinstance(cfg.get("layer_types"), list):
        cfg["layer_types"] = [config["layer_types"][i] for i in pl.template]
    name = str(dtype).removeprefix("torch.")
    cfg["torch_dtype"] = name
    if "dtype" in cfg:
        cfg["dtype"] = name
    cfg["widened_from"] = {  # provenance; spiffy matches its default graphs on the source fingerprint
        "source": source_name, "fingerprint": fingerprint(spec), "seed": seed, "shape": asdict(src),
        "rms_norm_eps": spec.rms_eps, "q_heads": list(pl.q_slot), "kv_heads": list(pl.kv_source),
        "layers": list(pl.layer_source)}
    return cfg


def param_count(spec: ModelSpec, dst: Shape) -> int:
    D, d, V = spec.head_dim, dst.hidden, spec.vocab_size
    attn = d * (dst.heads + 2 * dst.kv_heads) * D + dst.heads * D * d
    if spec.qkv_bias:
        attn += (dst.heads + 2 * dst.kv_heads) * D
    layer = attn + 3 * d * dst.intermediate + 2 * d + (2 * D if spec.qk_norm else 0)
    return dst.layers * layer + V * d * (1 if spec.tie_word_embeddings else 2) + d


def source_spec(source: str | Path) -> tuple[Path, dict, ModelSpec]:
    """(folder, config, spec) of a source checkpoint folder or "tiny"."""
    from specfold.models.tokenizer import Tokenizer
    if str(source) == "tiny":
        from specfold.models.loader import tiny_path
        path = tiny_path()
    else:
        path = Path(source)
    config = read_config(path)
    tok = Tokenizer.load(path)
    return path, config, resolve_spec(config, None, tok.vocab if tok else None)


def widen_checkpoint(source: str | Path, out: str | Path, shape: Shape, seed: int = 0,
                     dtype: str | None = None, shard_bytes: int = SHARD_BYTES, progress: bool = True) -> Path:
    """Write the widened checkpoint of `source` (a folder or "tiny") to the new folder `out`."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise WidenError(f"output folder {str(out)!r} exists and is not empty; choose a new --out")
    path, config, spec = source_spec(source)
    src_shape = Shape.of(spec)
    pl = plan(src_shape, shape)
    reader = _Source(path)
    _check_source(path, config, spec, reader)
    if dtype is not None and dtype not in DTYPES:
        raise WidenError(f"dtype {dtype!r}; accepted: {sorted(DTYPES)} (default: the source's)")
    out_dtype = DTYPES[dtype] if dtype else reader.dtype
    scale = (src_shape.hidden / shape.hidden) ** 0.5
    ctx = _Ctx(src_shape, shape, spec.head_dim, pl, scale, scale if spec.qk_norm else 1.0,
               torch.Generator().manual_seed(seed))
    n_params = param_count(spec, shape)
    if progress:
        print(f"widen {path}: {asdict(src_shape)} -> {asdict(shape)}, head_dim {spec.head_dim}, "
              f"{n_params / 1e6:.1f}M parameters, {n_params * out_dtype.itemsize / 2**30:.2f} GiB "
              f"{str(out_dtype).removeprefix('torch.')}", file=sys.stderr)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _write_weights(tmp, _units(reader, ctx), out_dtype, shard_bytes, 1 + shape.layers, progress)
    for f in path.iterdir():  # tokenizer, generation config, held-out set ...
        if f.is_file() and f.name != "config.json" and not f.name.startswith("model.safetensors") \
                and f.suffix != ".safetensors":
            shutil.copy2(f, tmp / f.name)
    new_cfg = _new_config(config, spec, src_shape, shape, pl, out_dtype, str(source), seed)
    (tmp / "config.json").write_text(json.dumps(new_cfg, indent=2) + "\n")
    for f in tmp.iterdir():
        f.chmod(0o644)
    if out.exists():
        out.rmdir()
    tmp.rename(out)
    return out


def _write_weights(folder: Path, units: Iterator[dict[str, torch.Tensor]], dtype: torch.dtype,
                   shard_bytes: int, total: int, progress: bool) -> None:
    """Save units into shards of about `shard_bytes` (one `model.safetensors` when it all fits)."""
    from tqdm import tqdm
    shards: list[list[str]] = []
    pending: dict[str, torch.Tensor] = {}
    size = 0

    def flush():
        nonlocal pending, size
        if pending:
            save_file(pending, str(folder / f"part-{len(shards)}.safetensors"), metadata={"format": "pt"})
            shards.append(list(pending))
            pending, size = {}, 0

    for unit in tqdm(units, total=total, desc="widen", unit="layer", disable=not progress, file=sys.stderr):
        for name, t in unit.items():
            pending[name] = t.to(dtype).contiguous()
            size += t.numel() * dtype.itemsize
        if size >= shard_bytes:
            flush()
    flush()
    if len(shards) == 1:
        (folder / "part-0.safetensors").rename(folder / "model.safetensors")
        return
    weight_map = {}
    for k, names in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        (folder / f"part-{k}.safetensors").rename(folder / fname)
        weight_map.update({n: fname for n in names})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
