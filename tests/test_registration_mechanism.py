"""One registration-mechanism protocol (`Registrar`, stratacl/memory/mechanism.py) driven by the
device allocator's events (`DieMemory`), a trace replay (`RegistrationState` / `LibraryRuntime`)
and the serving memory model (`ServingDie`). A third mechanism defined here, in this file only,
runs through all three; the JIT cache and registration-on-allocation keep their closed forms."""

from __future__ import annotations

import copy

import pytest
from helpers import make_library
from hypothesis import given, settings
from hypothesis import strategies as st
from test_llm_infer import Env

from stratacl.comm.datapath import DataPathModel
from stratacl.comm.library import LibraryRuntime
from stratacl.config import DataPath, JitMatch
from stratacl.engine.replay import simulate
from stratacl.machine.fabric import Fabric
from stratacl.memory import (
    AllocatorConfig,
    CachingAllocator,
    DieMemory,
    GiB,
    JitRegistrationCache,
    MemEvent,
    MiB,
    NoRegistration,
    Registrar,
    RegistrationCost,
    RegistrationOnAllocation,
)
from stratacl.trace import REGISTERED, Trace

US = 1e-6
COST = RegistrationCost(base_us=8.0, per_peer_us=10.8)
FIXED_S = 300 * US


class FixedAtMap(Registrar):
    """A third mechanism: each range the allocator maps (each trace buffer, when its allocating
    op starts) is registered once, `cost_s` after the map and off the critical path; a use waits
    for what is left of it. Unmapping forgets the range."""

    def __init__(self, cost_s: float) -> None:
        self.cost_s = cost_s
        self.ranges: dict[int, tuple[int, float]] = {}  # start -> (end, ready time)
        self.buffers: dict[str, float] = {}  # trace buffer -> ready time
        self.mapped = 0

    def on_event(self, ev: MemEvent) -> None:
        if ev.kind == "map":
            self.mapped += 1
            self.ranges[ev.addr] = (ev.addr + ev.size, ev.t + self.cost_s)
        else:
            end = ev.addr + ev.size
            self.ranges = {a: r for a, r in self.ranges.items() if not (a < end and r[0] > ev.addr)}

    def wait_s(self, addr: int, size: int, t: float) -> float:
        ready = max((r for a, (e, r) in self.ranges.items() if a < addr + size and e > addr), default=-1.0)
        return max(0.0, ready - t)

    def buffer_wait_s(self, name: str, nbytes: float, peers: int, now: float, mapped_at: float | None) -> float:
        if mapped_at is not None:
            self.buffers.setdefault(name, mapped_at + self.cost_s)
        return max(0.0, self.buffers.get(name, -1.0) - now)


class FixedAtUse(FixedAtMap):
    """The same, except that the first use of each (address, size) pays `cost_s` on its path."""

    pays_at_use = True

    def __init__(self, cost_s: float) -> None:
        super().__init__(cost_s)
        self.used: set[tuple[int, int]] = set()
        self.calls = self.paid = 0

    def wait_s(self, addr: int, size: int, t: float) -> float:
        self.calls += 1
        if (addr, size) in self.used:
            return 0.0
        self.used.add((addr, size))
        self.paid += 1
        return self.cost_s


class FixedAtMapPath(DataPathModel):
    """A zero-copy data path whose registrar is `FixedAtMap` (or `mechanism`)."""

    mechanism: type[FixedAtMap] = FixedAtMap

    def registrar(self, cost: RegistrationCost, peers: int) -> Registrar:
        return self.mechanism(FIXED_S)


class FixedAtUsePath(FixedAtMapPath):
    mechanism = FixedAtUse


@pytest.fixture(scope="module")
def cm384(cm384_ideal: Fabric) -> Fabric:
    """Compute priced as the roofline, so the allocating op's duration is the closed form's gap."""
    return cm384_ideal


def _with_path(lib, path: type[DataPathModel]):  # noqa: ANN001, ANN202
    """A copy of library `lib` whose data path is `path`."""
    out = copy.copy(lib)
    out.path = path(lib.cfg)
    return out


# ----------------------------------------------------------------------------- a third mechanism

