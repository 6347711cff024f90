"""Real transformers modules with shape-only weights, and the per-rank shard of them.

`build_meta` makes the full-depth model on the meta device (no memory; sizes and structure).
`build_fake_shard` makes a reduced-depth copy whose parameters are FakeTensors shaped like
one rank's shard: attention heads divided by TP (via the config, since attention code
reshapes with head counts), MLP weights sliced per the model's own `base_model_tp_plan`,
experts sliced by EP over the expert dim (or by TP over the intermediate dim when ep == 1).
"""

from __future__ import annotations

import copy
import fnmatch
from collections import Counter
from dataclasses import dataclass

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from transformers import AutoModelForCausalLM, PretrainedConfig

from .errors import CostInputError

_DTYPES = {2: torch.bfloat16, 4: torch.float32}


def torch_dtype(dtype_bytes: int) -> torch.dtype:
    if dtype_bytes not in _DTYPES:
        raise CostInputError(f"dtype_bytes: {dtype_bytes} not supported; valid options: 2 (bf16), 4 (fp32)")
    return _DTYPES[dtype_bytes]


def build_meta(cfg: PretrainedConfig, dtype: torch.dtype) -> nn.Module:
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    if any(is_moe(layer.mlp) for layer in decoder_layers(model)):
        # Sort-and-grouped-mm experts: static shapes, no data-dependent per-expert loop.
        model.config._experts_implementation = "grouped_mm"
    return model


def base_model(model: nn.Module) -> nn.Module:
    return model.model


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    return base_model(model).layers


def rep_layer(model: nn.Module, idx: int) -> nn.Module:
    """The kept decoder layer whose original index is `idx` (see build_fake_shard)."""
    for layer in decoder_layers(model):
        if getattr(layer, "_mc_idx", None) == idx:
            return layer
    raise KeyError(idx)


def is_moe(mlp: nn.Module) -> bool:
    return hasattr(mlp, "experts")


@dataclass(frozen=True)
class LayerLayout:
    """Per decoder layer: attention variant and FFN kind; which layers represent each."""

    attention: tuple[str, ...]  # "attention" or "attention.<config layer type>"
    ffn: tuple[str, ...]        # "dense_mlp" | "moe"
    reps: dict[str, int]        # layer type -> representative layer index

    @property
    def depth_needed(self) -> int:
        return max(self.reps.values()) + 1

    def count(self, layer_type: str) -> int:
        return sum(1 for t in self.attention + self.ffn if t == layer_type)


def layer_layout(cfg: PretrainedConfig, meta_model: nn.Module) -> LayerLayout:
    layers = decoder_layers(meta_model)
    n = len(layers)
    kinds = getattr(cfg, "layer_types", None)
    if kinds is not None and len(set(kinds[:n])) > 1:
        attention = tuple(f"attention.{k}" for k in kinds[:n])
    else:
        attention = ("attention",) * n
    ffn = tuple("moe" if is_moe(layer.mlp) else "dense_mlp" for layer in layers)
    sub = getattr(cfg, "mlp_layer_types", None) or ffn
    reps: dict[str, int] = {}
    for i, a in enumerate(attention):
        reps.setdefault(a, i)
    for kind in dict.fromkeys(ffn):
        # Represent a kind by its most common sub-kind (e.g. V4 "moe" over "hash_moe").
        common = Counter(sub[i] for i in range(n) if ffn[i] == kind).most_common(1)[0][0]
        reps[kind] = next(i for i in range(n) if ffn[i] == kind and sub[i] == common)
    return LayerLayout(attention, ffn, reps)


def attention_head_sharded(cfg: PretrainedConfig) -> bool:
    """TP splits attention heads if the model's TP plan shards attention, or for MLA
    (heads are independent after the latent up-projection, as SGLang/vLLM shard DeepSeek)."""
    plan = getattr(cfg, "base_model_tp_plan", None) or {}
    return any("self_attn" in k for k in plan) or bool(getattr(cfg, "kv_lora_rank", None))


def shard_config(cfg: PretrainedConfig, tp: int, depth: int) -> PretrainedConfig:
    local = copy.deepcopy(cfg)
    local.num_hidden_layers = depth
    if tp > 1 and attention_head_sharded(cfg):
        heads = cfg.num_attention_heads
        if heads % tp:
            raise CostInputError(f"tp: {tp} does not divide num_attention_heads={heads}")
        local.num_attention_heads = heads // tp
        kv = getattr(cfg, "num_key_value_heads", None)
        if kv is not None and not getattr(cfg, "kv_lora_rank", None):
            if kv % tp == 0:
                local.num_key_value_heads = kv // tp
            elif tp % kv == 0:
                local.num_key_value_heads = 1  # KV heads replicated across the TP group
            else:
                raise CostInputError(f"tp: {tp} and num_key_value_heads={kv} do not divide")
    return local


