"""The model reference every model-measuring workload names as `workload.model` (llm_infer,
llm_train, interference), and the vocabularies of its choices."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from stratacl.vocab import NumericFormat
from stratacl.workload_config import knob


class AttentionKernels(StrEnum):
    """How attention is priced (workloads/modelcost/attention.py)."""

    production = "production"  # sparse / windowed / absorbed-MLA kernels as serving stacks run them
    reference = "reference"  # transformers' reference modules: dense masked attention


class QuantPreset(StrEnum):
    """Numeric-format presets per tensor class (workloads/common/quant.py PRESETS)."""

    bf16 = "bf16"
    w8a8 = "w8a8"  # INT8 weights and activations (CloudMatrix-Infer on Ascend)
    fp8 = "fp8"  # DeepSeek-V3 FP8 as GPU stacks serve it
    w4a8 = "w4a8"  # int4 experts, int8 elsewhere


class TensorClass(StrEnum):
    """Tensor classes that each take a numeric format (workloads/common/quant.py)."""

    expert_weights = "expert_weights"  # routed and shared experts
    dense_weights = "dense_weights"  # dense MLP layers
    attention_weights = "attention_weights"  # the attention projections
    embedding = "embedding"  # token embedding and LM head
    kv_cache = "kv_cache"
    activations = "activations"  # input of quantised matmuls (the dispatch payload's format by default)
    dispatch = "dispatch"
    combine = "combine"  # the expert outputs sent back


@dataclass
class ModelRef:
    """A transformers model: a conf/model/<name>.yaml preset, or a type/config.json + overrides.

    A given `config_json` or `model_type` replaces the preset (the workload's default model);
    naming a preset as well on the command line is refused (stratacl/run/precheck.py)."""

    preset: str = "deepseek_v4_flash"  # conf/model/<preset>.yaml (ignored when model_type/config_json is set)
    model_type: str = ""  # a transformers model type (workloads/modelcost/config.py SUPPORTED_FAMILIES)
    config_json: str = ""  # a Hugging Face config.json path (its model_type names the family)
    overrides: dict[str, Any] = field(default_factory=dict)  # transformers config fields (it checks them)
    dtype_bytes: int = knob(2, ge=1)  # weights / KV / activations (bf16)
    attention: AttentionKernels = AttentionKernels.production
    # numeric formats per tensor class (workloads/common/quant.py): a preset (null = every class in
    # dtype_bytes, dispatch int8 + scales) and per-class overrides
    quant: QuantPreset | None = None
    formats: dict[TensorClass, NumericFormat] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.config_json or self.model_type:  # the user's own model wins over the default preset
            self.preset = ""

    def check(self, field: str = "workload.model") -> None:
        """The referenced config loads and is of a family the cost model measures (before a run
        directory exists); transformers is imported here only, by workloads that use a model."""
        from workloads.common.model import hf_config

        hf_config(self, field=field, preset_field=f"{field}.preset")
