"""LLM training workload: TorchTitan-style FSDP × TP × EP training of a MoE model.

One trace per sampled iteration (the routing skew changes over training); each is replayed once
per library. See layout.py for the mesh, schedule.py for the iteration, model.py for costs.
"""

from __future__ import annotations

from stratacl.workload_spec import WorkloadSpec

from .schema import LlmTrainConfig

SPEC = WorkloadSpec(name="llm_train", schema=LlmTrainConfig, entry="workloads.llm_train.workload",
                    headlines=("iteration_time_s", "iteration_time_s_last"))

__all__ = ["SPEC", "LlmTrainConfig"]
