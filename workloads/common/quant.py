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

# Bytes per element, including the block scales a format carries:
# - int8 / fp8: per-channel (W8A8) or 128×128-block fp32 scales (DeepSeek-V3 FP8, tech report
#   §3.3): < 0.1 % of the tensor, ignored;
# - int4: group-wise bf16 scale per 128 elements (GPTQ/AWQ-style W4): 0.5 + 2/128;
# - fp4: MXFP4, one e8m0 scale byte per 32 elements (OCP Microscaling spec v1.0): 0.5 + 1/32.
FORMAT_BYTES = MappingProxyType({
    "fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0,
    "int4": 0.5 + 2 / 128, "fp4": 0.5 + 1 / 32,
})

# expert_weights: routed and shared experts; dense_weights: dense MLP layers; attention_weights:
# the attention projections; embedding: token embedding and LM head (kept in bf16 by W8A8/FP8
# stacks); kv_cache; activations: the input of quantised matmuls (and so the dispatch payload's
# format unless `dispatch` says otherwise); combine: the expert outputs sent back.
CLASSES = ("expert_weights", "dense_weights", "attention_weights", "embedding", "kv_cache",
           "activations", "dispatch", "combine")

PRESETS: MappingProxyType[str, dict[str, str]] = MappingProxyType({
    # everything in bf16, the dispatch payload too (no dispatch quantisation)
    "bf16": dict.fromkeys(CLASSES, "bf16"),
    # CloudMatrix-Infer on Ascend 910C (arXiv 2506.12708, "INT8 quantization"): INT8 weights and
    # activations for the linear layers; KV cache, embedding/LM head and combine stay bf16;
    # the dispatch carries INT8 + scales (REFERENCE §5)
    "w8a8": {"expert_weights": "int8", "dense_weights": "int8", "attention_weights": "int8",
             "embedding": "bf16", "kv_cache": "bf16", "activations": "int8", "dispatch": "int8",
             "combine": "bf16"},
    # DeepSeek-V3 FP8 (tech report §3.3) as GPU stacks serve it: FP8 weights and activations,
    # FP8 dispatch (DeepEP), bf16 combine, bf16 KV cache
    "fp8": {"expert_weights": "fp8", "dense_weights": "fp8", "attention_weights": "fp8",
            "embedding": "bf16", "kv_cache": "bf16", "activations": "fp8", "dispatch": "fp8",
            "combine": "bf16"},
    # W4A8: int4 routed/shared experts (the bulk of the bytes), int8 elsewhere
    "w4a8": {"expert_weights": "int4", "dense_weights": "int8", "attention_weights": "int8",
             "embedding": "bf16", "kv_cache": "bf16", "activations": "int8", "dispatch": "int8",
             "combine": "bf16"},
})

QUANT_FIX = f"use workload.model.quant in {['', *PRESETS]} and formats keys {list(CLASSES)} " \
            f"with values in {list(FORMAT_BYTES)}"


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

    expert_weights: str = "bf16"
    dense_weights: str = "bf16"
    attention_weights: str = "bf16"
    embedding: str = "bf16"
    kv_cache: str = "bf16"
    activations: str = "bf16"
    dispatch: str = "int8"
    combine: str = "bf16"
    native: bool = False

    def bytes(self, cls: str, dtype_bytes: float) -> float:
        """Bytes per element of tensor class `cls` (native: the model's dtype_bytes)."""
        if self.native and cls not in ("dispatch",):
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


def resolve(quant: str, overrides: dict[str, str] | None = None, *, field: str = "workload.model.quant") -> Formats:
    """Formats of a preset name ("" = native) with per-class overrides; ConfigError on bad input."""
    overrides = dict(overrides or {})
    if quant and quant not in PRESETS:
        raise ConfigError(field, f"unknown quant preset '{quant}'", QUANT_FIX)
    for cls, fmt in overrides.items():
        if cls not in CLASSES or fmt not in FORMAT_BYTES:
            raise ConfigError(field.replace("quant", "formats"), f"bad format {cls}={fmt}", QUANT_FIX)
    if not quant and not overrides:
        return Formats(native=True)
    base = dict(PRESETS[quant]) if quant else dict(PRESETS["bf16"], dispatch="int8")
    base.update(overrides)
    return Formats(**base)
