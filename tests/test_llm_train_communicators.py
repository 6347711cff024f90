"""llm_train's FSDP collectives follow FSDP2's communicators and issue order (schedule.py): the
all-gathers and reduce-scatters share one communicator unless `separate_reduce_scatter_group`; in
the backward the next unit's gather is issued before this unit's reduce-scatter."""

from __future__ import annotations

from helpers import make_library

from stratacl.config import DataPath
from stratacl.engine.replay import simulate
from stratacl.trace import family_of
from workloads.llm_train.blocks import Cost, ModelPlan, SubBlock, Unit
from workloads.llm_train.checkpointing import AcMode
from workloads.llm_train.layout import Layout
from workloads.llm_train.schedule import Knobs, build_iteration

SUB = SubBlock("dense_mlp", Cost(3.76e12, 1e9, 1e8), Cost(7.52e12, 2e9, 2e8), tp_style="none")
UNITS = tuple(Unit(f"layer{i}", (SUB,), params=400_000_000) for i in range(4))


def _trace(separate: bool):  # noqa: ANN202
    return build_iteration(ModelPlan(UNITS, hidden=4096, tokens=4096), Layout(8, 8, 1, 1, separate),
                           Knobs(ac=AcMode.none))


def _fsdp(tr):  # noqa: ANN001, ANN202
    return [op for op in tr.ops if op.kind == "collective"]


def test_backward_issues_the_next_gather_before_this_units_reduce_scatter() -> None:
    ops = _fsdp(_trace(False))
    assert {family_of(op.comm) for op in ops} == {"fsdp"}  # one process group
    names = [op.name for op in ops]
    # forward gathers 0..3, then backward: layer3 (already gathered), layer2 prefetched, RS layer3, ...
    bwd = names[4:]
    assert bwd == ["layer3.fsdp_allgather", "layer2.fsdp_allgather", "layer3.fsdp_reducescatter",
                   "layer1.fsdp_allgather", "layer2.fsdp_reducescatter", "layer0.fsdp_allgather",
                   "layer1.fsdp_reducescatter", "layer0.fsdp_reducescatter"]


def test_shared_group_runs_gathers_and_reduce_scatters_one_at_a_time(cm384) -> None:  # noqa: ANN001
    lib = make_library(cm384, "hccl", data_path=DataPath.pool)
    for separate, overlap_expected in ((False, False), (True, True)):
        tr = _trace(separate)
        res = simulate(tr, lib, check=True)
        ag = [op.id for op in _fsdp(tr) if op.coll == "allgather"]
        rs = [op.id for op in _fsdp(tr) if op.coll == "reducescatter"]
        overlap = max(min(res.end[a], res.end[r]) - max(res.start[a], res.start[r]) for a in ag for r in rs)
        assert (overlap > 0) == overlap_expected
        if separate:
            assert {family_of(tr.ops[r].comm) for r in rs} == {"fsdp_rs"}
