"""The recorder's model (a stack of MLP blocks, fp32, TP colwise/rowwise without sequence
parallelism, FSDP2 per block) as a ModelPlan, so the schedule can be checked against the
collectives real PyTorch issues (`workloads.modelcost.recorder.record_collectives`)."""

from __future__ import annotations

from collections import Counter

from stratacl.trace import Trace
from stratacl.vocab import OpKind
from workloads.common.cost import Cost
from workloads.modelcost import mlp_cost

from .blocks import ModelPlan, SubBlock, Unit
from .checkpointing import AcMode
from .layout import Layout
from .schedule import Knobs, build_iteration

FP32 = 4


def mlp_stack_plan(layers: int, hidden: int, tokens: int, tp: int) -> ModelPlan:
    shard = [hidden, 4 * hidden // tp, hidden]  # colwise up, rowwise down: this rank's slice
    fwd = mlp_cost(shard, tokens, "train_fwd", dtype_bytes=FP32)
    bwd = mlp_cost(shard, tokens, "train_bwd", dtype_bytes=FP32)

    def cost(c: dict) -> Cost:
        return Cost(c["cube_flops"], c["vector_flops"], c["hbm_bytes"])

    sub = SubBlock("mlp", cost(fwd), cost(bwd), "block")
    params = 2 * hidden * 4 * hidden // tp
    units = tuple(Unit(f"block{i}", (sub,), params) for i in range(layers))
    # the recorder's input needs no grad: the first block's input-grad all-reduce is skipped
    return ModelPlan(units, hidden, tokens, first_input_needs_grad=False)


def mlp_stack_trace(layers: int, hidden: int, tokens: int, tp: int, fsdp: int) -> Trace:
    layout = Layout(tp * fsdp, fsdp, tp, 1)
    knobs = Knobs(act_bytes=FP32, grad_bytes=FP32, master_bytes=FP32, sequence_parallel=False,
                  ac=AcMode.none, grad_clip=False)
    return build_iteration(mlp_stack_plan(layers, hidden, tokens, tp), layout, knobs)


def trace_collectives(trace: Trace) -> Counter:
    """Multiset of (collective, bytes per rank, group size) one rank takes part in."""
    out: Counter = Counter()
    for op in trace.ops:
        if op.kind == OpKind.collective:
            out[(op.coll, int(max(op.nbytes)), len(trace.op_groups(op)[0]))] += 1
    return out
