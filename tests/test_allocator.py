"""Per-die caching allocator (PyTorch semantics) and the registration mechanisms its events drive."""

from __future__ import annotations

import contextlib
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stratacl.config import JitMatch
from stratacl.errors import ConfigError
from stratacl.memory import (
    AllocatorConfig,
    CachingAllocator,
    DieMemory,
    GiB,
    JitRegistrationCache,
    MemEvent,
    MiB,
    OutOfMemoryError,
    RegistrationCost,
    RegistrationOnAllocation,
    allocation_size,
    round_size,
)

COST = RegistrationCost(base_us=8.0, per_peer_us=10.8)
PEERS = 16
ONE_REG = 180.8e-6  # 8 µs + 16 peers × 10.8 µs


def make(expandable: bool = False, capacity: int = 64 * GiB, **kw) -> tuple[CachingAllocator, list[MemEvent]]:
    a = CachingAllocator(AllocatorConfig(capacity, expandable_segments=expandable, **kw))
    events: list[MemEvent] = []
    a.subscribe(events.append)
    return a, events


# ----------------------------------------------------------------------------- sizes


def test_rounding_and_segment_sizes_follow_pytorch_constants():
    assert [round_size(n) for n in (1, 511, 512, 513, 1025)] == [512, 512, 512, 1024, 1536]
    assert round_size(MiB) == MiB
    assert allocation_size(512) == allocation_size(MiB) == 2 * MiB  # small pool: 2 MiB segments
    assert allocation_size(MiB + 512) == allocation_size(10 * MiB - 512) == 20 * MiB  # 1-10 MiB
    assert allocation_size(10 * MiB) == 10 * MiB
    assert allocation_size(10 * MiB + 512) == 12 * MiB  # rounded up to 2 MiB
    a, ev = make()
    b = a.malloc(1000)
    assert b.size == 1024 and b.requested == 1000
    assert a.stats.allocated_bytes == 1024 and a.stats.requested_bytes == 1000
    assert a.stats.reserved_bytes == 2 * MiB and ev[0].small


def test_small_requests_pack_into_2mib_segments():
    a, ev = make()
    blocks = [a.malloc(512) for _ in range(4096)]
    assert len(ev) == 1 and a.stats.reserved_bytes == 2 * MiB
    assert [b.addr - blocks[0].addr for b in blocks[:3]] == [0, 512, 1024]
    a.malloc(512)
    assert len(ev) == 2 and a.stats.reserved_bytes == 4 * MiB
    a.check_invariants()


def test_zero_byte_request_allocates_nothing():
    a, ev = make()
    b = a.malloc(0)
    assert b.size == 0 and not ev and a.stats.allocated_bytes == 0
    a.free(b)


# ----------------------------------------------------------------------------- reuse, split, merge


def test_freed_block_is_reused_at_the_same_address():
    a, ev = make()
    b = a.malloc(30 * MiB)
    addr = b.addr
    a.free(b)
    c = a.malloc(29 * MiB + 600 * 1024)  # remainder 0.4 MiB <= 1 MiB: not split
    assert c.addr == addr and c.size == 30 * MiB and len(ev) == 1
    assert a.stats.allocated_bytes == 30 * MiB  # the unsplit remainder counts as allocated


def test_large_blocks_split_only_above_1mib_remainder_and_merge_back():
    a, ev = make()
    b1 = a.malloc(3 * MiB)  # a 20 MiB segment, split: 17 MiB remainder cached
    b2 = a.malloc(3 * MiB)  # served from the remainder, right after b1
    assert len(ev) == 1 and ev[0].size == 20 * MiB
    assert b2.addr == b1.addr + 3 * MiB
    assert a.cached_bytes() == 14 * MiB
    a.free(b1)
    assert a.cached_bytes() == 17 * MiB and a.inactive_split_bytes() == 17 * MiB
    a.empty_cache()  # the segment is still in use: nothing to release
    assert a.stats.reserved_bytes == 20 * MiB and len(ev) == 1
    a.free(b2)  # merges with both free neighbours into the whole segment
    chain = next(a.segment_blocks())
    assert len(chain) == 1 and chain[0].size == 20 * MiB and not chain[0].allocated
    a.empty_cache()
    assert a.stats.reserved_bytes == 0 and ev[-1].kind == "unmap" and ev[-1].size == 20 * MiB
    assert a.stats.segments == 0


