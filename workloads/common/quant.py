"""Numeric formats per tensor class (`workload.model.quant` presets, `workload.model.formats`).

Model costs are measured on modules built in the model's dtype (`dtype_bytes`, bf16); each
tensor class then takes its own format's bytes: weights read and held, KV cache written and
read, the dispatch payload. The matmul of a layer runs in the format its weight and input
activation meet in (`matmul_format`), which picks the die's cube peak for that format
(fabric `die.cube_TFLOPs_by_format`). The attention core (scores and values over the KV cache)
stays in bf16 in every preset: W8A8 and FP8 serving stacks quantise the linear layers only.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from stratacl.errors import ConfigError
from stratacl.vocab import NumericFormat as F
from workloads.common.model_schema import QuantPreset, TensorClass

# Bytes per element, including the block scales a format carries:
# - int8 / fp8: per-channel (W8A8) or 128×128-block fp32 scales (DeepSeek-V3 FP8, tech report
#   §3.3): < 0.1 % of the tensor, ignored;
# - int4: group-wise bf16 scale per 128 elements (GPTQ/AWQ-style W4): 0.5 + 2/128;
# - fp4: MXFP4, one e8m0 scale byte per 32 elements (OCP Microscaling spec v1.0): 0.5 + 1/32.
FORMAT_BYTES = MappingProxyType({
    F.fp32: 4.0, F.bf16: 2.0, F.fp16: 2.0, F.fp8: 1.0, F.int8: 1.0,
    F.int4: 0.5 + 2 / 128, F.fp4: 0.5 + 1 / 32,
})

C = TensorClass
CLASSES = tuple(TensorClass)

PRESETS: MappingProxyType[QuantPreset, dict[TensorClass, F]] = MappingProxyType({
    # everything in bf16, the dispatch payload too (no dispatch quantisation)
    QuantPreset.bf16: dict.fromkeys(CLASSES, F.bf16),
    # CloudMatrix-Infer on Ascend 910C (arXiv 2506.12708, "INT8 quantization"): INT8 weights and
    # activations for the linear layers; KV cache, embedding/LM head and combine stay bf16;
    # the dispatch carries INT8 + scales (REFERENCE §5)
    QuantPreset.w8a8: {C.expert_weights: F.int8, C.dense_weights: F.int8, C.attention_weights: F.int8,
                       C.embedding: F.bf16, C.kv_cache: F.bf16, C.activations: F.int8, C.dispatch: F.int8,
                       C.combine: F.bf16},
    # DeepSeek-V3 FP8 (tech report §3.3) as GPU stacks serve it: FP8 weights and activations,
    # FP8 dispatch (DeepEP), bf16 combine, bf16 KV cache
    QuantPreset.fp8: {C.expert_weights: F.fp8, C.dense_weights: F.fp8, C.attention_weights: F.fp8,
                      C.embedding: F.bf16, C.kv_cache: F.bf16, C.activations: F.fp8, C.dispatch: F.fp8,
                      C.combine: F.bf16},
    # W4A8: int4 routed/shared experts (the bulk of the bytes), int8 elsewhere
    QuantPreset.w4a8: {C.expert_weights: F.int4, C.dense_weights: F.int8, C.attention_weights: F.int8,
                       C.embedding: F.bf16, C.kv_cache: F.bf16, C.activations: F.int8, C.dispatch: F.int8,
                       C.combine: F.bf16},
})

QUANT_FIX = f"use workload.model.quant in {['null', *PRESETS]} and formats keys {list(CLASSES)} " \
            f"with values in {list(FORMAT_BYTES)}"

# The weight class each layer type (embedding, attention[.<kind>], dense_mlp, moe, lm_head) and
# each parameter role (workloads/modelcost/sizes.py ROLES) is stored in; absent (norms, router):
# the model's dtype.
_WEIGHT_CLASS = MappingProxyType({
    "embedding": C.embedding, "lm_head": C.embedding, "attention": C.attention_weights,
    "dense_mlp": C.dense_weights, "moe": C.expert_weights, "moe_experts": C.expert_weights,
    "shared_experts": C.expert_weights,
})


def weight_class(kind: str) -> TensorClass | None:
    """The tensor class a layer type's or a parameter role's weights are in (None: model dtype)."""
    return _WEIGHT_CLASS.get(kind.split(".", 1)[0])


def matmul_format(weight: str, act: str) -> str:
    """Format a matmul runs in: the narrower operand is widened to the other's format (weight-only
    quantisation dequantises to the activation format; W4A8 runs as int8)."""
    if weight == act or FORMAT_BYTES[weight] < FORMAT_BYTES[act]:
        return act
    return weight


@dataclass(frozen=True)
class Formats:
    """Format of every tensor class; `native` = the model's dtype (the classes' bytes equal
    `dtype_bytes`; the dispatch keeps its own int8 + scales payload)."""

    expert_weights: F = F.bf16
    dense_weights: F = F.bf16
    attention_weights: F = F.bf16
    embedding: F = F.bf16
    kv_cache: F = F.bf16
    activations: F = F.bf16
    dispatch: F = F.int8
    combine: F = F.bf16
    native: bool = False

    def bytes(self, cls: str, dtype_bytes: float) -> float:
        """Bytes per element of tensor class `cls` (native: the model's dtype_bytes)."""
        if self.native and cls != C.dispatch:
            return float(dtype_bytes)
        return FORMAT_BYTES[getattr(self, cls)]

    def ratio(self, cls: str, dtype_bytes: float) -> float:
        """Bytes of `cls` over the measured dtype's bytes (scales measured bytes)."""
        return self.bytes(cls, dtype_bytes) / float(dtype_bytes)

    def matmul(self, weight_cls: str) -> str:
        """Format the matmuls of a weight class run in."""
        if self.native:
            return "bf16"
        return matmul_format(getattr(self, weight_cls), self.activations)

    def key(self) -> str:
        return "native" if self.native else ",".join(f"{c}={getattr(self, c)}" for c in CLASSES)


def resolve(quant: str | None, overrides: dict[str, str] | None = None, *,
            field: str = "workload.model.quant") -> Formats:
    """Formats of a preset name (None or "" = native) with per-class overrides; ConfigError on bad
    input (schema-typed configs arrive as enums; direct callers may pass strings)."""
    try:
        preset = QuantPreset(quant) if quant else None
    except ValueError:
        raise ConfigError(field, f"unknown quant preset '{quant}'", QUANT_FIX) from None
    try:
        classes = {TensorClass(c): F(f) for c, f in (overrides or {}).items()}
    except ValueError:
        raise ConfigError(field.replace("quant", "formats"), f"bad formats {dict(overrides or {})}",
                          QUANT_FIX) from None
    if preset is None and not classes:
        return Formats(native=True)
    base = dict(PRESETS[preset]) if preset else dict(PRESETS[QuantPreset.bf16], dispatch=F.int8)
    base.update(classes)
    return Formats(**base)
