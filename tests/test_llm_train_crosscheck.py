"""llm_train's schedule issues the same collectives as real PyTorch (FSDP2 / DTensor TP) on the
recorder's MLP stack: same multiset of (collective, bytes per rank, group size) per iteration.

Layouts: FSDP alone, TP alone and TP 2 × FSDP 2 combined (FSDP2 over DTensor-TP parameters on a
2-D mesh). Expert-parallel dispatch/combine is checked against PyTorch's all-to-all in
tests/test_modelcost_recorder.py (record_moe_collectives) and against the analytic volumes in
tests/test_llm_train_volumes.py.
"""

from __future__ import annotations

from collections import Counter

import pytest

from workloads.llm_train.crosscheck import mlp_stack_trace, trace_collectives
from workloads.modelcost.recorder import record_collectives


@pytest.mark.parametrize("tp, fsdp", [(1, 2), (2, 1), (2, 2), pytest.param(1, 4, marks=pytest.mark.slow)])
def test_schedule_matches_pytorch(tp: int, fsdp: int) -> None:
    layers, hidden, tokens = 3, 64, 8
    recs = record_collectives(tp * fsdp, tp=tp, fsdp=fsdp, layers=layers, hidden=hidden, tokens=tokens)
    real = Counter((r.op, r.bytes_per_rank, r.group_size) for r in recs)
    ours = trace_collectives(mlp_stack_trace(layers, hidden, tokens, tp, fsdp))
    assert real and ours == real
