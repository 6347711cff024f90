"""Property-based engine invariants over random small traces (hypothesis)."""

from __future__ import annotations

import copy

import numpy as np
from helpers import ROOT, load_script, make_library
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stratacl.config import DataPath, Mover
from stratacl.engine import fluid
from stratacl.engine.replay import simulate
from stratacl.machine.fabric import Fabric
from stratacl.trace import Trace, family_of, stream_predecessors

WORLD = 8
# sizes are zero or physical: below ~1e-30 s the float clock cannot resolve an activity at all
FLOPS = st.one_of(st.just(0.0), st.floats(1e3, 1e12))
BYTES = st.one_of(st.just(0.0), st.floats(1.0, 1e9))
SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def traces(draw, chain: bool = False) -> Trace:  # noqa: ANN001
    tr = Trace(world_size=WORLD)
    tr.add_family("g", [range(0, 4), range(4, 8)])
    tr.add_family("w", [range(WORLD)])
    if draw(st.booleans()):  # a per-stream core split (compute and comm kernels obey it)
        tr.limit_stream("a", draw(st.integers(1, 24)), draw(st.integers(2, 48)))
        tr.limit_stream("b", draw(st.integers(1, 24)), draw(st.integers(2, 48)))
    n_ops = draw(st.integers(1, 10))
    for i in range(n_ops):
        stream = "s" if chain else draw(st.sampled_from(["a", "b", "c"]))
        deps = [] if chain or i == 0 else draw(st.lists(st.integers(0, i - 1), max_size=2, unique=True))
        kind = draw(st.sampled_from(["compute", "collective", "p2p", "memcpy"]))
        if kind == "compute":
            ranks = draw(st.sampled_from([range(4), range(4, 8), range(8), [0], [5]]))
            core = draw(st.sampled_from(["cube", "vector", "mixed"]))
            extra = {"vector_flops": draw(FLOPS)} if core == "mixed" else {}
            tr.compute(ranks, flops=draw(FLOPS), hbm_bytes=draw(BYTES), core=core, stream=stream, deps=deps,
                       block_dim=draw(st.integers(0, 24)), **extra)
        elif kind == "collective":
            comm = draw(st.sampled_from(["g", "w", "g[0]"]))
            coll = draw(st.sampled_from(["allreduce", "allgather", "reducescatter", "alltoall", "broadcast"]))
            tr.collective(coll, comm, draw(st.floats(1024, 2**28)), stream=stream, deps=deps)
        elif kind == "p2p":
            src = draw(st.integers(0, WORLD - 1))
            dst = draw(st.integers(0, WORLD - 1).filter(lambda d, s=src: d != s))
            tr.add("p2p", sorted({src, dst}), src=[src], dst=[dst], nbytes=draw(st.floats(1, 2**28)),
                   stream=stream, deps=deps)
        else:
            tr.add("memcpy", draw(st.sampled_from([range(4), [3]])), nbytes=draw(BYTES),
                   stream=stream, deps=deps)
    tr.validate()
    return tr


def _libs(fabric: Fabric):  # noqa: ANN202
    # AI_CPU (SDMA, staged), device-triggered SDMA without a core split, AIV with held cores
    return [make_library(fabric, "hccl"), make_library(fabric, "stratacl"),
            make_library(fabric, "hccl", mover=Mover.vector_cores, data_path=DataPath.pool),
            make_library(fabric, "hccl", mover=Mover.sdma, data_path=DataPath.pool)]


@SETTINGS
@given(tr=traces())
def test_invariants_conservation_causality_capacity(cm384, tr: Trace) -> None:  # noqa: ANN001
    for lib in _libs(cm384):
        res = simulate(tr, lib, check=True)
        assert res.work_error < 1e-7, "fluid activities must integrate exactly their work"
        assert res.max_violation < 1e-9, "no resource may run above capacity"
        for i, preds in enumerate(stream_predecessors(tr)):
            for p in preds:
                assert res.start[i] >= res.end[p] - 1e-15, "no op starts before its dependencies end"
            assert res.end[i] >= res.start[i]
        # time accounting: an op's phases fill its whole duration
        for i in range(len(tr.ops)):
            split = sum(res.split[c][i] for c in res.split)
            assert abs(split - (res.end[i] - res.start[i])) <= 1e-12 + 1e-9 * res.end[i]


@SETTINGS
@given(tr=traces())
def test_one_communicator_runs_its_collectives_one_at_a_time_in_issue_order(cm384, tr: Trace) -> None:  # noqa: ANN001
    """Collectives sharing a communicator (same family, a rank in common) never overlap in time,
    and the one issued later starts after the earlier one ends, whatever streams they are on."""
    colls = [op for op in tr.ops if op.kind == "collective"]
    pairs = [(a.id, b.id) for a in colls for b in colls if a.id < b.id
             and family_of(a.comm) == family_of(b.comm) and set(a.ranks) & set(b.ranks)]
    for lib in _libs(cm384)[:3]:
        res = simulate(tr, lib)
        for a, b in pairs:
            assert res.start[b] >= res.end[a] - 1e-15, f"{tr.ops[b].label()} overlaps {tr.ops[a].label()}"


