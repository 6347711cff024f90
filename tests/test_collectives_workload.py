"""workloads.collectives in process: the size sweep, the trace it builds, and what `run` reports.

On an idle fabric an op's measured time is the sum of its phases priced alone, so every row can be
checked against the library model directly; registration shows only in the warm-up run.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers import compose_run

from stratacl.comm.library import LibraryModel
from stratacl.errors import ConfigError
from stratacl.fabric import Fabric
from stratacl.metrics import busbw_factor
from stratacl.workload_api import RunContext
from workloads import collectives

COLLS = "[allreduce,allgather,reducescatter,alltoall,broadcast,p2p]"
SMALL = ["workload.ranks=16", "workload.max_bytes=262144", f"workload.collectives={COLLS}",
         "library=[hccl,hccl_jit,stratacl]"]


def _ctx(*extra: str, seed: int = 0) -> RunContext:
    cfg = compose_run([*SMALL, *extra])
    fab = Fabric(cfg.fabric)
    libs = {n: LibraryModel(n, c, fab) for n, c in cfg.library.items()}
    return RunContext(cfg=cfg, fabric=fab, libraries=libs, baseline=cfg.baseline, seed=seed)


# ------------------------------------------------------------------ sizes and trace
def test_message_sizes_are_a_geometric_sweep() -> None:
    w = compose_run().workload
    sizes = collectives.message_sizes(w)
    assert sizes[0] == 64 * 1024 and sizes[-1] == 2**30 and len(sizes) == 15
    assert all(b == 2 * a for a, b in zip(sizes, sizes[1:], strict=False))
    w.step_factor, w.max_bytes = 4, 2**20 + 1
    assert collectives.message_sizes(w) == [2**16, 2**18, 2**20]  # never beyond max_bytes


@pytest.mark.parametrize("knob, value, field", [
    ("min_bytes", 0, "workload.min_bytes"),
    ("max_bytes", 1024, "workload.min_bytes"),  # below min_bytes
    ("step_factor", 1, "workload.step_factor"),
])
def test_bad_sweeps_name_the_field(knob: str, value: int, field: str) -> None:
    w = compose_run().workload
    setattr(w, knob, value)
    with pytest.raises(ConfigError) as err:
        collectives.message_sizes(w)
    assert err.value.field == field


def test_trace_runs_every_point_warmup_plus_iters_times_on_one_buffer() -> None:
    w = compose_run(["workload.ranks=16", "workload.group_size=8", "workload.max_bytes=262144",
                     "workload.warmup=2", "workload.iters=3", f"workload.collectives={COLLS}"]).workload
    trace, points = collectives.build_trace(w, 16)
    trace.validate()
    sizes = collectives.message_sizes(w)
    assert len(trace.ops) == len(points) == 6 * len(sizes) * 5
    assert sum(m for _, _, m in points) == 6 * len(sizes) * 3
    assert sorted(trace.communicators) == ["world[0]", "world[1]"]
    assert trace.communicators["world[1]"] == tuple(range(8, 16))
    assert [m for _, _, m in points] == [False, False, True, True, True] * (6 * len(sizes))
    for op, (coll, size, _) in zip(trace.ops, points, strict=True):
        assert op.stream == "main" and op.nbytes == (float(size),)
        assert op.buffer == f"{coll}_{size}"  # warm-up and measured runs share it: first use in warm-up
        if coll == "p2p":  # each rank of a group's first half sends to its partner in the second half
            assert op.kind == "p2p" and op.src == (0, 1, 2, 3, 8, 9, 10, 11)
            assert op.dst == tuple(s + 4 for s in op.src)
        else:
            assert op.kind == "collective" and op.coll == coll and len(trace.op_groups(op)) == 2


@pytest.mark.parametrize("overrides, field", [
    (["workload.group_size=3"], "workload.group_size"),
    (["workload.group_size=1"], "workload.group_size"),
    (["workload.collectives=[dispatch]"], "workload.collectives"),
    (["workload.iters=0"], "workload.iters"),
])
def test_bad_traces_name_the_field(overrides: list[str], field: str) -> None:
    w = compose_run(["workload.ranks=16", *overrides]).workload
    with pytest.raises(ConfigError) as err:
        collectives.build_trace(w, 16)
    assert err.value.field == field


def test_more_ranks_than_the_fabric_fails_before_simulating() -> None:
    with pytest.raises(ConfigError) as err:
        collectives.run(_ctx("workload.ranks=1024"))
    assert err.value.field == "workload.ranks"


# ------------------------------------------------------------------ run
@pytest.fixture(scope="module")
def result():  # noqa: ANN201
    return collectives.run(_ctx())


def _idle_time(lib: LibraryModel, coll: str, size: int, n: int) -> float:
    """The op priced alone by the library model: the closed form the engine must reproduce."""
    if coll == "p2p":  # pairs i -> i + n/2: the slowest pair's tier, total bytes over n/2 pairs
        tier = int(lib.fabric.tier_index(0, n // 2))
        phases = lib.p2p_phases(tier, float(size), float(size) * n / 2)
    else:
        phases = lib.collective_phases(coll, float(size), tuple(range(n)))
    return sum(p.standalone_s() for p in phases)


def test_every_row_is_the_library_model_priced_on_an_idle_fabric(result) -> None:  # noqa: ANN001
    ctx = _ctx()
    rows = result.rows
    assert len(rows) == 3 * 6 * 3  # libraries × collectives × sizes (64, 128, 256 KiB)
    for r in rows.itertuples():
        lib = ctx.libraries[r.library]
        assert r.time_s == pytest.approx(_idle_time(lib, r.collective, r.size_bytes, 16), rel=1e-9), r
        assert r.algbw_GBps == pytest.approx(r.size_bytes / r.time_s / 1e9, rel=1e-12)
        assert r.busbw_GBps == pytest.approx(r.algbw_GBps * busbw_factor(r.collective, 16), rel=1e-12)
        if r.collective != "p2p":
            assert r.algorithm == lib.chosen_algorithm(r.collective, r.size_bytes, tuple(range(16)))


def test_registration_lands_in_the_warmup_run_only(result) -> None:  # noqa: ANN001
    """JIT registers each buffer on first use (base + one mapping per peer), then hits its cache;
    staged buffers and buffers allocated before the trace (on_alloc) cost nothing."""
    rows = result.rows
    one = {15: 170.0e-6, 1: 18.8e-6}  # 8 µs + peers × 10.8 µs (conf/library/hccl_jit.yaml)
    for r in rows.itertuples():
        expected = one[1 if r.collective == "p2p" else 15] if r.library == "hccl_jit" else 0.0
        assert r.first_time_s - r.time_s == pytest.approx(expected, rel=1e-9, abs=1e-15), r
        assert r.register_s == 0.0


def test_metrics_summarise_the_rows(result) -> None:  # noqa: ANN001
    rows = result.rows
    for lib, m in result.metrics.items():
        mine = rows[rows["library"] == lib]
        for coll, sub in mine.groupby("collective"):
            assert m[f"{coll}_busbw_GBps_mean"] == pytest.approx(sub["busbw_GBps"].mean(), rel=1e-12)
            assert m[f"{coll}_busbw_GBps_peak"] == pytest.approx(sub["busbw_GBps"].max(), rel=1e-12)
            assert m[f"{coll}_time_s_total"] == pytest.approx(sub["time_s"].sum(), rel=1e-12)
        assert m["busbw_GBps_mean"] == pytest.approx(mine["busbw_GBps"].mean(), rel=1e-12)
    table = result.table
    assert len(table) == 6 * 3 and {"hccl", "hccl_jit", "stratacl"} <= set(table.columns)


def test_disjoint_groups_run_as_fast_as_one_group_alone(result) -> None:  # noqa: ANN001
    """Two 16-rank groups on disjoint dies share no port, HBM or core: the same time as one."""
    two = collectives.run(_ctx("workload.ranks=32", "workload.group_size=16")).rows
    cols = ["library", "collective", "size_bytes", "time_s", "busbw_GBps"]
    pd.testing.assert_frame_equal(two[cols], result.rows[cols], rtol=1e-9)
    assert (two["group_size"] == 16).all()


def test_run_is_deterministic(result) -> None:  # noqa: ANN001
    again = collectives.run(_ctx()).rows
    pd.testing.assert_frame_equal(again, result.rows)
    assert np.isfinite(again["core_spread"]).all()