def test_a_third_mechanism_hears_the_die_memorys_map_and_unmap_events() -> None:
    reg = FixedAtMap(FIXED_S)
    mem = DieMemory(CachingAllocator(AllocatorConfig(GiB, expandable_segments=False)), reg)
    assert mem.registrar is reg
    x = mem.alloc("x", 30 * MiB, 1.0)
    assert reg.mapped == mem.maps == 1
    assert reg.wait_s(x.addr, x.requested, 1.0) == pytest.approx(FIXED_S)
    assert reg.wait_s(x.addr, x.requested, 1.0 + FIXED_S / 3) == pytest.approx(2 * FIXED_S / 3)
    assert reg.wait_s(x.addr, x.requested, 1.0 + FIXED_S) == 0.0
    y = mem.alloc("y", MiB, 2.0)  # the small pool: a segment of its own
    assert reg.mapped == mem.maps == 2 and len(reg.ranges) == 2
    mem.free("x", 3.0)
    mem.allocator.empty_cache(3.0)  # x's segment is unmapped: its registration goes with it
    assert list(reg.ranges) == [y.addr & ~(2 * MiB - 1)] and reg.wait_s(x.addr, x.requested, 1.0) == 0.0


def test_a_third_mechanism_drives_the_trace_replay(cm384: Fabric) -> None:
    """Buffer x is allocated by an op of `gap` from t=0 and used by an allgather right after it:
    the fixed registration started at 0 leaves FIXED - gap; its second use and the buffers
    allocated before the trace (registered or not) wait for nothing."""
    lib = _with_path(make_library(cm384, "hccl", data_path=DataPath.jit_register), FixedAtMapPath)
    gap = 100 * US
    n = 8
    tr = Trace(world_size=n)
    tr.add_family("g", [range(n)])
    alloc = tr.compute(range(n), flops=lib.fabric.cube_flops * gap)
    tr.add_buffer("x", alloc_op=alloc)
    tr.add_buffer("warm", -1)
    tr.add_buffer("cached", REGISTERED)
    first = tr.collective("allgather", "g", MiB, buffer="x", deps=[alloc])
    second = tr.collective("allgather", "g", MiB, buffer="x", deps=[first])
    others = [tr.collective("allgather", "g", MiB, buffer=b, deps=[second]) for b in ("warm", "cached")]
    assert isinstance(LibraryRuntime(lib, tr).registration.registrar, FixedAtMap)
    res = simulate(tr, lib)
    assert res.start[first] == pytest.approx(gap, rel=1e-9)
    assert res.split["register"][first] == pytest.approx(FIXED_S - gap, rel=1e-9)
    assert [res.split["register"][o] for o in (second, *others)] == [0.0, 0.0, 0.0]


def test_a_third_mechanism_drives_the_serving_die_by_its_map_events() -> None:
    """A registrar that does not pay at use hears every map event of the serving die (start-up and
    iterations) and is never shown a use: the die reports no lookups."""
    env = Env()
    env.ctx.libraries["fixed_at_map"] = _with_path(env.ctx.libraries["hccl_jit"], FixedAtMapPath)
    die = env.serving.dies("fixed_at_map", "decode", False)[0]
    reg = die.mem.registrar
    assert isinstance(reg, FixedAtMap)
    mapped0 = reg.mapped
    steps = [die.step(1.0 + k, b, 4 * b) for k, b in enumerate((4, 64, 300, 4))]
    assert reg.mapped == die.mem.maps == die.maps
    assert reg.mapped - mapped0 == sum(s.maps for s in steps) > 0
    assert sum(s.lookups for s in steps) == 0


def test_a_registrar_that_pays_at_use_is_shown_every_use_of_the_serving_die() -> None:
    """Paying at use, it is shown each dispatch / combine receive buffer, repeated (quiet) blocks
    included; the die's misses are exactly the uses it charged."""
    env = Env()
    env.ctx.libraries["fixed_at_use"] = _with_path(env.ctx.libraries["hccl_jit"], FixedAtUsePath)
    die = env.serving.dies("fixed_at_use", "decode", False)[0]
    reg = die.mem.registrar
    assert isinstance(reg, FixedAtUse)
    calls0, paid0 = reg.calls, reg.paid
    steps = [die.step(1.0 + k, 8, 32) for k in range(4)]
    assert sum(s.lookups for s in steps) == reg.calls - calls0 > 0
    assert sum(s.misses for s in steps) == reg.paid - paid0
    assert steps[-1].maps == 0 and steps[-1].lookups == steps[0].lookups  # a quiet step is still shown


