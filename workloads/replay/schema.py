"""Schema of `workload=replay`: replay a saved or imported trace under the selected libraries
(conf/workload/replay.yaml, workloads/replay.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stratacl.workload_config import WorkloadConfig, knob


@dataclass
class ReplayConfig(WorkloadConfig):
    name: str = "replay"
    # a harness trace (.parquet: Trace.save, a run's traces/<name>.parquet) or a Chakra ET set (a
    # directory with one <prefix>.<rank>.et set, or <dir>/<prefix>)
    trace: str = ""
    merge: bool = True  # Chakra: merge equal-looking COMP nodes of several ranks into one SPMD op
    top_ops: int = knob(15, ge=0)  # slowest ops (by baseline time) printed per library

    def check_run(self, run: Any) -> None:  # noqa: ANN401 - RunConfig (validate_run calls it)
        """The trace must load and fit the fabric: checked before the run directory exists."""
        from workloads.replay.workload import check  # the loaders live with the workload

        check(self, run.fabric)

