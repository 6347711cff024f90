"""DLRM's memory hierarchy (issue 26): tables in host DRAM behind the HBM cache, misses fetched and
dirty rows written back over the fabric, the prefetch pipeline, and the cache's monotonicity."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from helpers import compose_run, make_library
from hypothesis import given, settings
from hypothesis import strategies as st

from stratacl.engine.replay import simulate
from stratacl.fabric import Fabric
from workloads.dlrm_train.cache import POLICIES, Segment, die_hit_rate, lru_hit_rates
from workloads.dlrm_train.workload import library_run, prepare

SMALL = ["workload=dlrm_train", "workload.ranks=32", "workload.iterations=3", "workload.total_table_TiB=1.5",
         "workload.cache_GB_per_die=1"]


@functools.lru_cache(maxsize=8)
def run_of(*extra: str):  # noqa: ANN201
    cfg = compose_run([*SMALL, *extra])
    fab = Fabric(cfg.fabric)
    setup = prepare(cfg.workload, fab, cfg.seed)
    lib = make_library(fab, "stratacl")
    lr = library_run(setup, lib, cfg.seed)
    return cfg, fab, setup, lr, simulate(lr.built.trace, lib)


def named(trace, name: str) -> list:  # noqa: ANN001
    return [op for op in trace.ops if op.name == name]


def test_bytes_fetched_equal_misses_times_row_bytes() -> None:
    _, _, setup, lr, res = run_of()
    fetches, backs = named(lr.built.trace, "cache_miss_fetch"), named(lr.built.trace, "cache_writeback")
    assert len(fetches) == len(backs) == len(lr.built.miss_rows) == 3
    for it, (f, wb) in enumerate(zip(fetches, backs, strict=True)):
        assert (f.peer, f.direction, wb.peer, wb.direction) == ("host", "h2d", "host", "d2h")
        expect = [sum(n * g.row_bytes for n, g in zip(lr.built.miss_rows[it][d], setup.segments[d], strict=True))
                  for d in range(32)]
        np.testing.assert_array_equal(f.nbytes, expect)
        np.testing.assert_array_equal(wb.nbytes, expect)  # each inserted row evicts a dirty one
        assert res.wire_bytes[f.id] == pytest.approx(sum(expect), rel=1e-12)  # the replay moved them
    # the misses follow the hit rate: rows missed ≈ lookups × (1 − hit) over the run
    lookups = sum(float(np.sum(tf.lookups[d])) for tf in setup.traffic for d in range(32))
    missed = sum(float(np.sum(r)) for rows in lr.built.miss_rows for r in rows)
    hit = np.average(lr.hit_rate, weights=[sum(float(np.sum(tf.lookups[d])) for tf in setup.traffic)
                                           for d in range(32)])
    assert missed == pytest.approx(lookups * (1 - hit), rel=0.02)


def test_fetch_waits_for_the_busiest_cpu_link() -> None:
    """A fetch spans all dies; its time is at least the latency plus the bytes of the dies on the
    busiest CPU at that CPU's 160 GB/s (4 dies share a Kunpeng on CloudMatrix384)."""
    _, fab, _, lr, res = run_of()
    for f in named(lr.built.trace, "cache_miss_fetch"):
        per_cpu = np.bincount([fab.host.cpu_of(r) for r in f.ranks], weights=f.nbytes)
        assert res.end[f.id] - res.start[f.id] >= fab.host_read_s + per_cpu.max() / fab.host_link_Bps - 1e-12


def test_prefetch_pipeline_hides_the_fetch() -> None:
    """Inline (no prefetch stage) the fetch sits in the lookup's path; the prefetch pipeline moves it
    beside the previous batch's backward: less of it is exposed and the iteration is no slower."""
    _, _, _, pre, res_pre = run_of()
    _, _, _, inline, res_inline = run_of("workload.prefetch_pipeline=false")
    assert pre.built.miss_bytes[1].sum() == inline.built.miss_bytes[1].sum() > 0  # same misses
    for name in ("cache_miss_fetch", "cache_writeback"):
        assert {op.stream for op in named(inline.built.trace, name)} == {"main"}
        assert {op.stream for op in named(pre.built.trace, name)} <= {"cache", "writeback"}
    assert res_pre.makespan_s < res_inline.makespan_s


def test_tables_live_in_the_fabric_host_dram() -> None:
    """A die's shards must fit its share of its CPU's DRAM (fabric.host), not a workload constant."""
    from stratacl.errors import ConfigError

    cfg = compose_run([*SMALL, "workload.total_table_TiB=8"])  # ~275 GB per die > 128 GB of DRAM
    fab = Fabric(cfg.fabric)
    assert fab.host_dram_bytes_per_die == pytest.approx(128e9)
    with pytest.raises(ConfigError, match="total_table_TiB"):
        prepare(cfg.workload, fab, 0)
    cfg.workload.host_dram_GB_per_die = 400.0  # the knob overrides the fabric's
    prepare(cfg.workload, fab, 0)


segments = st.lists(st.builds(Segment, rows=st.floats(1, 1e10), row_bytes=st.sampled_from([132.0, 516.0, 68.0]),
                              lookups=st.floats(0, 1e6)), min_size=1, max_size=5)


@settings(max_examples=200, deadline=None)
@given(segs=segments, a=st.floats(0, 1e13), b=st.floats(0, 1e13), s=st.floats(0.5, 1.6),
       policy=st.sampled_from(POLICIES))
def test_a_larger_cache_never_lowers_the_hit_rate(segs, a, b, s, policy) -> None:  # noqa: ANN001
    small, large = sorted((a, b))
    assert die_hit_rate(segs, large, s, policy) >= die_hit_rate(segs, small, s, policy) - 1e-12


@pytest.mark.parametrize("n, s, rows", [(20_000, 1.0, 2_000), (5_000, 0.8, 500)])
def test_lru_hit_rate_matches_a_simulated_lru_cache(n, s, rows) -> None:  # noqa: ANN001
    """Che's approximation against an LRU cache fed i.i.d. Zipf lookups (independent of cache.py)."""
    from collections import OrderedDict

    p = np.arange(1, n + 1, dtype=float) ** -s
    looks = np.random.default_rng(7).choice(n, size=300_000, p=p / p.sum())
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for i, r in enumerate(looks.tolist()):
        if r in cache:
            cache.move_to_end(r)
            hits += i >= 100_000  # after warm-up
        else:
            cache[r] = None
            if len(cache) > rows:
                cache.popitem(last=False)
    assert lru_hit_rates([Segment(n, 64.0, 1e3)], rows * 64.0, s)[0] == pytest.approx(hits / 200_000, abs=0.01)
