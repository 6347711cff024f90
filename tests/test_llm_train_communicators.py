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
    # FSDP's own collectives (the gradient clipping's one-float all-reduce after them left out)
    return [op for op in tr.ops if op.kind == "collective" and not op.name.startswith("optimizer")]


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


def test_fsdp2_copies_around_every_gather_and_reduce_scatter() -> None:
    """Bytes of FSDP2's copies (schedule.py `_fsdp_copy`), closed forms per unit of P parameters
    on F = 8 ranks: all-gather copy-in P/F · (4 + 3·2) on the all-gather stream before each gather;
    copy-out 2 · P · 2 on the compute stream after it; reduce-scatter copy-in P · (2 + 4) on the
    reduce-scatter stream before it; every collective depends on its copy."""
    tr = _trace(False)
    k, p, f = Knobs(), UNITS[0].params, 8
    ops = {op.id: op for op in tr.ops}
    for op in tr.ops:
        if op.kind != "collective" or op.name.startswith("optimizer"):
            continue
        (dep,) = op.deps
        copy = ops[dep]
        want = p // f * (k.master_bytes + 3 * k.act_bytes) if op.coll == "allgather" else p * (k.act_bytes + k.grad_bytes)
        assert copy.name.endswith("_copy_in") and max(copy.hbm_bytes) == want and copy.stream == op.stream
    outs = [op for op in tr.ops if op.name.endswith("fsdp_copy_out")]
    assert len(outs) == 2 * len(UNITS) and all(max(op.hbm_bytes) == 2 * p * k.act_bytes and op.stream == "main"
                                               for op in outs)
    for op in outs:  # each waits for its unit's gather
        assert any(ops[d].kind == "collective" and ops[d].coll == "allgather" for d in op.deps)


def test_gradient_clipping_norm_all_reduce_and_scale_before_the_step() -> None:
    """clip_grad_norm_: the shard's norm (reads its fp32 gradients), one fp32 all-reduced over the
    data-parallel group, the scale (reads and writes them); Adam waits for it. Off: none of it."""
    local = sum(u.params for u in UNITS) // 8
    tr = _trace(False)
    by_name = {op.name: op for op in tr.ops}
    norm, ar = by_name["optimizer.clip_norm"], by_name["optimizer.clip_norm_fsdp_allreduce"]
    scale = next(op for op in tr.ops if op.name.startswith("optimizer.clip_scale"))
    assert max(norm.hbm_bytes) == local * 4 and max(scale.hbm_bytes) == 2 * local * 4
    assert max(ar.nbytes) == 4.0 and ar.coll == "allreduce" and family_of(ar.comm) == "fsdp"
    assert ar.deps == (norm.id,) or list(ar.deps) == [norm.id]
    step = next(op for op in tr.ops if op.name.startswith("optimizer.step"))
    assert scale.id in step.deps
    off = build_iteration(ModelPlan(UNITS, hidden=4096, tokens=4096), Layout(8, 8, 1, 1),
                          Knobs(ac=AcMode.none, grad_clip=False))
    assert not any("clip" in op.name for op in off.ops)
