"""Schema of `workload=llm_train` (conf/workload/llm_train.yaml extends it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore

from stratacl.config import WorkloadConfig


@dataclass
class SkewScheduleConfig:
    """Expert-load skew over training: Zipf exponent end + (start − end)·exp(−iteration / decay)."""

    start: float = 0.6
    end: float = 0.05
    decay_iters: float = 500.0


@dataclass
class LlmTrainConfig(WorkloadConfig):
    """TorchTitan-style FSDP × TP × EP training of a transformers model (REFERENCE §6)."""

    name: str = "llm_train"
    model: str = "deepseek_v32"  # conf/model/<model>.yaml
    num_layers: int = 0  # 0 = the model's own depth; else overrides num_hidden_layers
    model_overrides: dict[str, Any] = field(default_factory=dict)  # extra transformers config fields
    dies: int = 512
    fsdp: int = 128
    tp: int = 4
    ep: int = 64  # formed over (fsdp × tp): ep/tp FSDP ranks × the whole TP group
    global_batch: int = 512  # sequences per iteration
    seq_len: int = 4096
    dtype_bytes: int = 2  # compute / all-gather dtype (bf16)
    master_dtype_bytes: int = 4  # sharded fp32 parameters
    grad_dtype_bytes: int = 4  # reduce-scatter / sharded gradient dtype
    optimizer_state_bytes: int = 8  # Adam exp_avg + exp_avg_sq in fp32
    optimizer_flops_per_param: float = 12.0
    recompute: bool = True  # full activation checkpointing per transformer block
    sequence_parallel: bool = True
    flash_attention: bool = True  # no S×S score matrices kept for backward
    prefetch: int = 1  # FSDP units all-gathered ahead of the one computing
    iterations: list[int] = field(default_factory=lambda: [0, 100, 500, 1000, 2000])
    skew: SkewScheduleConfig = field(default_factory=SkewScheduleConfig)
    alloc_overhead_GB: float = 0.0  # allocator slack / runtime context per die


ConfigStore.instance().store(group="workload", name="llm_train_schema", node=LlmTrainConfig)
