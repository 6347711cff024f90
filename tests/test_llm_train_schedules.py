"""Each pipeline schedule's per-rank order against its published definition, and the closed-form
bubbles of the schedules that have one.

Orders are checked two ways: a small case (pp 2, 4 micro-batches) written out by hand from the
source, and, for larger cases, the schedule generators of the installed torch.distributed.pipelining
(torch 2.13.0, git cf30153c4c131c8164ee7798e5022d810682e2cb, torch/distributed/pipelining/
schedules.py) called on a bare object. Notation: F forward, B full backward, I input-gradient
backward, W weight-gradient backward, `<kind><stage>.<micro-batch>`; `a+b` is DualPipeV's overlapped
forward/backward pair.
"""

from __future__ import annotations

import pytest
from test_llm_train_pipeline import _replay

from workloads.llm_train.pipeline import stage_figures
from workloads.llm_train.pp_schedules import PpSchedule, rank_steps, validate

# pp 2, 4 micro-batches (2 stages per rank for the interleaved and V schedules), by hand:
HAND = {
    # ScheduleGPipe._step_microbatches: every forward, then every backward, in micro-batch order
    PpSchedule.gpipe: ["F0.0 F0.1 F0.2 F0.3 B0.0 B0.1 B0.2 B0.3",
                       "F1.0 F1.1 F1.2 F1.3 B1.0 B1.1 B1.2 B1.3"],
    # Schedule1F1B._step_microbatches: min(m, p − rank) warm-up forwards, then B, F alternating,
    # then the remaining backwards (its _get_pipeline_order, the IR for visualisation, starts the
    # last rank at micro-batch 1 and runs to m: not what runs)
    PpSchedule.one_f_one_b: ["F0.0 F0.1 B0.0 F0.2 B0.1 F0.3 B0.2 B0.3",
                             "F1.0 B1.0 F1.1 B1.1 F1.2 B1.2 F1.3 B1.3"],
    # ScheduleInterleaved1F1B: rounds max(1, m // p) = 2, 2 micro-batches per round; warm-up
    # (v − 1)·2 + 2·(p − 1 − rank); forward chunk (step // 2) mod v, backward chunk from the last
    PpSchedule.interleaved_1f1b: [
        "F0.0 F0.1 F2.0 F2.1 F0.2 B2.0 F0.3 B2.1 F2.2 B0.0 F2.3 B0.1 B2.2 B2.3 B0.2 B0.3",
        "F1.0 F1.1 F3.0 B3.0 F3.1 B3.1 F1.2 B1.0 F1.3 B1.1 F3.2 B3.2 F3.3 B3.3 B1.2 B1.3"],
    # ScheduleInterleavedZeroBubble (ZB1P): warm-up factor 1; I instead of B; W of the oldest
    # backward after each I once `rank` of them have run, the rest at the end
    PpSchedule.interleaved_zb: [
        "F0.0 F0.1 F2.0 F2.1 I2.0 W2.0 F0.2 I2.1 W2.1 F0.3 I0.0 W0.0 F2.2 I0.1 W0.1 F2.3 I2.2 W2.2 "
        "I2.3 W2.3 I0.2 W0.2 I0.3 W0.3",
        "F1.0 F1.1 F3.0 I3.0 F3.1 I3.1 W3.0 F1.2 I1.0 W3.1 F1.3 I1.1 W1.0 F3.2 I3.2 W1.1 F3.3 I3.3 W3.2 "
        "I1.2 W3.3 I1.3 W1.2 W1.3"],
    # ScheduleZBVZeroBubble: rank r holds stages r and 3 − r; 2(p − r) − 1 F0, r (F1 F0), p − r
    # (F1 I1 W1), F0 I0 W0 F1 I1 W1 while forwards remain, r (I0 I1), p − r (I0 W0), W1s, W0s
    PpSchedule.zbv: [
        "F0.0 F0.1 F0.2 F3.0 I3.0 W3.0 F3.1 I3.1 W3.1 F0.3 I0.0 W0.0 F3.2 I3.2 W3.2 I0.1 W0.1 F3.3 I3.3 W3.3 "
        "I0.2 W0.2 I0.3 W0.3",
        "F1.0 F2.0 F1.1 F2.1 I2.0 W2.0 F1.2 I1.0 W1.0 F2.2 I2.1 W2.1 F1.3 I1.1 W1.1 F2.3 I2.2 W2.2 "
        "I1.2 I2.3 I1.3 W1.2 W2.3 W1.3"],
    # deepseek-ai/DualPipe dualpipe/dualpipev.py @3da1bbea53606543d7f5f232338fc58096db30e3 (steps
    # 1-8: nF0, nF0F1, nI1W1F1, nF0B1F1B0 with the last rank's first pair not overlapped, nB1F1B0,
    # nB1B0 with zero bubble from the middle on, nWB0, nW; torch's ScheduleDualPipeV alike)
    PpSchedule.dualpipev: [
        "F0.0 F0.1 F0.2 F3.0 I3.0 W3.0 F3.1 F0.3+B3.1 F3.2+B0.0 B3.2 F3.3+B0.1 B3.3 I0.2 W0.2 I0.3 W0.3",
        "F1.0 F2.0 F1.1 F2.1 F1.2 B2.0 F2.2+B1.0 F1.3+B2.1 F2.3+B1.1 B2.2 B1.2 I2.3 I1.3 W2.3 W1.3"],
}