def test_split_rule_large_pool_vs_expandable():
    a, _ = make()
    assert a.malloc(19 * MiB).size == 20 * MiB  # remainder 1 MiB: not > kSmallSize
    assert a.malloc(18 * MiB + 512 * 1024).size == 18 * MiB + 512 * 1024  # 1.5 MiB remainder: split
    e, _ = make(expandable=True)
    assert e.malloc(19 * MiB).size == 19 * MiB  # expandable: any remainder >= 512 B is split


def test_best_fit_takes_the_smallest_cached_block_that_fits():
    a, _ = make()
    blocks = [a.malloc(s * MiB) for s in (60, 40, 30)]
    big, mid, small = (b.addr for b in blocks)
    for b in blocks:
        a.free(b)
    assert a.malloc(35 * MiB).addr == mid
    assert a.malloc(25 * MiB).addr == small
    assert a.malloc(45 * MiB).addr == big


def test_max_split_size_keeps_oversize_blocks_whole():
    a, ev = make(max_split_size=100 * MiB)
    big = a.malloc(200 * MiB)
    a.free(big)
    assert a.malloc(50 * MiB).addr != big.addr and len(ev) == 2  # oversize block not handed out
    c = a.malloc(190 * MiB)  # within 20 MiB of the oversize block: reused whole
    assert c.addr == big.addr and c.size == 200 * MiB


