"""llm_train pipeline parallelism and ZeRO: bubbles from the replay against the closed form, the
order of each stage's actions, the bytes between stages, ZeRO's parameter residency, bad layouts."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
from helpers import compose_run, make_library

from stratacl.engine.replay import simulate
from stratacl.errors import ConfigError
from stratacl.machine.fabric import Fabric
from workloads.llm_train.allocation import ITERATIONS
from workloads.llm_train.checkpointing import AcMode
from workloads.llm_train.crosscheck import mlp_stack_plan
from workloads.llm_train.layout import Layout
from workloads.llm_train.pipeline import Pipe, build_pipeline, stage_figures
from workloads.llm_train.pp_memory import pipeline_ops
from workloads.llm_train.pp_schedules import PpSchedule
from workloads.llm_train.schedule import Knobs
from workloads.llm_train.workload import prepare

HIDDEN, TOKENS = 2048, 8192
# no optimizer work and no recompute: every stage's time is its forwards and backwards
QUIET = Knobs(ac=AcMode.none, optimizer_flops_per_param=0.0, master_bytes=0, grad_bytes=0, state_bytes=0)


@cache
def _lib():  # noqa: ANN202
    cfg = compose_run(["workload=llm_train"])
    fabric = Fabric(cfg.fabric)
    return fabric, make_library(fabric)


def _replay(p: int, m: int, schedule: PpSchedule, layers: int = 8, tokens: int = TOKENS, fsdp: int = 1,
            zero: int = 3, knobs: Knobs = QUIET, hidden: int = HIDDEN):  # noqa: ANN202
    plan = mlp_stack_plan(layers, hidden, tokens, 1)
    lay = Layout(p * fsdp, fsdp, 1, 1, pp=p)
    trace = build_pipeline(plan, lay, knobs, Pipe(schedule=schedule, microbatches=m, zero=zero))
    trace.validate()
    return plan, lay, trace, simulate(trace, _lib()[1])


@pytest.mark.parametrize("p, m", [(4, 8), (4, 16), (8, 8)])
def test_1f1b_bubble_matches_closed_form(p: int, m: int) -> None:
    # uniform stages (two MLP blocks each), wide enough that a p2p transfer takes ~2 % of a
    # forward: each stage idles (p − 1)(t_F + t_B) of (m + p − 1)(t_F + t_B)
    _, lay, trace, res = _replay(p, m, PpSchedule.one_f_one_b, layers=2 * p, tokens=2048, hidden=8192)
    fig = stage_figures(trace, res.start, res.end, lay)
    assert fig["stage_exposed_comm_s"] < 0.02 * res.makespan_s
    assert fig["bubble_fraction"] == pytest.approx((p - 1) / (m + p - 1), rel=0.03)


def test_schedules_shrink_the_bubble_in_their_published_order() -> None:
    fr = {}
    for sched in PpSchedule:
        _, lay, trace, res = _replay(4, 8, sched)
        fr[sched] = stage_figures(trace, res.start, res.end, lay)["bubble_fraction"]
    assert fr[PpSchedule.gpipe] == pytest.approx(fr[PpSchedule.one_f_one_b], rel=0.05)
    assert fr[PpSchedule.interleaved_1f1b] < 0.8 * fr[PpSchedule.one_f_one_b]
    assert fr[PpSchedule.interleaved_zb] < fr[PpSchedule.interleaved_1f1b]
    assert fr[PpSchedule.dualpipev] < fr[PpSchedule.interleaved_1f1b]


@pytest.mark.parametrize("sched", list(PpSchedule))
def test_every_forward_precedes_its_backward_on_each_stage(sched: PpSchedule) -> None:
    _, _, trace, res = _replay(4, 8, sched)
    acts = trace.meta["pipeline"]["actions"]
    ends = {(k, s, mb): res.end[last] for k, s, mb, _, last in acts}
    starts = {(k, s, mb): res.start[first] for k, s, mb, first, _ in acts}
    n = 0
    for (k, s, mb), t0 in starts.items():
        if k in "BI":
            assert t0 >= ends[("F", s, mb)] - 1e-12, (k, s, mb)
            n += 1
        if k == "W":
            assert t0 >= ends[("I", s, mb)] - 1e-12
    assert n == trace.meta["pipeline"]["stages"] * 8


@pytest.mark.parametrize("sched", [PpSchedule.one_f_one_b, PpSchedule.interleaved_1f1b, PpSchedule.dualpipev])
def test_bytes_between_stages_are_activations_times_microbatches(sched: PpSchedule) -> None:
    p, m, fsdp = 4, 8, 2
    plan, lay, trace, _ = _replay(p, m, sched, fsdp=fsdp)
    act = TOKENS * HIDDEN * QUIET.act_bytes  # one die's hidden states of one micro-batch (tp 1)
    p2p = [op for op in trace.ops if op.kind == "p2p"]
    stages = trace.meta["pipeline"]["stages"]
    turns = 1 if sched == PpSchedule.dualpipev else 0  # the V's turn stays on one rank
    for kind in ("act", "grad"):
        ops = [op for op in p2p if f".{kind}." in op.name]
        sent = sum(float(np.sum(op.per_rank(op.nbytes)[:1])) * len(op.src) for op in ops)
        assert sent == pytest.approx(act * m * fsdp * (stages - 1 - turns))
        for op in ops:  # die j of a stage sends to die j of the next stage's rank, only
            assert len(op.src) == fsdp and len({d - s for s, d in zip(op.src, op.dst, strict=True)}) == 1
            assert [s % fsdp for s in op.src] == [d % fsdp for d in op.dst] == list(range(fsdp))


def _live_param_bytes(ops: list[tuple], prefixes: tuple[str, ...]) -> tuple[float, float]:
    live: dict[str, float] = {}
    lo, hi, started = np.inf, 0.0, False
    for op in ops:
        if op[1].startswith(prefixes):
            if op[0] == "alloc":
                live[op[1]] = op[2]
            else:
                live.pop(op[1], None)
        if op[1].startswith("act"):
            started = True  # after start-up
        if started:
            total = sum(live.values())
            lo, hi = min(lo, total), max(hi, total)
    return lo, hi


def test_zero1_keeps_full_parameters_and_zero3_does_not() -> None:
    p, fsdp = 2, 4
    plan = mlp_stack_plan(4, HIDDEN, TOKENS, 1)
    lay = Layout(p * fsdp, fsdp, 1, 1, pp=p)
    k = Knobs(ac=AcMode.none)
    full = sum(u.params for u in plan.units[:2]) * k.act_bytes  # rank 0's two blocks, bf16
    z1 = pipeline_ops(plan, lay, k, Pipe(microbatches=4, zero=1), 0)
    z3 = pipeline_ops(plan, lay, k, Pipe(microbatches=4, zero=3), 0)
    z3r = pipeline_ops(plan, lay, k, Pipe(microbatches=4, zero=3, reshard_after_forward=True), 0)
    lo1, _ = _live_param_bytes(z1, ("replica", "unsharded"))
    lo3, hi3 = _live_param_bytes(z3, ("replica", "unsharded"))

    assert lo1 >= full  # every die holds its stage's parameters at every moment
    # ZeRO-3 (TorchTitan's PP policy): gathered through the step, sharded between steps
    assert lo3 == 0 and hi3 == full
    assert sum(o[0] == "alloc" and o[1].startswith("unsharded") for o in z3) == 2 * ITERATIONS  # once per unit, step
    # reshard after forward: gathered again for backwards and for forwards after a forward
    assert sum(o[0] == "alloc" and o[1].startswith("unsharded") for o in z3r) > \
        sum(o[0] == "alloc" and o[1].startswith("unsharded") for o in z3)
    # gradients accumulate unsharded over micro-batches (pipelining turns FSDP's sync off until the
    # last one) at ZeRO-1 and 3; ZeRO-2 reduce-scatters each micro-batch and keeps the shard
    z2 = pipeline_ops(plan, lay, k, Pipe(microbatches=4, zero=2), 0)
    for ops, n in ((z1, 1), (z3, 1), (z2, 0)):
        assert sum(o[2] for o in ops if o[0] == "alloc" and o[1].startswith("fgrad")) == \
            n * sum(u.params for u in plan.units[:2]) * k.grad_bytes

    def gathers(zero: int, **kw: bool) -> list:
        plan_ = mlp_stack_plan(4, HIDDEN, TOKENS, 1)
        trace = build_pipeline(plan_, lay, k, Pipe(microbatches=4, zero=zero, **kw))
        return [op for op in trace.ops if op.coll == "allgather"]

    # the traces: ZeRO-3 gathers each unit once per step (TorchTitan's PP policy), or before every
    # action that finds the unit freed (reshard_after_forward; a backward other than the last keeps
    # it: 1F1B on 4 micro-batches, rank 0 runs F F B F B F B B and gathers before F0 F1 B0 B1 B2,
    # rank 1 runs F B F B F B F B and gathers before F0 B0 B1 B2 B3); ZeRO-1 once after the step
    assert len(gathers(3)) == p * 2  # stages × units
    assert len(gathers(3, reshard_after_forward=True)) == 2 * 5 + 2 * 5
    assert len(gathers(1)) == p * 2  # one per unit, after the optimizer


BASE = ["workload=llm_train", "workload.num_layers=4", "workload.dies=16", "workload.fsdp=2",
        "workload.tp=4", "workload.ep=8", "workload.global_batch=8", "workload.seq_len=512", "workload.pp=2",
        "workload.microbatches=4"]


@pytest.mark.parametrize("extra, field", [
    (["workload.pp=3"], "workload.pp"),  # 3 does not divide 16 dies
    (["workload.pp_schedule=interleaved_1f1b", "workload.pp_virtual_stages=4"], "workload.pp"),  # 8 stages, 4 layers
    (["workload.microbatches=1", "workload.global_batch=2"], "workload.microbatches"),  # 1F1B: m < p
    (["workload.pp_schedule=dualpipev", "workload.microbatches=2", "workload.global_batch=4"],
     "workload.microbatches"),  # 4 stages
    (["workload.microbatches=3"], "workload.microbatches"),  # 8 sequences over 2 × 3
    (["workload.fsdp=4"], "workload.fsdp"),  # 2 × 4 × 4 ≠ 16
])
def test_bad_pipeline_layout_fails_with_the_field(extra: list[str], field: str) -> None:
    cfg = compose_run(BASE + extra)
    with pytest.raises(ConfigError) as err:
        prepare(cfg.workload, Fabric(cfg.fabric))
    assert err.value.field == field


@pytest.mark.parametrize("overlap", [True, False])
def test_dualpipev_pairs_run_concurrently_only_when_overlapped(overlap: bool) -> None:
    plan = mlp_stack_plan(8, HIDDEN, TOKENS, 1)
    lay = Layout(4, 1, 1, 1, pp=4)
    trace = build_pipeline(plan, lay, QUIET, Pipe(schedule=PpSchedule.dualpipev, microbatches=8, overlap=overlap))
    res = simulate(trace, _lib()[1])
    spans: dict[int, list[tuple[float, float]]] = {}
    for _k, s, _mb, first, last in trace.meta["pipeline"]["actions"]:
        rank = s if s < 4 else 7 - s
        spans.setdefault(rank, []).append((res.start[first], res.end[last]))
    concurrent = sum(1 for lst in spans.values() for (_a0, a1), (b0, _b1) in zip(lst[:-1], lst[1:], strict=True)
                     if b0 < a1 - 1e-9)  # the next action started before this one ended
    assert (concurrent > 0) == overlap
    assert any(op.stream == "main.overlap" for op in trace.ops) == overlap


def test_a_stage_ops_span_that_stage_only() -> None:
    p, fsdp = 4, 2
    _, lay, trace, _ = _replay(p, 4, PpSchedule.one_f_one_b, fsdp=fsdp, zero=2, knobs=Knobs(ac=AcMode.none))
    for op in trace.ops:
        stages = {r // lay.stage_dies for r in op.ranks}
        assert len(stages) == (2 if op.kind == "p2p" else 1), op.label()
    rs = [op for op in trace.ops if op.coll == "reducescatter"]
    assert len(rs) == 8 * 4  # ZeRO-2: every unit, every micro-batch


def test_reshard_after_forward_gathers_wait_for_the_buffer_they_reuse() -> None:
    """ZeRO-3 with `reshard_after_forward`: a unit's parameters sit in one of two buffers while it
    runs, so (FSDP2's one-unit prefetch) unit n+1's all-gather starts only after unit n-1, whose
    slot it reuses, has finished; an action's later gathers do not all run ahead at its start."""
    plan = mlp_stack_plan(8, HIDDEN, TOKENS, 1)
    lay = Layout(2 * 4, 4, 1, 1, pp=2)
    trace = build_pipeline(plan, lay, QUIET, Pipe(schedule=PpSchedule.one_f_one_b, microbatches=4, zero=3,
                                                  reshard_after_forward=True))
    trace.validate()
    res = simulate(trace, _lib()[1])
    gathers = [op for op in trace.ops if op.kind == "collective" and op.coll == "allgather"]
    waited = [op for op in gathers if op.deps]
    assert len(waited) >= len(gathers) // 2  # every gather but each action's first two
    for op in waited:
        assert res.start[op.id] >= max(res.end[d] for d in op.deps) - 1e-12
    # the slot a gather fills was released by the op it waits for: no two live gathers share it
    assert {op.buffer[-1] for op in gathers} == {"0", "1"}


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_only_zero3_runs_fsdp2_copies(zero: int) -> None:
    """FSDP2 (ZeRO-3) copies into and out of its collectives' buffers; ZeRO-1/2 (contiguous
    parameter and gradient buffers) do not."""
    _, _, trace, _ = _replay(4, 4, PpSchedule.one_f_one_b, fsdp=2, zero=zero, knobs=Knobs(ac=AcMode.none))
    copies = [op for op in trace.ops if "_copy_in" in op.name or op.name.endswith("fsdp_copy_out")]
    assert bool(copies) == (zero == 3)


@pytest.mark.parametrize("sched, v", [(PpSchedule.one_f_one_b, 1), (PpSchedule.interleaved_1f1b, 2)])
def test_combined_1f1b_pairs_the_steady_state_only(sched: PpSchedule, v: int) -> None:
    """Megatron's combined 1F1B: every pair is a forward and a backward of different micro-batches;
    each stage still runs every micro-batch once each way; the steady state is paired (the
    warm-up forwards and cool-down backwards around it are not); the pairs run on two streams and the step is no
    slower than the plain schedule's (the same work, more overlap)."""
    from workloads.llm_train.pp_schedules import combine_1f1b, rank_steps, validate

    p, m = 4, 8
    plain = rank_steps(sched, p, m, v)
    comb = rank_steps(sched, p, m, v, combined=True)
    validate(comb, sched, p, m, v)
    for r, (a, b) in enumerate(zip(plain, comb, strict=True)):
        pairs = [s for s in b if len(s) == 2]
        assert all({x.kind for x in s} == {"F", "B"} and s[0].mb != s[1].mb or s[0].stage != s[1].stage
                   for s in pairs)
        # the steady state's length: after the warm-up forwards (1F1B: p − r; interleaved:
        # (v − 1)·m/rounds + 2(p − 1 − r), pp_schedules._interleaved)
        per_round = m // max(1, m // p)
        warm = p - r if v == 1 else min((v - 1) * per_round + 2 * (p - 1 - r), m * v)
        # (the greedy pairing may join the last warm-up forward to the first backward, or leave a
        # backward whose own forward precedes it alone: ± 1)
        assert len(b) == len(a) - len(pairs) and abs(len(pairs) - (m * v - warm)) <= 1 and pairs
        assert combine_1f1b(b) == b  # nothing left to pair
    plan = mlp_stack_plan(8, HIDDEN, TOKENS, 1)
    lay = Layout(p, 1, 1, 1, pp=p)
    times = {}
    for combined in (False, True):
        tr = build_pipeline(plan, lay, QUIET, Pipe(schedule=sched, microbatches=m, virtual=max(v, 2), combined=combined))
        tr.validate()
        times[combined] = float(simulate(tr, _lib()[1]).end.max())
        assert any(op.stream == "main.overlap" for op in tr.ops) == combined
    assert times[True] <= times[False] * (1 + 1e-9)


@pytest.mark.parametrize("extra, field", [
    (["workload.ep_overlap=true", "workload.pp=2", "workload.pp_schedule=dualpipev", "workload.microbatches=4"],
     "workload.ep_overlap"),
    (["workload.ep_overlap=true"], "workload.ep_overlap"),  # FSDP step, one micro-batch
])
def test_ep_overlap_outside_its_schedules_is_refused(extra: list[str], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        prepare(compose_run(["workload=llm_train", *extra]).workload, _lib()[0])
    assert err.value.field == field


def test_per_family_exposure_is_each_stages_own() -> None:
    """With pipelining, `exposed_<family>_<coll>_s` is per stage (its own ops in flight, none of its
    compute running), as `stage_exposed_comm_s` is: each family's at most the whole, and together
    at least it (families in flight at once count in each)."""
    _, lay, trace, res = _replay(4, 8, PpSchedule.one_f_one_b, fsdp=2, zero=1, knobs=Knobs(ac=AcMode.none))
    fig = stage_figures(trace, res.start, res.end, lay)
    fams = {k: v for k, v in fig.items() if k.startswith("exposed_")}
    assert "exposed_p2p_p2p_s" in fams and len(fams) >= 2
    total = fig["stage_exposed_comm_s"]
    assert all(-1e-12 <= v <= total + 1e-9 for v in fams.values())
    assert sum(fams.values()) >= total - 1e-9 > 0
