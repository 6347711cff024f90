"""Schema of `workload=interference` (conf/workload/interference.yaml extends it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore

from stratacl.config import WorkloadConfig


@dataclass
class InterferenceConfig(WorkloadConfig):
    """One training layer's forward + backward on a die, alone and overlapped with the FSDP
    all-gather / reduce-scatter of its neighbour layer (REFERENCE §3 "Overlap")."""

    name: str = "interference"
    model: str = "deepseek_v32"  # conf/model/<model>.yaml
    num_layers: int = 4  # layers of the measured model: enough to reach the first MoE layer
    layer: int = -1  # decoder layer whose compute runs (-1: the last one)
    model_overrides: dict[str, Any] = field(default_factory=dict)
    dies: int = 512  # the llm_train mesh: FSDP groups and their tiers come from it
    fsdp: int = 128
    tp: int = 4
    ep: int = 64
    global_batch: int = 512
    seq_len: int = 4096
    dtype_bytes: int = 2  # parameters all-gathered in bf16
    grad_dtype_bytes: int = 4  # gradients reduce-scattered in fp32
    fused: list[str] = field(default_factory=lambda: ["attention"])  # layer types run as mixed kernels
    stream_layout: str = "none"  # per-stream core limits (workloads/common/kernels.py LAYOUTS)


ConfigStore.instance().store(group="workload", name="interference_schema", node=InterferenceConfig)
