"""Schema of `workload=interference` (conf/workload/interference.yaml extends it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from stratacl.workload_config import knob
from workloads.llm_infer.schema import StreamLayout
from workloads.llm_train.schema import TrainStepConfig


@dataclass
class InterferenceConfig(TrainStepConfig):
    """One training layer's forward + backward on a die, alone and overlapped with the FSDP
    all-gather / reduce-scatter of its neighbour layer (REFERENCE §3 "Overlap"). The model, mesh
    and batch are llm_train's (`TrainStepConfig`)."""

    name: str = "interference"
    num_layers: int = knob(4, ge=1)  # layers of the measured model: enough to reach the first MoE layer
    layer: int = knob(-1, ge=-1)  # decoder layer whose compute runs (-1: the last one)
    fused: list[str] = field(default_factory=lambda: ["attention"])  # layer types run as mixed kernels
    stream_layout: StreamLayout = StreamLayout.none  # per-stream core limits (workloads/common/kernels.py)