def _fmt(steps: list) -> str:
    return " ".join("+".join(f"{a.kind}{a.stage}.{a.mb}" for a in step) for step in steps)


@pytest.mark.parametrize("sched", list(PpSchedule))
def test_small_case_order_is_the_published_one(sched: PpSchedule) -> None:
    steps = rank_steps(sched, 2, 4, 2)
    validate(steps, sched, 2, 4, 2)
    assert [_fmt(s) for s in steps] == HAND[sched]


def _torch_order(sched: PpSchedule, p: int, m: int, v: int) -> list[str]:
    """The rank orders torch's schedule classes compute (their own generators, on a bare object:
    the generators read only these attributes)."""
    S = pytest.importorskip("torch.distributed.pipelining.schedules")
    cls = {PpSchedule.gpipe: S.ScheduleGPipe, PpSchedule.interleaved_1f1b: S.ScheduleInterleaved1F1B,
           PpSchedule.interleaved_zb: S.ScheduleInterleavedZeroBubble, PpSchedule.zbv: S.ScheduleZBVZeroBubble,
           PpSchedule.dualpipev: S.ScheduleDualPipeV}[sched]
    o = object.__new__(cls)
    o._n_microbatches, o._num_stages, o.pp_group_size, o.n_local_stages, o.num_stages = m, p, p, v, 2 * p
    o.number_of_rounds = max(1, m // p)
    o.microbatches_per_round = m // o.number_of_rounds
    order = o._get_pipeline_order() if sched == PpSchedule.gpipe else \
        {r: o._calculate_single_rank_operations(r) for r in range(p)}
    kind = {S.FORWARD: "F", S.FULL_BACKWARD: "B", S.BACKWARD_INPUT: "I", S.BACKWARD_WEIGHT: "W"}
    out = []
    for r in range(p):
        steps = [a.sub_actions or (a,) for a in order[r] if a is not None]
        out.append(" ".join("+".join(f"{kind[x.computation_type]}{x.stage_index}.{x.microbatch_index}"
                                     for x in step if x.computation_type in kind) for step in steps))
    return [" ".join(s.split()) for s in out]


@pytest.mark.parametrize("sched", [s for s in PpSchedule if s != PpSchedule.one_f_one_b])
@pytest.mark.parametrize("p, m", [(3, 6), (4, 8), (4, 12), (8, 16)])
def test_order_matches_torch_pipelining(sched: PpSchedule, p: int, m: int) -> None:
    ours = [_fmt(s) for s in rank_steps(sched, p, m, 2)]
    assert ours == _torch_order(sched, p, m, 2)


@pytest.mark.parametrize("p, m", [(3, 6), (4, 8), (8, 16)])
def test_1f1b_order_is_warmup_then_alternating(p: int, m: int) -> None:
    for r, steps in enumerate(rank_steps(PpSchedule.one_f_one_b, p, m)):
        warm = min(m, p - r)
        expect = [f"F{r}.{i}" for i in range(warm)]
        for b in range(m):
            expect.append(f"B{r}.{b}")
            if warm + b < m:
                expect.append(f"F{r}.{warm + b}")
        assert _fmt(steps) == " ".join(expect)


def _bubble(sched: PpSchedule, p: int, m: int, layers: int) -> float:
    # uniform stages wide enough that a p2p transfer takes ~2 % of a forward (as the 1F1B test)
    _, lay, trace, res = _replay(p, m, sched, layers=layers, tokens=2048, hidden=8192)
    fig = stage_figures(trace, res.start, res.end, lay)
    assert fig["stage_exposed_comm_s"] < 0.03 * res.makespan_s
    return fig["bubble_fraction"]


def test_gpipe_bubble_matches_closed_form() -> None:
    p, m = 4, 8  # GPipe idles (p − 1)(t_F + t_B) of (m + p − 1)(t_F + t_B), as 1F1B
    assert _bubble(PpSchedule.gpipe, p, m, 2 * p) == pytest.approx((p - 1) / (m + p - 1), rel=0.03)


@pytest.mark.parametrize("p, m", [(4, 8), (2, 8)])
def test_interleaved_bubble_matches_closed_form(p: int, m: int) -> None:
    # Narayanan et al. 2021 (arXiv 2104.04473) §2.2.2: with v chunks per rank the bubble is
    # (p − 1)(t_F + t_B)/v against m(t_F + t_B) of work: a fraction (p − 1)/(v·m + p − 1) of the span
    v = 2
    expect = (p - 1) / (v * m + p - 1)
    assert _bubble(PpSchedule.interleaved_1f1b, p, m, 2 * v * p) == pytest.approx(expect, rel=0.05)
