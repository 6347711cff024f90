"""DLRM training, TorchRec-style: model-parallel embeddings behind an HBM cache,
data-parallel dense part, one trace per library because library memory shrinks the cache.

Modules: `model` (torch DLRM + measured dense costs), `tables` (Criteo-like tables), `planner`
(sharding), `access` (the Zipf exponent from a cited skew figure), `cache` (hit rate and distinct
misses per batch), `memory` (per-die HBM budget), `traffic` (all-to-all
volumes), `builder` (the trace), `analysis` (iteration split), `workload` (run).
"""

from __future__ import annotations

from stratacl.workload_spec import WorkloadSpec

from .metrics import HEADLINES, METRICS
from .schema import DlrmTrainConfig

SPEC = WorkloadSpec(name="dlrm_train", schema=DlrmTrainConfig,
                    entry="workloads.dlrm_train.workload", metrics=METRICS, headlines=HEADLINES)

__all__ = ["SPEC", "DlrmTrainConfig"]
