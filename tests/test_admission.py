"""HCCL's bound on operators in flight (REFERENCE §3): AI_CPU mode ≤ 6 graphs per card, AIV mode one per die.

Eight identical small all-reduces on eight communicators over the same card (dies 0 and 1), each on
its own stream so that nothing but the library orders them: latency-bound, so operators that run
together end together and operators that wait end one operator time later.
"""

from __future__ import annotations

import numpy as np
import pytest

from stratacl.engine.admission import Admission
from stratacl.engine.replay import simulate
from stratacl.machine.lowering import Concurrency
from stratacl.trace import Trace
from stratacl.validate.ascend import library_model

N, SIZE = 8, 64 * 1024.0


def _trace(groups: list[tuple[int, ...]]) -> Trace:
    tr = Trace(world_size=8)
    for k, g in enumerate(groups):
        tr.add_family(f"c{k}", [g])
        tr.collective("allreduce", f"c{k}", SIZE, stream=f"s{k}")
    return tr


def _run(library: str, groups: list[tuple[int, ...]], *overrides: str):
    return simulate(_trace(groups), library_model(library, "", tuple(overrides)))


def _waits(res) -> np.ndarray:
    """Each op's wait for a slot: its launch time beyond the fastest op's (all ops are identical)."""
    launch = res.split["launch"]
    return launch - launch.min()


def test_aicpu_mode_runs_six_graphs_per_card_and_queues_the_rest() -> None:
    same_card = [(0, 1)] * N
    res = _run("hccl", same_card)
    free = _run("hccl", same_card, "library.hccl.aicpu_graphs_per_card=100")
    assert np.allclose(_waits(free), 0.0)
    waits = _waits(res)
    first, late = np.flatnonzero(waits < 1e-12), np.flatnonzero(waits > 1e-12)
    assert first.size == 6 and late.size == 2  # six start at once
    # the first six run as six alone would; the last two start when they end and then run as two alone
    six, two = (float(_run("hccl", [(0, 1)] * k).end.max()) for k in (6, 2))
    assert np.allclose(res.end[first], six, rtol=1e-9)
    assert np.allclose(waits[late], six, rtol=1e-9)
    assert np.allclose(res.end[late], six + two, rtol=1e-9)
    assert res.end.max() > free.end.max()
    # time accounting: an op's phases and its wait sum to its span
    total = sum(res.split[c] for c in res.split)
    assert np.allclose(total, res.end - res.start, rtol=1e-9, atol=1e-12)


def test_the_limit_is_per_card() -> None:
    """One operator on each of four cards (and none waits), though each card allows only one."""
    res = _run("hccl", [(0, 1), (2, 3), (4, 5), (6, 7)], "library.hccl.aicpu_graphs_per_card=1")
    assert np.allclose(_waits(res), 0.0)


def test_aiv_mode_has_no_multi_communicator_concurrency() -> None:
    """Two communicators sharing die 1: the second waits for the first; a third on dies 2-3 does not."""
    res = _run("hccl", [(0, 1), (1, 2), (3, 4)], "library.hccl.expansion_mode=aiv")
    assert res.start[1] == 0.0 and res.start[0] == 0.0
    waits = res.split["launch"] - res.split["launch"][0]
    assert waits[1] == pytest.approx(res.end[0], rel=1e-9)
    assert waits[2] == pytest.approx(0.0, abs=1e-12)


def test_a_device_driven_library_has_no_such_bound() -> None:
    res = _run("stratacl", [(0, 1)] * N)
    assert np.allclose(_waits(res), 0.0)
    assert library_model("stratacl").op_concurrency() is None


def test_a_waiter_keeps_its_place_on_its_units() -> None:
    """First come, first served per unit: a later operator may not overtake a waiter on a shared unit."""
    adm = Admission(Concurrency(1, 2, "test"), world_size=8)
    assert adm.admit(0, (0, 1, 2, 3))  # cards 0, 1
    assert not adm.admit(1, (2, 3, 4, 5))  # waits on card 1
    assert not adm.admit(2, (4, 5))  # card 2 is free, but op 1 waits for it first
    assert adm.admit(3, (6, 7))  # disjoint from every waiter
    assert adm.release(0) == [1]  # op 1 takes cards 1 and 2; op 2 still waits for card 2
    assert adm.release(1) == [2]
    assert adm.waiting == 0
