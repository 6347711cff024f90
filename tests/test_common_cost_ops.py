"""The shared cost triple and the one way a cost enters a trace (`kernels.add_cost`): arithmetic,
interpolation, and that an unfused triple becomes a cube kernel carrying HBM, then a vector kernel."""

from __future__ import annotations

import numpy as np
import pytest

from stratacl.trace import Trace, stream_predecessors
from workloads.common.cost import Cost
from workloads.common.kernels import DLRM_FUSED, add_cost
from workloads.llm_train.checkpointing import AcMode
from workloads.llm_train.crosscheck import mlp_stack_plan
from workloads.llm_train.layout import Layout
from workloads.llm_train.schedule import Knobs, build_iteration
from workloads.modelcost.costs import LayerCost

A = Cost(4.0, 2.0, 8.0)
B = Cost(8.0, 1.0, 0.0)


def test_arithmetic_and_clip() -> None:
    assert Cost(12.0, 3.0, 8.0) == A + B
    assert Cost(-4.0, 1.0, 8.0) == A - B
    assert (A - B).clip() == Cost(0.0, 1.0, 8.0)
    assert A.scale(0.5) == Cost(2.0, 1.0, 4.0)


@pytest.mark.parametrize("w", [0.0, 0.25, 1.0, 1.5])
def test_lerp_is_linear_and_clipped(w: float) -> None:
    got = A.lerp(B, w)
    want = [max(0.0, a + w * (b - a)) for a, b in ((4, 8), (2, 1), (8, 0))]
    assert (got.cube_flops, got.vector_flops, got.hbm_bytes) == pytest.approx(want)
    assert A.lerp(B, 0.0) == A and A.lerp(B, 1.0) == B


def test_layer_cost_triple_uses_the_fused_hbm_estimate() -> None:
    lc = LayerCost(cube_flops=10, vector_flops=3, hbm_bytes=100, hbm_bytes_fused=40, weight_bytes=20,
                   activation_bytes_out=5)
    assert lc.cost == Cost(10.0, 3.0, 40.0)


def test_add_cost_cube_then_vector_on_one_stream() -> None:
    tr = Trace(world_size=4)
    first = tr.compute(range(4), flops=1.0, stream="s")
    scale = np.array([1.0, 2.0, 0.5, 1.0])
    extra = np.array([0.0, 1.0, 2.0, 3.0])
    ops = add_cost(tr, range(4), "mlp", A, fused=DLRM_FUSED, name="k", stream="s", deps=[first], scale=scale,
                   dtype="int8", hbm_extra=extra)
    cube, vec = (tr.ops[i] for i in ops)
    assert (cube.core, vec.core) == ("cube", "vector") and cube.stream == vec.stream == "s"
    assert (cube.dtype, vec.dtype) == ("int8", "")  # the format rides on the matmul kernel only
    np.testing.assert_allclose(cube.flops, A.cube_flops * scale)
    np.testing.assert_allclose(cube.hbm_bytes, A.hbm_bytes * scale + extra)  # all HBM traffic on the cube op
    np.testing.assert_allclose(vec.flops, A.vector_flops * scale)
    assert max(vec.hbm_bytes) == 0 and vec.name == "k.vec"
    assert first in stream_predecessors(tr)[cube.id] and cube.id in stream_predecessors(tr)[vec.id]
    # no vector work: one op; no work at all: still one (empty) op to depend on, carrying the extra
    assert len(add_cost(tr, range(4), "m", Cost(1.0, 0.0, 1.0), fused=DLRM_FUSED, name="m")) == 1
    (z,) = add_cost(tr, range(4), "m", Cost(), fused=DLRM_FUSED, name="z", hbm_extra=5.0)
    assert tr.ops[z].per_rank(tr.ops[z].hbm_bytes).tolist() == [5.0] * 4 and max(tr.ops[z].flops) == 0


def test_llm_train_keeps_vector_work_on_vector_cores() -> None:
    """Conservation: the trace's cube and vector FLOPs are the plan's, per core type (vector work
    is no longer folded into cube FLOPs)."""
    layers, hidden, tokens, tp, fsdp = 3, 64, 32, 2, 2
    plan = mlp_stack_plan(layers, hidden, tokens, tp)
    trace = build_iteration(plan, Layout(tp * fsdp, fsdp, tp, 1), Knobs(ac=AcMode.none))
    sub = plan.units[0].subs[0]
    assert sub.fwd.vector_flops > 0 and sub.bwd.vector_flops > 0
    by_core = {"cube": 0.0, "vector": 0.0}
    for op in trace.ops:
        if op.kind == "compute" and not op.name.startswith("optimizer"):
            by_core[op.core] += max(op.flops)
    want = (sub.fwd + sub.bwd).scale(layers)
    assert by_core["cube"] == pytest.approx(want.cube_flops)
    assert by_core["vector"] == pytest.approx(want.vector_flops)
