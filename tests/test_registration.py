"""One registration model: the trace replay (stratacl/comm/registration.py) drives the same
registration-on-allocation queue and cost as the allocator's events (stratacl/memory). Expected
waits are worked out by hand from the presets' 8 µs base + 10.8 µs per peer (REFERENCE §3)."""

from __future__ import annotations

import pytest
from helpers import make_library
from hypothesis import given, settings
from hypothesis import strategies as st

from stratacl.engine.replay import simulate
from stratacl.memory import GiB, MemEvent, MiB, RegistrationCost, RegistrationOnAllocation
from stratacl.trace import Trace


@pytest.fixture(scope="module")
def cm384(cm384_ideal):  # noqa: ANN001, ANN201
    """These tests check the engine's sharing with closed forms that price compute as the ideal
    kernel (roofline); the achieved-throughput kernel model is tested in test_kernel_model.py."""
    return cm384_ideal

US = 1e-6
C31 = 342.8 * US  # 8 + 31 × 10.8 µs: one registration with the 31 peers of a 32-rank group


def _alloc_then_use(lib, n: int, gap_s: float, sizes: dict[str, float], concurrent: bool = False):  # noqa: ANN001, ANN202
    """One op of `gap_s` allocating every buffer of `sizes`, then an allgather on each (one after
    the other, or all at once on their own streams and communicators: collectives on one
    communicator run one at a time)."""
    tr = Trace(world_size=n)
    tr.add_family("g", [range(n)])
    for i in range(len(sizes)):
        tr.add_family(f"g{i}", [range(n)])
    alloc = tr.compute(range(n), flops=lib.fabric.cube_flops * gap_s)
    prev = [alloc]
    for i, (name, nbytes) in enumerate(sizes.items()):
        tr.add_buffer(name, alloc_op=alloc)
        op = tr.collective("allgather", f"g{i}" if concurrent else "g", nbytes, buffer=name,
                           deps=[alloc] if concurrent else prev,
                           stream=f"c{i}" if concurrent else "comm")
        prev = [op]
    return simulate(tr, lib)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(2, 64), nbytes=st.integers(1, 256 * MiB), gap_us=st.floats(0.0, 800.0))
def test_the_replay_charges_what_the_allocator_side_job_has_left(cm384, n, nbytes, gap_us) -> None:  # noqa: ANN001
    """Property: a buffer the allocator maps at t=0 and a collective uses at `gap`: the replay's
    registration wait equals what is left at `gap` of the job the allocator's map event queued."""
    lib = make_library(cm384, "stratacl")
    gap = gap_us * US
    replay = _alloc_then_use(lib, n, gap, {"x": float(nbytes)})
    die = lib.die_memory(64 * GiB, n - 1)
    b = die.alloc("x", nbytes, 0.0)
    assert replay.split["register"][1] == pytest.approx(die.registrar.wait_s(b.addr, b.requested, gap), abs=1e-15)


def test_two_maps_in_one_cost_window_queue_on_the_worker(cm384) -> None:  # noqa: ANN001
    """Two buffers mapped by one op at t=0: one worker registers x over [0, c], then y over [c, 2c].
    x used at 100 µs waits c - 100 µs; y, used when x's allgather ends (t_x), waits 2c - t_x."""
    lib = make_library(cm384, "stratacl")
    res = _alloc_then_use(lib, 32, 100 * US, {"x": 2**20, "y": 2**20})
    assert res.split["register"][1] == pytest.approx(242.8 * US, rel=1e-9)
    t_x = res.end[1]
    assert C31 < t_x < 2 * C31  # x's allgather ends inside y's registration
    assert res.split["register"][2] == pytest.approx(2 * C31 - t_x, rel=1e-9)


def test_the_barrier_fallback_caps_a_wait_at_a_synchronous_registration(cm384) -> None:  # noqa: ANN001
    """Both buffers used at once at 10 µs: y's job would end at 2c, 2c - 10 µs away; the fallback
    registers y synchronously instead, c."""
    lib = make_library(cm384, "stratacl")
    res = _alloc_then_use(lib, 32, 10 * US, {"x": 2**20, "y": 2**20}, concurrent=True)
    assert res.split["register"][1] == pytest.approx(332.8 * US, rel=1e-9)
    assert res.split["register"][2] == pytest.approx(C31, rel=1e-9)


def test_allocator_side_queue_and_fallback_by_hand() -> None:
    """Maps at 0 and 50 µs, 180.8 µs each (8 + 16 × 10.8): jobs [0, 180.8] and [180.8, 361.6]."""
    roa = RegistrationOnAllocation(RegistrationCost(base_us=8.0, per_peer_us=10.8), 16)
    for addr, t in ((0, 0.0), (1 << 30, 50 * US)):
        roa.on_event(_map(addr, 20 * MiB, t))
    assert [t / US for j in roa.jobs for t in (j.start, j.done)] == pytest.approx([0.0, 180.8, 180.8, 361.6])
    assert roa.wait_s(1 << 30, MiB, 100 * US) == pytest.approx(180.8 * US)  # 261.6 left: fallback
    assert roa.wait_s(1 << 30, MiB, 200 * US) == pytest.approx(161.6 * US)  # the job's rest
    assert roa.wait_s(0, MiB, 200 * US) == 0.0 and roa.fallbacks == 1


def test_page_cost_counts_whole_pages() -> None:
    cost = RegistrationCost(base_us=8.0, per_peer_us=10.0, per_page_us=1.0, page_bytes=2 * MiB)
    assert cost.of(2 * MiB, 4) == pytest.approx(52 * US)  # one page: 8 + 4 peers × (10 + 1) µs
    assert cost.of(2 * MiB + 1, 4) == pytest.approx(56 * US)  # two pages: 8 + 4 × (10 + 2) µs
    assert cost.of(0, 4) == cost.of(MiB, 0) == 0.0


def _map(addr: int, size: int, t: float) -> MemEvent:
    return MemEvent("map", addr, size, t, 0, False, False)
