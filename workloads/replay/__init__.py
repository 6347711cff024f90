"""`workload=replay`: one saved or imported trace, replayed under each selected library."""

from __future__ import annotations

from stratacl.workload_spec import WorkloadSpec

from .schema import ReplayConfig

SPEC = WorkloadSpec(name="replay", schema=ReplayConfig, entry="workloads.replay.workload")

__all__ = ["SPEC", "ReplayConfig"]
