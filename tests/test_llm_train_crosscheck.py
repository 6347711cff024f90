"""llm_train's schedule issues the same collectives as real PyTorch (FSDP2 / DTensor TP) on the
recorder's MLP stack: same multiset of (collective, bytes per rank, group size) per iteration.

TP × FSDP combined is not checked: the recorder fails on it (FakeTensor `aten.nonzero` in FSDP2
over 2-D DTensor parameters), so each parallel dimension is compared on its own.
"""

from __future__ import annotations

from collections import Counter

import pytest

from workloads.llm_train.crosscheck import mlp_stack_trace, trace_collectives
from workloads.modelcost.recorder import record_collectives


@pytest.mark.parametrize("tp, fsdp", [(1, 2), (2, 1), pytest.param(1, 4, marks=pytest.mark.slow)])
def test_schedule_matches_pytorch(tp: int, fsdp: int) -> None:
    layers, hidden, tokens = 3, 64, 8
    recs = record_collectives(tp * fsdp, tp=tp, fsdp=fsdp, layers=layers, hidden=hidden, tokens=tokens)
    real = Counter((r.op, r.bytes_per_rank, r.group_size) for r in recs)
    ours = trace_collectives(mlp_stack_trace(layers, hidden, tokens, tp, fsdp))
    assert real and ours == real
