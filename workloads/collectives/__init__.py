"""Operator micro-benchmark: bus bandwidth vs message size per library (nccl-tests conventions)."""

from __future__ import annotations

from stratacl.workload_spec import WorkloadSpec

from .metrics import CONTEXT, HEADLINES, METRICS
from .schema import CollectivesConfig

SPEC = WorkloadSpec(name="collectives", schema=CollectivesConfig,
                    entry="workloads.collectives.workload", metrics=METRICS, headlines=HEADLINES,
                    context=CONTEXT)

__all__ = ["SPEC", "CollectivesConfig"]
