"""Schema of `workload=interference` (conf/workload/interference.yaml extends it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore

from stratacl.schemas.base import knob
from stratacl.schemas.llm_infer import StreamLayout
from stratacl.schemas.llm_train import TrainStepConfig


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


ConfigStore.instance().store(group="workload", name="interference_schema", node=InterferenceConfig)