def _faster_fabric(cm384: Fabric, factor: float) -> Fabric:  # noqa: ANN001
    cfg = copy.deepcopy(cm384.cfg)
    for tier in cfg.tiers.values():
        tier.beta_GBps *= factor
    for plane in cfg.port_GBps:
        cfg.port_GBps[plane] *= factor
    cfg.die.hbm_GBps *= factor
    return Fabric(cfg)


@SETTINGS
@given(tr=traces(chain=True), factor=st.floats(1.0, 8.0))
def test_more_bandwidth_never_slower_for_a_chain(cm384, tr: Trace, factor: float) -> None:  # noqa: ANN001
    fast = _faster_fabric(cm384, factor)
    for preset in ("hccl", "stratacl"):
        slow_t = simulate(tr, make_library(cm384, preset)).makespan_s
        fast_t = simulate(tr, make_library(fast, preset)).makespan_s
        assert fast_t <= slow_t * (1 + 1e-12)


def _benchmark_trace(n_ops: int) -> Trace:
    """The engine benchmark's synthetic mix (compute, staged copies, group and world collectives, p2p)."""
    return load_script(ROOT / "benchmarks" / "bench_engine.py").synthetic_trace(n_ops, world=768)


def test_deterministic_replay(cm384) -> None:  # noqa: ANN001
    tr = _benchmark_trace(2000)
    lib = make_library(cm384, "hccl")
    a, b = simulate(tr, lib), simulate(tr, lib)
    assert (a.end == b.end).all() and a.makespan_s == b.makespan_s


def test_solve_memo_only_saves_solver_time(cm384, monkeypatch) -> None:  # noqa: ANN001
    """With the memo off (cap 0) every shared component is solved afresh: the same start and end
    of every op, while the memo did serve repeated components."""
    tr = _benchmark_trace(1500)
    lib = make_library(cm384, "hccl")
    fills: list[int] = []
    fill = fluid.FluidSystem._fill
    monkeypatch.setattr(fluid.FluidSystem, "_fill", lambda self, comp: (fills.append(1), fill(self, comp))[1])
    memo = simulate(tr, lib)
    with_memo = len(fills)
    monkeypatch.setattr(fluid, "SOLVE_MEMO_MAX_ENTRIES", 0)
    fresh = simulate(tr, lib)
    assert len(fills) - with_memo > with_memo  # the memo answered most shared solves
    np.testing.assert_allclose(fresh.start, memo.start, rtol=1e-12, atol=0)
    np.testing.assert_allclose(fresh.end, memo.end, rtol=1e-12, atol=0)


@SETTINGS
@given(tr=traces(chain=True), aic=st.integers(1, 24), aiv=st.integers(2, 48))
def test_a_core_limit_never_speeds_a_chain_up(cm384, tr: Trace, aic: int, aiv: int) -> None:  # noqa: ANN001
    tr.limit_stream("s", aic, aiv)  # every op of the chain runs on stream "s"
    for preset in ("hccl", "stratacl_no_sdma"):
        split = simulate(tr, make_library(cm384, preset, stream_core_split=True), check=True)
        whole = simulate(tr, make_library(cm384, preset, stream_core_split=False), check=True)
        assert split.max_violation < 1e-9 and split.work_error < 1e-7
        assert whole.makespan_s <= split.makespan_s * (1 + 1e-12)


def test_replay_restores_the_garbage_collector(cm384) -> None:  # noqa: ANN001
    """The replay pauses the cyclic collector while it runs; it must come back on afterwards,
    also when the replay fails, and stay off if the caller had it off."""
    import gc

    import pytest

    from stratacl.errors import TraceError
    from stratacl.trace import Trace

    lib = make_library(cm384, "hccl")
    tr = Trace(world_size=2)
    tr.compute((0, 1), flops=1e9)
    assert gc.isenabled()
    simulate(tr, lib)
    assert gc.isenabled()
    bad = Trace(world_size=2)  # a mixed kernel on a stream left 1 AIV fails while replaying
    bad.limit_stream("s", 1, 1)
    bad.compute((0, 1), flops=1e9, vector_flops=1e6, core="mixed", stream="s")
    with pytest.raises(TraceError, match="leaves no mixed core"):
        simulate(bad, lib)
    assert gc.isenabled()
    gc.disable()
    try:
        simulate(tr, lib)
        assert not gc.isenabled()
    finally:
        gc.enable()
