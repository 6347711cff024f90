"""Comm-compute interference on a die under FSDP overlap (REFERENCE §3 "Overlap")."""

from __future__ import annotations

from stratacl.workload_spec import WorkloadSpec

from .metrics import CONTEXT, HEADLINES, METRICS
from .schema import InterferenceConfig

SPEC = WorkloadSpec(name="interference", schema=InterferenceConfig,
                    entry="workloads.interference.workload", metrics=METRICS, headlines=HEADLINES,
                    context=CONTEXT)

__all__ = ["SPEC", "InterferenceConfig"]
