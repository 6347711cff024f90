"""Schema of `workload=interference` (conf/workload/interference.yaml extends it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore

from stratacl.schemas.base import WorkloadConfig, knob


@dataclass
class InterferenceConfig(WorkloadConfig):
    """One training layer's forward + backward on a die, alone and overlapped with the FSDP
    all-gather / reduce-scatter of its neighbour layer (REFERENCE §3 "Overlap")."""

    name: str = "interference"
    model: str = "deepseek_v32"  # conf/model/<model>.yaml
    num_layers: int = knob(4, ge=1)  # layers of the measured model: enough to reach the first MoE layer
    layer: int = knob(-1, ge=-1)  # decoder layer whose compute runs (-1: the last one)
    model_overrides: dict[str, Any] = field(default_factory=dict)
    dies: int = knob(512, ge=1)  # the llm_train mesh: FSDP groups and their tiers come from it
    fsdp: int = knob(128, ge=1)
    tp: int = knob(4, ge=1)
    ep: int = knob(64, ge=1)
    global_batch: int = knob(512, ge=1)
    seq_len: int = knob(4096, ge=1)
    dtype_bytes: int = knob(2, ge=1)  # parameters all-gathered in bf16
    grad_dtype_bytes: int = knob(4, ge=1)  # gradients reduce-scattered in fp32
    fused: list[str] = field(default_factory=lambda: ["attention"])  # layer types run as mixed kernels
    stream_layout: str = "none"  # per-stream core limits (workloads/common/kernels.py LAYOUTS)


ConfigStore.instance().store(group="workload", name="interference_schema", node=InterferenceConfig)
