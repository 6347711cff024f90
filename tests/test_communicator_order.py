"""Communicator semantics (engine/order.py): collectives on one communicator run one at a time in
issue order, whatever stream issued them; different communicators run concurrently. Closed forms
on an idle fabric: a serialized pair takes the sum of the two collectives' times alone."""

from __future__ import annotations

import pytest
from helpers import make_library

from stratacl.config import DataPath, Mover
from stratacl.engine.order import communicator_predecessors
from stratacl.engine.replay import simulate
from stratacl.errors import TraceError
from stratacl.trace import Trace

SIZE = 64 * 2**20
WORLD = 8


@pytest.fixture(scope="module")
def lib(cm384_ideal):  # noqa: ANN001, ANN201
    return make_library(cm384_ideal, "hccl", data_path=DataPath.pool, mover=Mover.sdma)


def _alone_s(lib, coll: str, group: tuple[int, ...]) -> float:  # noqa: ANN001
    return sum(p.standalone_s() for p in lib.collective_phases(coll, SIZE, group))


def _trace(*comms: str) -> Trace:
    tr = Trace(world_size=WORLD)
    for fam in ("w", "v"):
        tr.add_family(fam, [range(WORLD)])
    tr.add_family("g", [range(4), range(4, 8)])
    for i, comm in enumerate(comms):  # each on its own stream: only the communicator orders them
        tr.collective("allgather" if i % 2 == 0 else "reducescatter", comm, SIZE, stream=f"s{i}")
    tr.validate()
    return tr


def test_a_serialized_pair_takes_the_sum_of_its_times(lib) -> None:  # noqa: ANN001
    res = simulate(_trace("w", "w"), lib, check=True)
    t_ag, t_rs = _alone_s(lib, "allgather", tuple(range(WORLD))), _alone_s(lib, "reducescatter", tuple(range(WORLD)))
    assert res.start[0] == 0.0 and res.end[0] == pytest.approx(t_ag, rel=1e-12)
    assert res.start[1] == pytest.approx(t_ag, rel=1e-12)  # issued second: waits for the first
    assert res.makespan_s == pytest.approx(t_ag + t_rs, rel=1e-12)


def test_two_communicators_run_concurrently(lib) -> None:  # noqa: ANN001
    res = simulate(_trace("w", "v"), lib, check=True)
    assert res.start[0] == res.start[1] == 0.0  # both start at once and share the ports
    t_sum = _alone_s(lib, "allgather", tuple(range(WORLD))) + _alone_s(lib, "reducescatter", tuple(range(WORLD)))
    assert res.end[0] > _alone_s(lib, "allgather", tuple(range(WORLD))) * (1 + 1e-6)  # slowed by sharing
    assert res.makespan_s < t_sum


def test_order_is_per_communicator_of_a_family(lib) -> None:  # noqa: ANN001
    """An op on family g runs on g[0] and g[1]: g[1]'s next op waits for it on g[1]'s ranks only, and
    an op on g[0] issued after that waits for the family op, not for the g[1] op."""
    tr = _trace("g", "g[1]", "g[0]")
    assert [list(p) for p in communicator_predecessors(tr)] == [[], [0], [0]]
    res = simulate(tr, lib, check=True)
    assert res.start[1] == pytest.approx(res.end[0]) and res.start[2] == pytest.approx(res.end[0])
    assert res.start[2] < res.end[1]  # g[0] and g[1] overlap: different communicators


def test_deps_against_issue_order_are_a_cycle(lib) -> None:  # noqa: ANN001
    tr = Trace(world_size=WORLD)
    tr.add_family("w", [range(WORLD)])
    # the first-issued collective waits for the second: a real job hangs
    tr.collective("allgather", "w", SIZE, stream="a", deps=[1])
    tr.collective("allgather", "w", SIZE, stream="b")
    tr.validate()  # deps and stream order alone have no cycle
    with pytest.raises(TraceError, match="communicator issue order"):
        simulate(tr, lib)


def test_p2p_and_compute_are_not_ordered_by_communicators() -> None:
    tr = _trace("w")
    tr.add("p2p", [0, 1], src=[0], dst=[1], nbytes=1e6, stream="p")
    tr.compute(range(WORLD), flops=1e9, stream="c")
    assert [list(p) for p in communicator_predecessors(tr)] == [[], [], []]


def test_overlapping_groups_of_one_family_are_separate_communicators() -> None:
    """An imported trace names its process groups pg[k] (one family) and they share ranks: pg[1] and
    pg[2] both hold rank 0, yet are two communicators, so only pg[1]'s second op waits (for its first)."""
    tr = Trace(world_size=4)
    tr.add_communicator("pg[1]", (0, 1))
    tr.add_communicator("pg[2]", (0, 2))
    for i, comm in enumerate(("pg[1]", "pg[2]", "pg[1]")):
        tr.collective("allreduce", comm, SIZE, stream=f"s{i}")
    tr.validate()
    assert [list(p) for p in communicator_predecessors(tr)] == [[], [], [0]]
