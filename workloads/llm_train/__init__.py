"""LLM training workload: TorchTitan-style FSDP × TP × EP training of a MoE model.

One trace per sampled iteration (the routing skew changes over training); each is replayed once
per library. See layout.py for the mesh, schedule.py for the iteration, model.py for costs.
"""

from __future__ import annotations

from stratacl.directions import MetricInfo, metric
from stratacl.workload_spec import WorkloadSpec

from .schema import LlmTrainConfig

# the step breakdown (report.step_breakdown) is context: where the time goes, not a verdict
_PARTS = {"gemm": "GEMM", "attention_fwd": "attention fwd", "attention_bwd": "attention bwd",
          "elementwise": "element-wise", "loss": "loss (LM head element-wise)", "optimizer": "optimizer (and gradient clipping)",
          "fsdp_copy": "FSDP2 copy-in/out",
          "recompute": "of which recompute"}
METRICS: dict[str, MetricInfo] = {
    "tokens_per_s_per_die": metric("higher", "tok/s", "training throughput/die"),
    "mfu": metric(None, "fraction", "MFU (fwd+bwd matmul FLOPs at dense peak)"),
    **{f"step_{k}_s": metric(None, "s", f"step: {v}") for k, v in _PARTS.items()},
}

SPEC = WorkloadSpec(name="llm_train", schema=LlmTrainConfig, entry="workloads.llm_train.workload",
                    metrics=METRICS, headlines=("iteration_time_s", "iteration_time_s_last"))

__all__ = ["SPEC", "LlmTrainConfig"]
