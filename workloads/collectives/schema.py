"""Schema of `workload=collectives` (conf/workload/collectives.yaml extends it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from stratacl.errors import ConfigError
from stratacl.workload_config import WorkloadConfig, knob


@dataclass
class CollectivesConfig(WorkloadConfig):
    """Operator micro-benchmark: bus bandwidth vs message size, nccl-tests conventions."""

    name: str = "collectives"
    ranks: int = knob(32, ge=1)
    group_size: int = knob(0, ge=0)  # 0 = one communicator of all ranks; else ranks/group_size groups run at once
    collectives: list[str] = field(
        default_factory=lambda: ["allreduce", "allgather", "reducescatter", "alltoall"]
    )
    min_bytes: int = knob(64 * 1024, ge=1)
    max_bytes: int = knob(1024**3, ge=1)
    step_factor: int = knob(2, ge=2)  # sizes min, min·f, min·f², … up to max
    warmup: int = knob(1, ge=0)  # runs per point before measuring (first-use registration lands here)
    iters: int = knob(1, ge=1)  # measured runs per point (mean reported)
    # one of `collectives`: print its operator time per size and library split into wire, sync,
    # launch, copy, registration, host and the rest (breakdown.parquet); "" = none
    breakdown: str = ""

    def check(self, prefix: str = "workload") -> None:
        if self.breakdown and self.breakdown not in self.collectives:
            raise ConfigError(f"{prefix}.breakdown", f"'{self.breakdown}' is not one of the run's collectives "
                              f"{list(self.collectives)}", f"use one of them, or add it to {prefix}.collectives")

