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
from stratacl.machine.fabric import Fabric
from stratacl.workload_api import RunContext
from workloads.collectives import workload as collectives

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


# busbw = algbw × factor, written out from nccl-tests doc/PERFORMANCE.md for n = 16 ranks
BUSBW_16 = {"allreduce": 2 * 15 / 16, "allgather": 15 / 16, "reducescatter": 15 / 16, "alltoall": 15 / 16,
            "broadcast": 1.0, "p2p": 1.0}


def test_rows_follow_the_nccl_tests_conventions_and_grow_with_size(result) -> None:  # noqa: ANN001
    rows = result.rows
    assert len(rows) == 3 * 6 * 3  # libraries × collectives × sizes (64, 128, 256 KiB)
    for r in rows.itertuples():
        assert r.algbw_GBps == pytest.approx(r.size_bytes / r.time_s / 1e9, rel=1e-12)
        assert r.busbw_GBps == pytest.approx(r.algbw_GBps * BUSBW_16[r.collective], rel=1e-12)
    # on an idle fabric a bigger message never takes less time (same algorithm, more bytes)
    for (_, coll), sub in rows.groupby(["library", "collective"]):
        t = sub.sort_values("size_bytes")["time_s"].to_numpy()
        assert (np.diff(t) >= -1e-12 * t[1:]).all(), coll
    assert len(result.table) == 6 * 3 and {"hccl", "hccl_jit", "stratacl"} <= set(result.table.columns)
    # after the warm-up JIT runs HCCL's algorithm on the user buffer: no staging copies, never slower
    by = rows.set_index(["library", "collective", "size_bytes"])["time_s"]
    assert (by["hccl_jit"] <= by["hccl"] * (1 + 1e-12)).all()


# a zero-copy ring on the vector cores over one 16-die node: the α–β closed forms of
# tests/test_closed_forms.py (conf/fabric/cloudmatrix384.yaml node tier: α 0.7 µs + flag sync 1.3 µs
# per synchronised step, β 170 GB/s; 5 µs launch per operator, conf/library/*.yaml)
RING = ["library=[hccl_zerocopy]", "baseline=hccl_zerocopy", "library.hccl_zerocopy.algorithm=ring",
        "library.hccl_zerocopy.mover=vector_cores", "library.hccl_zerocopy.expansion_mode=custom"]
LAUNCH, STEP, BETA = 5e-6, 0.7e-6 + 1.3e-6, 170e9
CORE_BPS = 7.76e9  # one comm core's copy rate, 0.95 × 196 GB/s / 24 (conf/fabric/cloudmatrix384.yaml)


def _closed_form(coll: str, s: float, n: int = 16) -> float:
    if coll == "allreduce":  # 2(n−1) steps, 2(n−1)/n·S bytes per rank
        return LAUNCH + 2 * (n - 1) * STEP + 2 * (n - 1) / n * s / BETA
    if coll in ("allgather", "reducescatter"):  # n−1 steps, (n−1)/n·S
        return LAUNCH + (n - 1) * STEP + (n - 1) / n * s / BETA
    if coll == "broadcast":  # pipelined chain: n−1 hops of latency, the buffer once per link
        return LAUNCH + (n - 1) * STEP + s / BETA
    if coll == "alltoall":  # pairwise: n−1 steps; 24 cores shared uniformly by 15 peers leave some peer
        # a single core, which moves that peer's S/n slice at one core's rate (slower than the port)
        return LAUNCH + (n - 1) * STEP + (s / n) / CORE_BPS
    assert coll == "p2p"  # rank i → i + 8, each pair on its own ports: one step, S over one link
    return LAUNCH + STEP + s / BETA