def _plan_style(plan: dict[str, str], module_path: str) -> str | None:
    for pattern, style in plan.items():
        if fnmatch.fnmatchcase(module_path, pattern):
            return style
    return None


def shard_shape(shape: tuple[int, ...], style: str | None, n: int, name: str) -> tuple[int, ...]:
    """Local shape of a parameter under a TP style ("colwise" splits outputs, "rowwise" inputs)."""
    if style is None or n == 1 or len(shape) == 0:
        return shape
    if "colwise" in style:
        dim = len(shape) - 2 if len(shape) >= 2 else 0
    elif "rowwise" in style and len(shape) >= 2:
        dim = len(shape) - 1
    else:
        return shape
    if shape[dim] % n:
        raise CostInputError(f"tp: {n} does not divide {name} dim {dim} ({shape[dim]})")
    return shape[:dim] + (shape[dim] // n,) + shape[dim + 1 :]


def local_param_shapes(
    cfg: PretrainedConfig, layer_idx: int, mlp: nn.Module, tp: int, ep: int
) -> dict[str, tuple[int, ...]]:
    """Shard shape of every parameter under `mlp` (relative names)."""
    plan = getattr(cfg, "base_model_tp_plan", None) or {}
    shapes: dict[str, tuple[int, ...]] = {}
    for name, p in mlp.named_parameters():
        mod_path, _, leaf = name.rpartition(".")
        full = f"layers.{layer_idx}.mlp.{mod_path}" if mod_path else f"layers.{layer_idx}.mlp"
        shape = tuple(p.shape)
        if mod_path == "experts":
            if ep > 1:
                if shape[0] % ep:
                    raise CostInputError(f"ep: {ep} does not divide the {shape[0]} experts")
                shape = (shape[0] // ep, *shape[1:])
            else:
                shape = shard_shape(shape, _plan_style(plan, f"{full}.{leaf}"), tp, name)
        else:
            shape = shard_shape(shape, _plan_style(plan, full), tp, name)
        shapes[name] = shape
    return shapes


def fakeify(module: nn.Module, mode: FakeTensorMode, shapes: dict[str, tuple[int, ...]] | None = None,
            prefix: str = "") -> None:
    """Swap meta parameters/buffers for FakeTensors (optionally with shard shapes)."""
    shapes = shapes or {}
    for mod_name, sub in module.named_modules():
        for n, p in list(sub._parameters.items()):
            if p is None:
                continue
            key = f"{mod_name}.{n}" if mod_name else n
            shape = shapes.get(key, tuple(p.shape))
            with mode:
                t = torch.empty(shape, dtype=p.dtype, device="cpu")
            sub._parameters[n] = nn.Parameter(t, requires_grad=p.requires_grad)
        for n, b in list(sub._buffers.items()):
            if b is None:
                continue
            with mode:
                sub._buffers[n] = torch.zeros(b.shape, dtype=b.dtype, device="cpu")


def build_fake_shard(
    cfg: PretrainedConfig, layout: LayerLayout, tp: int, ep: int, dtype: torch.dtype, mode: FakeTensorMode
) -> nn.Module:
    """Reduced-depth model (layers 0..max representative) holding one rank's shard."""
    local = shard_config(cfg, tp, layout.depth_needed)
    model = build_meta(local, dtype)
    # Keep only the representative layers (the model loops over `layers` without using the
    # position; each layer keeps its own layer_idx for the cache). `_mc_idx` records it.
    keep = sorted(set(layout.reps.values()))
    base_model(model).layers = nn.ModuleList([decoder_layers(model)[i] for i in keep])
    for i, layer in zip(keep, decoder_layers(model), strict=True):
        layer._mc_idx = i
        mlp_shapes = local_param_shapes(cfg, i, layer.mlp, tp, ep)
        fakeify(layer, mode, {f"mlp.{k}": v for k, v in mlp_shapes.items()})
        if is_moe(layer.mlp) and ep > 1:
            layer.mlp.experts.num_experts //= ep
    # Vocab-parallel embedding and head: each TP rank holds ceil(V / tp) rows.
    vocab_rows = -(-cfg.vocab_size // tp)
    for name, child in base_model(model).named_children():
        if name == "embed_tokens":
            fakeify(child, mode, {"weight": (vocab_rows, child.weight.shape[1])})
        elif name != "layers":
            fakeify(child, mode)
    fakeify(model.lm_head, mode, {"weight": (vocab_rows, model.lm_head.weight.shape[1])})
    return model
