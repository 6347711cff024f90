"""Schema of `workload=collectives` (conf/workload/collectives.yaml extends it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore

from stratacl.config import WorkloadConfig


@dataclass
class CollectivesConfig(WorkloadConfig):
    """Operator micro-benchmark: bus bandwidth vs message size, nccl-tests conventions."""

    name: str = "collectives"
    ranks: int = 32
    group_size: int = 0  # 0 = one communicator of all ranks; else ranks/group_size groups run at once
    collectives: list[str] = field(
        default_factory=lambda: ["allreduce", "allgather", "reducescatter", "alltoall"]
    )
    min_bytes: int = 64 * 1024
    max_bytes: int = 1024**3
    step_factor: int = 2  # sizes min, min·f, min·f², … up to max
    warmup: int = 1  # runs per point before measuring (first-use registration lands here)
    iters: int = 1  # measured runs per point (mean reported)


ConfigStore.instance().store(group="workload", name="collectives_schema", node=CollectivesConfig)
