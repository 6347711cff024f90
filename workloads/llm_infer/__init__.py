"""LLM inference workload: disaggregated MoE serving with TTFT/TPOT, compared across libraries.

`run(ctx)` builds the model costs from the transformers definition, checks the layout and memory,
generates the requests once, and for each library simulates serving (request level, serving.py)
on top of iteration times simulated on the fabric (iteration.py).
"""

from __future__ import annotations

from stratacl.workload_spec import WorkloadSpec

from .metrics import CAVEATS, HEADLINES, METRICS
from .schema import LlmInferConfig

SPEC = WorkloadSpec(name="llm_infer", schema=LlmInferConfig, entry="workloads.llm_infer.workload",
                    metrics=METRICS, headlines=HEADLINES, caveats=CAVEATS)

__all__ = ["SPEC", "LlmInferConfig"]