def test_no_room_releases_cached_blocks_then_retries_then_raises():
    a, ev = make(capacity=100 * MiB)
    a.free(a.malloc(60 * MiB))
    b = a.malloc(70 * MiB)  # 60 + 70 > 100: release the cached 60 MiB, retry
    assert a.stats.num_alloc_retries == 1
    assert [(e.kind, e.size // MiB) for e in ev] == [("map", 60), ("unmap", 60), ("map", 70)]
    with pytest.raises(OutOfMemoryError, match="out of memory"):
        a.malloc(40 * MiB)
    assert a.stats.num_ooms == 1 and a.stats.allocated_bytes == b.size
    a.check_invariants()


def test_double_free_and_bad_config_are_rejected():
    a, _ = make()
    b = a.malloc(MiB)
    a.free(b)
    with pytest.raises(ValueError, match="not allocated"):
        a.free(b)
    with pytest.raises(ConfigError, match="capacity_bytes"):
        AllocatorConfig(0)
    with pytest.raises(ConfigError, match="max_split_size"):
        AllocatorConfig(GiB, max_split_size=MiB)


# ----------------------------------------------------------------------------- expandable segments


def test_expandable_segment_grows_by_mapping_pages_in_one_va_range():
    a, ev = make(expandable=True)
    b1 = a.malloc(30 * MiB)
    b2 = a.malloc(30 * MiB)
    assert b2.addr == b1.addr + 30 * MiB  # tiles in the same address range
    assert a.stats.segments == 1 and a.stats.reserved_bytes == 60 * MiB  # 3 pages of 20 MiB
    assert all(e.kind == "map" and e.size % (20 * MiB) == 0 for e in ev)
    assert [e.addr for e in ev] == [ev[0].addr + sum(e.size for e in ev[:i]) for i in range(len(ev))]
    a.free(b1)
    a.empty_cache()  # only the page wholly inside the free 30 MiB is unmapped
    assert a.stats.reserved_bytes == 40 * MiB and ev[-1].kind == "unmap" and ev[-1].size == 20 * MiB
    a.free(b2)
    a.empty_cache()
    assert a.stats.reserved_bytes == 0 and a.stats.segments == 0
    a.check_invariants()


def test_expandable_segment_fills_lowest_address_first():
    a, ev = make(expandable=True)
    b1, b2 = a.malloc(40 * MiB), a.malloc(40 * MiB)
    a.free(b1)
    a.empty_cache()  # unmaps b1's two pages: a hole at the start of the range
    c = a.malloc(40 * MiB)  # remapped into the hole rather than at the end
    assert c.addr == b1.addr and ev[-1].kind == "map" and ev[-1].addr == b1.addr
    assert b2.allocated
    a.check_invariants()


def bulk_iterations(a: CachingAllocator, seed: int, n: int = 60, k: int = 4) -> None:
    """Iterations that each allocate k tensors of random size (10-100 MiB) and free them all."""
    r = random.Random(seed)
    for _ in range(n):
        live = [a.malloc(r.randint(10 * MiB, 100 * MiB)) for _ in range(k)]
        for b in reversed(live):
            a.free(b)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fragmentation_appears_only_with_expandable_segments_off(seed):
    off, _ = make(expandable=False)
    on, _ = make(expandable=True)
    bulk_iterations(off, seed)
    bulk_iterations(on, seed)
    assert off.stats.requested_bytes_peak == on.stats.requested_bytes_peak  # same sequence
    assert on.stats.fragmentation_bytes < 20 * MiB  # at most the unused part of one page
    assert off.stats.fragmentation_bytes > 200 * MiB  # cached segments of stale sizes
    assert off.stats.reserved_bytes_peak > 1.5 * on.stats.reserved_bytes_peak


def test_same_sequence_fits_with_expandable_on_and_not_off():
    on, _ = make(expandable=True)
    bulk_iterations(on, 0)
    capacity = on.stats.reserved_bytes_peak
    fits, _ = make(expandable=True, capacity=capacity)
    bulk_iterations(fits, 0)
    tight, _ = make(expandable=False, capacity=capacity)
    with contextlib.suppress(OutOfMemoryError):
        bulk_iterations(tight, 0)
    assert tight.stats.num_alloc_retries > 0 and fits.stats.num_alloc_retries == 0


def decode_like(a: CachingAllocator, seed: int, iterations: int = 60, layers: int = 6) -> None:
    """Weights and a KV cache at start-up, then decode iterations whose batch drifts and whose MoE
    buffers follow each layer's routing (scaled-down bench_allocator.py)."""
    r = random.Random(seed)
    persistent = [a.malloc(r.randint(MiB, 200 * MiB)) for _ in range(40)] + [a.malloc(300 * MiB) for _ in range(layers)]
    batch = 64
    for _ in range(iterations):
        batch = min(96, max(16, batch + r.randint(-8, 8)))
        T = 2 * batch
        h = a.malloc(T * 7168 * 2)
        for _ in range(layers):
            R = int(10 * T * r.lognormvariate(0, 0.5))
            q, attn = a.malloc(T * 24576 * 2), a.malloc(T * 16384 * 2)
            a.free(q)
            o = a.malloc(T * 7168 * 2)
            a.free(attn)
            disp, up = a.malloc(R * 7172), a.malloc(R * 8192)
            act = a.malloc(R * 4096)
            a.free(up)
            down = a.malloc(R * 14336)
            a.free(act), a.free(disp)
            comb = a.malloc(T * 8 * 7168 * 2)
            a.free(down)
            h2 = a.malloc(T * 7168 * 2)
            a.free(comb), a.free(o), a.free(h)
            h = h2
        a.free(h)
    assert all(b.allocated for b in persistent)


def test_decode_like_sequence_fragments_more_with_expandable_off():
    off, _ = make(expandable=False)
    on, _ = make(expandable=True)
    decode_like(off, 0)
    decode_like(on, 0)
    off.check_invariants(), on.check_invariants()
    assert off.stats.fragmentation_bytes > 2 * on.stats.fragmentation_bytes
    assert off.inactive_split_bytes() > 0 and on.inactive_split_bytes() == 0


# ----------------------------------------------------------------------------- registration-on-allocation


def test_registration_jobs_follow_map_events():
    a, ev = make(expandable=True)
    roa = RegistrationOnAllocation(COST, PEERS).attach(a)
    b1 = a.malloc(30 * MiB, t=1.0)  # maps two 20 MiB pages in one event: one job
    assert [(j.key, j.size, j.t_map) for j in roa.jobs] == [(e.addr, 40 * MiB, 1.0) for e in ev] and len(ev) == 1
    assert [t for j in roa.jobs for t in (j.start, j.done)] == pytest.approx([1.0, 1.0 + ONE_REG])
    done = roa.ready_at(b1.addr, b1.requested)
    assert done == pytest.approx(1.0 + ONE_REG)
    assert roa.wait_s(b1.addr, b1.requested, done) == 0.0
    assert roa.wait_s(b1.addr, b1.requested, done - 5e-6) == pytest.approx(5e-6)
    a.free(b1, t=2.0)
    b2 = a.malloc(10 * MiB, t=3.0)  # reuses mapped memory: no event, no job, no wait
    assert len(roa.jobs) == 1 and roa.wait_s(b2.addr, b2.requested, 3.0) == 0.0


def test_registration_queue_and_barrier_fallback():
    a, _ = make()
    roa = RegistrationOnAllocation(COST, PEERS).attach(a)
    first, second = a.malloc(30 * MiB, t=0.0), a.malloc(30 * MiB, t=0.0)  # two segments at once
    assert [t for j in roa.jobs for t in (j.start, j.done)] == pytest.approx([0.0, ONE_REG, ONE_REG, 2 * ONE_REG])
    # used at once, the second would wait 2 registrations; the barrier fallback registers it (1)
    assert roa.wait_s(second.addr, second.requested, 0.0) == pytest.approx(ONE_REG)
    assert roa.fallbacks == 1 and roa.wait_s(first.addr, first.requested, 0.0) == pytest.approx(ONE_REG)
    two = RegistrationOnAllocation(COST, PEERS, workers=2)
    b, _ = make()
    two.attach(b)
    b.malloc(30 * MiB), b.malloc(30 * MiB)
    assert two.jobs[1].start == 0.0  # two workers register in parallel


def test_remap_in_steady_state_and_deregistration_on_unmap():
    a, _ = make(expandable=True)
    roa = RegistrationOnAllocation(COST, PEERS).attach(a)
    for it in range(5):  # the same iteration: memory mapped once, then reused
        live = [a.malloc(s * MiB, t=it) for s in (12, 30, 7)]
        for x in live:
            a.free(x, t=it + 0.5)
    assert all(j.t_map == 0 for j in roa.jobs)
    big = a.malloc(120 * MiB, t=5.0)  # a batch bigger than any before: the segment grows
    remaps = [j for j in roa.jobs if j.t_map == 5.0]
    assert len(remaps) == 1 and remaps[0].start == 5.0
    assert roa.wait_s(big.addr, big.requested, 5.0 + 1e-3) == 0.0  # ms of slack cover it
    span = (big.addr, big.requested)
    a.free(big, t=6.0)
    a.empty_cache(t=6.0)
    assert a.stats.reserved_bytes == 0
    with pytest.raises(KeyError):  # deregistered with the unmap
        roa.ready_at(*span)


def test_partial_unmap_keeps_the_rest_of_a_registered_mapping():
    a, ev = make(expandable=True)
    roa = RegistrationOnAllocation(COST, PEERS).attach(a)
    x = a.malloc(40 * MiB)  # one map event of two pages
    a.free(x)
    head = a.malloc(10 * MiB)  # [0, 10) of it
    a.empty_cache()  # unmaps the second page only
    assert ev[-1].kind == "unmap" and ev[-1].addr == head.addr + 20 * MiB
    assert roa.ready_at(head.addr, head.requested) == roa.jobs[0].done
    y = a.malloc(40 * MiB)  # one map event again
    a.free(y)
    tail = a.malloc(30 * MiB)
    rest = a.malloc(10 * MiB)  # [30, 40) of the second mapping
    a.free(tail)
    a.empty_cache()  # unmaps the first page of the second mapping only
    assert roa.ready_at(rest.addr, rest.requested) == roa.jobs[-1].done
    a.check_invariants()


# ----------------------------------------------------------------------------- JIT registration cache


def test_jit_cache_hits_a_reused_block_and_misses_a_new_segment():
    a, _ = make()
    jit = JitRegistrationCache(COST, PEERS).attach(a)
    b = a.malloc(30 * MiB)
    addr = b.addr
    assert jit.lookup(b.addr, b.requested) == pytest.approx(ONE_REG)  # first use: register
    assert jit.lookup(b.addr, b.requested) == 0.0
    a.free(b)
    c = a.malloc(28 * MiB)  # reuses the cached block at the same address
    assert c.addr == addr and jit.lookup(c.addr, c.requested) == 0.0
    d = a.malloc(40 * MiB)  # no cached block fits: a new segment, a new address
    assert jit.lookup(d.addr, d.requested) == pytest.approx(ONE_REG)
    assert (jit.hits, jit.misses) == (2, 2)
    a.free(c), a.free(d)
    a.empty_cache()  # unmapping evicts the registrations over it
    assert jit.evictions == 2 and len(jit) == 0
    e = a.malloc(30 * MiB)
    assert jit.lookup(e.addr, e.requested) > 0


def test_jit_cover_vs_exact_matching():
    a, _ = make()
    cover = JitRegistrationCache(COST, PEERS).attach(a)
    exact = JitRegistrationCache(COST, PEERS, match=JitMatch.exact).attach(a)
    b = a.malloc(30 * MiB)
    addr = b.addr
    cover.lookup(b.addr, b.requested), exact.lookup(b.addr, b.requested)
    a.free(b)
    c = a.malloc(29 * MiB)  # same address, smaller buffer (routing shrank the dispatch)
    assert c.addr == addr
    assert cover.lookup(c.addr, c.requested) == 0.0  # covered by the earlier registration
    assert exact.lookup(c.addr, c.requested) > 0.0  # keyed by (address, size): a miss


# ----------------------------------------------------------------------------- DieMemory


def test_die_memory_replays_a_repeated_iteration_from_the_memo():
    a, ev = make()
    mem = DieMemory(a, JitRegistrationCache(COST, PEERS))
    mem.alloc("weights", 500 * MiB)
    ops = (("alloc", "x", 24 * MiB), ("alloc", "y", 3 * MiB), ("free", "x"), ("alloc", "z", 20 * MiB),
           ("free", "y"), ("free", "z"))
    first = mem.run(ops)
    n_events = len(ev)
    second = mem.run(ops)  # simulated: the first run changed the state (it mapped memory)
    third = mem.run(ops)  # same state, same ops: from the memo
    assert mem.memo_hits == 1 and second == third and len(ev) == n_events
    fresh, _ = make()
    fm = DieMemory(fresh)
    fm.alloc("weights", 500 * MiB)
    assert [fm.run(ops) for _ in range(3)] == [first, second, third]  # memo = simulation
    assert fresh.stats == a.stats  # the memo keeps the counters a simulation would
    assert mem.maps == fm.maps == 3  # weights, x's 24 MiB and y's 20 MiB segments; z reuses x's block


def test_die_memory_peak_reports_reserved_allocated_and_fragmentation():
    """Hand-worked, expandable segments off: 24 MiB (a 24 MiB segment), 3 MiB (a 20 MiB segment),
    free the 24; 20 MiB reuses the free 24 MiB block: peak reserved 44, allocated 27 then 23."""
    mem = DieMemory(CachingAllocator(AllocatorConfig(GiB)))
    ops = (("alloc", "x", 24 * MiB), ("alloc", "y", 3 * MiB), ("free", "x"), ("alloc", "z", 20 * MiB))
    p = mem.peak(ops)
    assert (p.reserved, p.allocated, p.fragmentation) == (44 * MiB, 27 * MiB, 44 * MiB - 27 * MiB)
    assert mem.peak((("alloc", "huge", 2 * GiB),)) is None  # out of memory


# ----------------------------------------------------------------------------- properties

SIZES = st.one_of(st.integers(1, MiB), st.integers(MiB + 1, 10 * MiB), st.integers(10 * MiB, 120 * MiB))
OPS = st.lists(st.tuples(st.sampled_from(["malloc", "malloc", "free", "empty"]), SIZES, st.integers(0, 10**6)),
               min_size=1, max_size=60)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, expandable=st.booleans())
def test_allocator_invariants_hold_for_any_sequence(ops, expandable):
    a, ev = make(expandable=expandable, capacity=600 * MiB)
    live = []
    for kind, size, pick in ops:
        if kind == "malloc":
            try:
                b = a.malloc(size)
            except OutOfMemoryError:
                continue
            assert b.size >= round_size(size) and b.requested == size
            live.append(b)
        elif kind == "free" and live:
            a.free(live.pop(pick % len(live)))
        elif kind == "empty":
            a.empty_cache()
        a.check_invariants()
        spans = sorted((b.addr, b.end) for b in live)
        assert all(x[1] <= y[0] for x, y in zip(spans, spans[1:], strict=False))  # no overlap
        assert a.stats.requested_bytes == sum(b.requested for b in live)
        mapped = sum(e.size if e.kind == "map" else -e.size for e in ev)
        assert mapped == a.stats.reserved_bytes <= 600 * MiB  # events conserve physical memory
        assert a.stats.reserved_bytes_peak >= a.stats.reserved_bytes >= a.stats.allocated_bytes
    for b in live:
        a.free(b)
    a.empty_cache()
    assert a.stats.reserved_bytes == 0 and a.stats.segments == 0  # nothing allocated: all released


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(0, 1 << 16), st.integers(1, 1 << 14)), max_size=80))
def test_jit_cover_cache_matches_a_brute_force_model(ops):
    """Cover semantics: hit iff a live registration covers the page-aligned range; an eviction
    drops the registrations overlapping it and those nested in them."""
    jit = JitRegistrationCache(COST, 4, key_page_bytes=256)
    regs: list[tuple[int, int]] = []

    def rng(addr, size):
        return addr // 256 * 256, -(-(addr + size) // 256) * 256

    for is_lookup, addr, size in ops:
        beg, end = rng(addr, size)
        if is_lookup:
            hit = any(b <= beg and end <= e for b, e in regs)
            assert (jit.lookup(addr, size) == 0.0) == hit
            if not hit:
                regs.append((beg, end))
        else:
            gone = [(b, e) for b, e in regs if b < addr + size and e > addr]
            regs = [r for r in regs if r not in gone and not any(g[0] <= r[0] and r[1] <= g[1] for g in gone)]
            jit.evict(addr, size)
        assert all(jit.contains(b, e - b) for b, e in regs)


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 80 * MiB), min_size=1, max_size=30), expandable=st.booleans(),
       gaps=st.lists(st.floats(0, 1e-3), min_size=30, max_size=30))
def test_registration_ready_times_are_consistent(sizes, expandable, gaps):
    a, _ = make(expandable=expandable)
    roa = RegistrationOnAllocation(COST, PEERS).attach(a)
    t, live = 0.0, []
    for i, s in enumerate(sizes):
        t += gaps[i]
        live.append((a.malloc(s, t), t))
        if i % 3 == 2:
            b, _ = live.pop(0)
            a.free(b, t)
    for b, t_alloc in live:
        ready = roa.ready_at(b.addr, b.requested)  # every live block is registered memory
        covering = [j for j in roa.jobs if j.key < b.end and j.key + j.size > b.addr]
        assert covering and ready == max(j.done for j in covering)
        assert all(j.t_map <= t_alloc for j in covering)  # mapped no later than allocated
        w = [roa.wait_s(b.addr, b.requested, ready - d) for d in (3e-4, 1e-4, 0.0, -1e-4)]
        assert w == sorted(w, reverse=True) and w[-1] == 0.0  # waits shrink to 0 at readiness
        assert all(x <= ONE_REG + 1e-12 for x in w)  # never worse than JIT
