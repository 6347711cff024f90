"""The counterfactual split of a replay's time (stratacl/engine/counterfactual.py) on closed-form traces."""

from __future__ import annotations

import pytest
from helpers import make_library

from stratacl.engine import counterfactual as cf
from stratacl.engine.replay import Replay, simulate
from stratacl.trace import Trace


def _serial(fab, nbytes: int = 1 << 20) -> Trace:  # noqa: ANN001
    tr = Trace(world_size=8)
    tr.add_family("world", [range(8)])
    c = tr.compute(range(8), flops=fab.cube_flops * 1e-3, core="cube")  # 1 ms of cube work
    tr.collective("allreduce", "world", nbytes, deps=[c])
    return tr


def _exposed(s: cf.Split) -> float:
    return sum(s.terms[t] for t in cf.EXPOSED)


def test_serial_compute_then_collective_splits_into_the_compute_and_the_collective(cm384_ideal) -> None:  # noqa: ANN001
    lib = make_library(cm384_ideal, "stratacl")
    tr = _serial(cm384_ideal)
    res = simulate(tr, lib)
    s = cf.split(tr, lib, res, cf.end_of(None))
    coll_t = res.end[1] - res.start[1]
    assert s.total_s == pytest.approx(res.makespan_s)
    assert s.terms["compute"] == pytest.approx(1e-3)  # the compute critical path
    assert _exposed(s) == pytest.approx(coll_t)  # nothing hides the collective
    assert s.terms["contention"] == pytest.approx(0.0, abs=1e-12)  # one op at a time shares nothing
    # the exposed part is the collective's own phase split
    for c in cf.EXPOSED:
        assert s.terms[c] == pytest.approx(res.split[c][1], rel=1e-9, abs=1e-15)
    assert sum(s.terms.values()) == pytest.approx(s.total_s)


def test_hidden_communication_is_not_exposed(cm384_ideal) -> None:  # noqa: ANN001
    # a small collective on its own stream beside 1 ms of compute: the window is the compute's
    lib = make_library(cm384_ideal, "stratacl")
    tr = Trace(world_size=8)
    tr.add_family("world", [range(8)])
    tr.compute(range(8), flops=cm384_ideal.cube_flops * 1e-3, core="cube", stream="main")
    tr.collective("allreduce", "world", 64 << 10, stream="comm")
    s = cf.split(tr, lib, simulate(tr, lib), cf.end_of(None))
    assert s.terms["compute"] == pytest.approx(1e-3)
    assert _exposed(s) == pytest.approx(0.0, abs=1e-12)


def test_concurrent_collectives_sharing_ports_are_contention(cm384_ideal) -> None:  # noqa: ANN001
    # two 256 MiB all-gathers on two communicators of the same 8 dies, issued together: each alone
    # takes t1; sharing the ports they take ~2·t1 (max-min), so the split names ~t1 as contention
    lib = make_library(cm384_ideal, "stratacl")
    one = Trace(world_size=8)
    one.add_family("a", [range(8)])
    one.collective("allgather", "a", 256 << 20)
    t1 = simulate(one, lib).makespan_s
    tr = Trace(world_size=8)
    tr.add_family("a", [range(8)])
    tr.add_family("b", [range(8)])
    tr.collective("allgather", "a", 256 << 20, stream="s0")
    tr.collective("allgather", "b", 256 << 20, stream="s1")
    res = simulate(tr, lib)
    s = cf.split(tr, lib, res, cf.end_of(None))
    assert s.terms["compute"] == 0.0
    assert _exposed(s) == pytest.approx(t1, rel=1e-6)  # on an idle fabric they run side by side
    assert s.terms["contention"] == pytest.approx(res.makespan_s - t1, rel=1e-6)
    assert s.terms["contention"] > 0.5 * t1


def test_two_libraries_difference_is_the_difference_of_their_splits(cm384_ideal) -> None:  # noqa: ANN001
    tr = _serial(cm384_ideal, 8 << 20)
    splits = {}
    for name in ("hccl", "stratacl"):
        lib = make_library(cm384_ideal, name)
        splits[name] = cf.split(tr, lib, simulate(tr, lib), cf.end_of(None))
    d = splits["stratacl"].minus(splits["hccl"])
    assert d.total_s != 0.0
    assert sum(d.terms.values()) == pytest.approx(d.total_s, rel=1e-9)
    assert d.terms["compute"] == pytest.approx(0.0, abs=1e-12)  # the same compute either way


def test_a_span_measures_the_selected_ops_only(cm384_ideal) -> None:  # noqa: ANN001
    lib = make_library(cm384_ideal, "stratacl")
    tr = _serial(cm384_ideal)
    res = simulate(tr, lib)
    only_compute = cf.split(tr, lib, res, cf.end_of(res.kinds == "compute"))
    assert only_compute.total_s == pytest.approx(1e-3)
    assert only_compute.terms["compute"] == pytest.approx(1e-3)


def test_unknown_comm_mode_is_refused(cm384_ideal) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="comm="):
        Replay(_serial(cm384_ideal), make_library(cm384_ideal, "stratacl"), comm="free")