# ----------------------------------------------------------------------------- the mechanisms we have

def test_each_data_path_makes_a_fresh_registrar(cm384: Fabric) -> None:
    kinds = {DataPath.staged: NoRegistration, DataPath.pool: NoRegistration,
             DataPath.jit_register: JitRegistrationCache, DataPath.on_alloc: RegistrationOnAllocation}
    for path, kind in kinds.items():
        lib = make_library(cm384, "hccl", data_path=path)
        a, b = lib.path.registrar(COST, 15), lib.path.registrar(COST, 15)
        assert type(a) is kind and a is not b
        assert type(lib.die_memory(GiB, 15).registrar) is kind


def test_jit_registrar_costs_the_closed_form_and_a_hit_costs_nothing() -> None:
    alloc = CachingAllocator(AllocatorConfig(GiB))
    jit = JitRegistrationCache(COST, 15, match=JitMatch.exact).attach(alloc)
    b = alloc.malloc(4 * MiB, 0.0)
    assert jit.wait_s(b.addr, b.requested, 0.0) == pytest.approx((8.0 + 15 * 10.8) * US)
    assert jit.wait_s(b.addr, b.requested, 1.0) == 0.0
    assert (jit.hits, jit.misses) == (1, 1)
    # by buffer name, with the collective's own peers; when it was mapped does not matter
    assert jit.buffer_wait_s("x", MiB, 7, 0.0, None) == pytest.approx((8.0 + 7 * 10.8) * US)
    assert jit.buffer_wait_s("x", MiB, 7, 1.0, 0.5) == 0.0
    assert jit.buffer_wait_s("x", 2 * MiB, 7, 2.0, 1.5) == pytest.approx((8.0 + 7 * 10.8) * US)  # new size


def test_on_alloc_registrar_by_name_waits_for_the_rest_of_its_job() -> None:
    """With 15 peers c = 8 + 15 × 10.8 = 170 µs. x mapped at 0, used at 100 µs: c - 100 µs left;
    y mapped at 0 queues behind x, ready at 2c: used at c + 10 µs it waits c - 10 µs; a buffer
    allocated before the trace is ready."""
    c = (8.0 + 15 * 10.8) * US
    roa = RegistrationOnAllocation(COST, 0)
    assert roa.buffer_wait_s("x", MiB, 15, 100 * US, 0.0) == pytest.approx(c - 100 * US)
    assert roa.buffer_wait_s("y", MiB, 15, c + 10 * US, 0.0) == pytest.approx(c - 10 * US)
    assert roa.buffer_wait_s("x", MiB, 15, c, 0.0) == 0.0  # the same mapping: no second job
    assert roa.buffer_wait_s("warm", MiB, 15, 0.0, None) == 0.0
    assert len(roa.jobs) == 2 and roa.fallbacks == 0


@settings(max_examples=40, deadline=None)
@given(uses=st.lists(st.tuples(st.integers(1, 64 * MiB), st.floats(0.0, 1e-3), st.floats(0.0, 1e-3),
                               st.integers(1, 63)), min_size=1, max_size=12))
def test_on_alloc_waits_never_exceed_a_synchronous_registration(uses) -> None:  # noqa: ANN001
    """Property: whatever the queue, a use waits at most what registering its buffer then would
    take (the barrier fallback), and nothing once its job is done."""
    roa = RegistrationOnAllocation(COST, 0)
    for i, (nbytes, mapped_at, delay, peers) in enumerate(uses):
        wait = roa.buffer_wait_s(f"b{i}", nbytes, peers, mapped_at + delay, mapped_at)
        assert 0.0 <= wait <= COST.of(nbytes, peers) + 1e-15
        assert roa.buffer_wait_s(f"b{i}", nbytes, peers, roa.jobs[-1].done, mapped_at) == 0.0


def test_no_registration_waits_for_nothing() -> None:
    mem = DieMemory(CachingAllocator(AllocatorConfig(GiB)))
    assert isinstance(mem.registrar, NoRegistration)
    b = mem.alloc("x", 30 * MiB, 0.0)
    assert mem.maps == 1 and mem.registrar.wait_s(b.addr, b.requested, 0.0) == 0.0
    assert mem.registrar.buffer_wait_s("x", MiB, 15, 0.0, 0.0) == 0.0
