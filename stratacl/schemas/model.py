"""The model reference workloads share (llm_infer's `workload.model`; llm_train maps its flat
`model` / `num_layers` / `model_overrides` / `dtype_bytes` keys onto one)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from stratacl.schemas.base import knob


class AttentionKernels(StrEnum):
    """How attention is priced (workloads/modelcost/attention.py)."""

    production = "production"  # sparse / windowed / absorbed-MLA kernels as serving stacks run them
    reference = "reference"  # transformers' reference modules: dense masked attention


@dataclass
class ModelRef:
    """A transformers model: a conf/model/<name>.yaml preset, or a type/config.json + overrides."""

    preset: str = "deepseek_v4_flash"  # conf/model/<preset>.yaml ("" = use model_type/config_json)
    model_type: str = ""
    config_json: str = ""
    overrides: dict[str, Any] = field(default_factory=dict)  # transformers config fields (it checks them)
    dtype_bytes: int = knob(2, ge=1)  # weights / KV / activations (bf16)
    attention: AttentionKernels = AttentionKernels.production
    # numeric formats per tensor class (workloads/common/quant.py): a preset (bf16, w8a8, fp8,
    # w4a8; "" = every class in dtype_bytes, dispatch int8 + scales) and per-class overrides
    quant: str = ""
    formats: dict[str, str] = field(default_factory=dict)