def test_every_row_and_metric_is_its_closed_form_on_a_zero_copy_ring() -> None:
    res = collectives.run(_ctx(*RING))
    rows = res.rows
    assert len(rows) == 6 * 3
    for r in rows.itertuples():
        assert r.time_s == pytest.approx(_closed_form(r.collective, r.size_bytes), rel=1e-9), r
        assert r.first_time_s == pytest.approx(r.time_s, rel=1e-12)  # a pool: nothing to register
        assert r.algorithm == {"alltoall": "pairwise", "p2p": "p2p"}.get(r.collective, "ring")
        # a ring's one flow is split over all 24 cores: even. Pairwise all-to-all: 9 of the 15 peers get
        # two cores, 6 get one, so the fastest cores finish in half the slowest's time
        assert r.core_spread == pytest.approx(0.5 if r.collective == "alltoall" else 0.0, abs=1e-12)
    # the summary: per collective the total time, mean and peak busbw over the three sizes
    sizes = (65536, 131072, 262144)
    m = res.metrics["hccl_zerocopy"]
    busbw = {}
    for coll, factor in BUSBW_16.items():
        busbw[coll] = [s / _closed_form(coll, s) / 1e9 * factor for s in sizes]
        assert m[f"{coll}_time_s_total"] == pytest.approx(sum(_closed_form(coll, s) for s in sizes), rel=1e-9)
        assert m[f"{coll}_busbw_GBps_mean"] == pytest.approx(sum(busbw[coll]) / 3, rel=1e-9)
        assert m[f"{coll}_busbw_GBps_peak"] == pytest.approx(busbw[coll][-1], rel=1e-9)  # the largest size
    assert m["busbw_GBps_mean"] == pytest.approx(sum(map(sum, busbw.values())) / 18, rel=1e-9)
    # the verdict's size bands: all three sizes are small (< 1 MiB); geometric means of the times
    times = {coll: [_closed_form(coll, s) for s in sizes] for coll in BUSBW_16}
    for coll, t in times.items():
        assert m[f"{coll}_small_op_time_s"] == pytest.approx(np.prod(t) ** (1 / 3), rel=1e-9)
    assert m["small_op_time_s"] == pytest.approx(np.prod(sum(times.values(), [])) ** (1 / 18), rel=1e-9)
    assert not any(k.startswith(("medium", "large")) or "_medium_" in k or "_large_" in k for k in m)
    assert list(res.table.columns) == ["collective", "size", "band", "hccl_zerocopy"]
    assert set(res.table["band"]) == {"small"}
    assert list(res.table["size"][:3]) == ["64 KiB", "128 KiB", "256 KiB"]


def test_registration_lands_in_the_warmup_run_only(result) -> None:  # noqa: ANN001
    """JIT registers each buffer on first use (base + one mapping per peer), then hits its cache;
    staged buffers and buffers allocated before the trace (on_alloc) cost nothing."""
    # conf/library/hccl_jit.yaml: 8 µs base (StrataCL §4.1) + 10.8 µs per peer mapping; a 16-rank
    # collective maps 15 peers (8 + 162 = 170 µs), a p2p pair one (18.8 µs)
    rows = result.rows
    for r in rows.itertuples():
        jit = 18.8e-6 if r.collective == "p2p" else 170e-6
        expected = jit if r.library == "hccl_jit" else 0.0
        assert r.first_time_s - r.time_s == pytest.approx(expected, rel=1e-9, abs=1e-15), r
        assert r.register_s == 0.0


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


def test_breakdown_parts_sum_to_the_operator_time(tmp_path) -> None:  # noqa: ANN001
    """workload.breakdown: every size and library's operator time is the sum of its parts (wire,
    sync, launch, copy, register, host, other); the staged library's copies grow with the size, the
    zero-copy ones have none; a collective the run does not measure is refused by name."""
    from stratacl.run.cli import run_overrides

    over = ["workload=collectives", "library=[hccl,hccl_zerocopy,stratacl]", "baseline=hccl",
            "workload.collectives=[allgather,allreduce]", "workload.breakdown=allgather",
            "workload.max_bytes=4194304", "output.timeline=false"]
    assert run_overrides(over, tmp_path / "run") == (0, "")
    frame = pd.read_parquet(tmp_path / "run" / "breakdown.parquet")
    assert set(frame["library"]) == {"hccl", "hccl_zerocopy", "stratacl"} and set(frame["collective"]) == {"allgather"}
    parts = frame[["wire", "sync", "launch", "copy", "register", "host", "other"]].sum(axis=1)
    assert (parts - frame["time_us"]).abs().max() < 1e-6 * frame["time_us"].max()
    assert (frame["other"] > -1e-6).all() and (frame["wire"] > 0).all()
    hccl = frame[frame["library"] == "hccl"].sort_values("size_bytes")
    assert hccl["copy"].is_monotonic_increasing and hccl["copy"].iloc[-1] > 0
    assert (frame[frame["library"] != "hccl"]["copy"] == 0).all()
    rc, msg = run_overrides([*over, "workload.breakdown=alltoall"], tmp_path / "bad")
    assert rc == 2 and "'workload.breakdown'" in msg and "alltoall" in msg
    assert not (tmp_path / "bad").exists()
