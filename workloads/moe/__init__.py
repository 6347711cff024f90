"""MoE dispatch/combine benchmark (REFERENCE §5): bus bandwidth in the DeepEP convention."""

from __future__ import annotations

from stratacl.workload_spec import WorkloadSpec

from .schema import MoeConfig

SPEC = WorkloadSpec(name="moe", schema=MoeConfig, entry="workloads.moe.workload",
                    headlines=("dispatch_ht_time_us", "combine_ht_time_us", "dispatch_ll_time_us",
                               "combine_ll_time_us"))

__all__ = ["SPEC", "MoeConfig"]
