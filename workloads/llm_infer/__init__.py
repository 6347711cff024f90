"""LLM inference workload: disaggregated MoE serving with TTFT/TPOT, compared across libraries.

`run(ctx)` builds the model costs from the transformers definition, checks the layout and memory,
generates the requests once, and for each library simulates serving (request level, serving.py)
on top of iteration times simulated on the fabric (iteration.py).
"""

from __future__ import annotations

from workloads.llm_infer.workload import estimate, run

__all__ = ["estimate", "run"]
