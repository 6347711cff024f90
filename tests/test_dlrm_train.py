"""DLRM training workload: volumes as sharded, cache monotonicity, memory, failures, timing."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from helpers import compose_run, make_library

from stratacl.config import DataPath
from stratacl.engine.replay import simulate
from stratacl.errors import ConfigError
from stratacl.machine.fabric import Fabric
from workloads.dlrm_train.builder import ddp_buckets
from workloads.dlrm_train.cache import Segment, die_hit_rate, harmonic
from workloads.dlrm_train.model import build_meta, dense_costs
from workloads.dlrm_train.workload import library_run, prepare
from workloads.modelcost import mlp_cost

# 32 dies, 2 iterations: the same code paths as the 128-die default, faster
SMALL = ["workload=dlrm_train", "workload.ranks=32", "workload.iterations=2", "workload.total_table_TiB=1.5"]


def cfg_of(*extra: str):  # noqa: ANN201
    return compose_run([*SMALL, *extra])


@functools.lru_cache(maxsize=8)
def setup_of(*extra: str):  # noqa: ANN201
    cfg = cfg_of(*extra)
    fab = Fabric(cfg.fabric)
    return cfg, fab, prepare(cfg.workload, fab, cfg.seed)


def ops_named(trace, name: str) -> list:  # noqa: ANN001
    return [op for op in trace.ops if op.name == name]


def test_alltoall_volumes_equal_batch_features_dim_bytes() -> None:
    cfg, fab, st = setup_of("workload.sharding=column_wise")
    w, b, d, e = 32, cfg.workload.batch_per_worker, cfg.workload.embedding_dim, cfg.workload.comm_dtype_bytes
    built = library_run(st, make_library(fab, "stratacl"), 0).built
    fwd, bwd = ops_named(built.trace, "pooled_emb_fwd")[0], ops_named(built.trace, "pooled_emb_bwd")[0]
    m = np.asarray(fwd.peer_bytes).reshape(w, w)
    # each rank receives B pooled rows of every table-/column-wise feature's full width
    tw_features = {s.table for s in st.plan.shards}
    assert sum(s.width for s in st.plan.shards) == len(tw_features) * d
    np.testing.assert_allclose(m.sum(axis=0), b * len(tw_features) * d * e)
    # an owner sends every rank B rows of each of its shards' width; bytes per rank = send buffer
    for s_owner in {s.owner for s in st.plan.shards}:
        width = sum(s.width for s in st.plan.shards_of(s_owner))
        np.testing.assert_allclose(m[s_owner], b * width * e)
    np.testing.assert_allclose(fwd.nbytes, m.sum(axis=1))
    np.testing.assert_allclose(np.asarray(bwd.peer_bytes).reshape(w, w), m.T)  # gradients go back
    # row-wise tables: reduce-scatter / all-gather of the global batch's pooled rows
    rs = ops_named(built.trace, "rw_pooled_fwd")[0]
    assert rs.coll == "reducescatter" and rs.nbytes == (w * b * d * e * len(st.plan.rw_tables),)
    assert st.plan.rw_tables, "the 1.5 TiB tables should need row-wise sharding for balance"
    # input dist: every lookup index reaches exactly one owner per column shard
    idx = ops_named(built.trace, "input_dist_indices")[0]
    ib = cfg.workload.index_bytes
    expect = w * b * ib * (sum(1 for _ in st.plan.shards) + len(st.plan.rw_tables))  # one-hot
    assert sum(idx.peer_bytes) == pytest.approx(expect)


def test_cache_hit_rate_monotone_in_cache_size() -> None:
    segs = [Segment(3e9, 516, 1024), Segment(4e7, 516, 131072), Segment(200, 132, 131072)]
    sizes = np.geomspace(1e3, 2e12, 40)
    rates = [die_hit_rate(segs, c, 1.05) for c in sizes]
    assert all(b >= a for a, b in zip(rates, rates[1:], strict=False))
    assert rates[0] < 0.5 and rates[-1] == pytest.approx(1.0)
    # harmonic numbers are exact to float precision across the exact/asymptotic seam
    for n in (10, 1024, 1025, 50_000):
        assert float(harmonic(n, 1.05)) == pytest.approx((np.arange(1, n + 1) ** -1.05).sum(), rel=1e-12)


def test_cache_size_sweep_lowers_hit_rate_and_raises_miss_traffic() -> None:
    rates, misses = [], []
    for gb in (1, 4, 16):
        _, fab, st = setup_of(f"workload.cache_GB_per_die={gb}")
        lr = library_run(st, make_library(fab, "stratacl"), 0)
        rates.append(lr.hit_rate.mean())
        misses.append(sum(m.sum() for m in lr.built.miss_bytes))
    assert rates[0] < rates[1] < rates[2] < 1.0
    assert misses[0] > misses[1] > misses[2] > 0


def test_dense_allreduce_equals_dense_parameter_bytes() -> None:
    cfg, fab, st = setup_of()
    built = library_run(st, make_library(fab, "hccl"), 0).built
    ars = [op for op in built.trace.ops if op.coll == "allreduce" and built.iteration_of[op.id] == 0]
    wl = cfg.workload
    model = build_meta(wl.dense_features, [1] * len(wl.rows_per_feature), wl.embedding_dim,
                       wl.bottom_mlp, wl.top_mlp)
    dense_params = sum(p.numel() for p in model.dense_parameters())
    assert sum(op.nbytes[0] for op in ars) == dense_params * wl.param_dtype_bytes
    assert len(ars) == len(ddp_buckets(st.dense, wl)) >= 2  # first 1 MiB bucket, then the rest


def test_bottom_mlp_cost_matches_modelcost_piece() -> None:
    c = dense_costs(13, 26, 128, (512, 256, 128), (1024, 1024, 512, 256, 1), 1024, 2)
    # closed form: 2 FLOPs per multiply-add of each layer's weight matrix, per sample
    assert c.bottom_fwd.cube_flops == 2 * 1024 * (13 * 512 + 512 * 256 + 256 * 128)
    # the top MLP's input: the bottom output plus the 27·26/2 pairwise dot products
    top_in = 128 + 27 * 26 // 2
    assert c.top_fwd.cube_flops >= 2 * 1024 * (top_in * 1024 + 1024 * 1024 + 1024 * 512 + 512 * 256 + 256)
    ref = mlp_cost([13, 512, 256, 128], 1024, phase="train_fwd", dtype_bytes=2)  # the model-cost piece agrees
    assert (c.bottom_fwd.cube_flops, c.bottom_fwd.hbm_bytes) == (ref["cube_flops"], ref["hbm_bytes"])
    assert c.top_bwd.cube_flops == pytest.approx(2 * c.top_fwd.cube_flops, rel=0.05)


@pytest.mark.parametrize("override, field", [
    (["workload.sharding=table_wise"], "workload.sharding"),      # a 500 GB table on one die
    (["workload.total_table_TiB=40"], "workload.total_table_TiB"),  # more tables than memory
    (["workload.runtime_reserve_GB=70"], "workload.runtime_reserve_GB"),
    (["workload.skew_top_fraction=0.1", "workload.skew_top_share=0.5"], "workload.skew_top_share"),  # < uniform's
    (["workload.skew_rows=[]"], "workload.skew_rows"),  # no rows to rank
])  # an unknown sharding fails at compose time: tests/test_config_validation.py
def test_bad_sharding_fails_clearly(override: list[str], field: str) -> None:
    cfg = cfg_of(*override)
    fab = Fabric(cfg.fabric)
    with pytest.raises(ConfigError) as exc:
        st = prepare(cfg.workload, fab, 0)
        library_run(st, make_library(fab, "hccl"), 0)
    assert exc.value.field == field


def test_iteration_time_at_least_compute() -> None:
    cfg, fab, st = setup_of()
    for lib in ("hccl", "stratacl"):
        lr = library_run(st, make_library(fab, lib), 0)
        res = simulate(lr.built.trace, make_library(fab, lib))
        # main-stream compute runs in order: the iteration cannot beat its roofline sum
        roofline = sum(max(max(op.flops) / (fab.cube_flops if op.core == "cube" else fab.vector_flops),
                           max(op.hbm_bytes) / fab.hbm_Bps)
                       for op in lr.built.trace.ops if op.kind == "compute")
        assert res.makespan_s >= roofline * (1 - 1e-9)
        assert res.makespan_s > roofline  # communication is not free


def test_library_holding_more_hbm_gets_smaller_cache() -> None:
    _, fab, st = setup_of("workload.runtime_reserve_GB=20")  # tables (~52 GB/die) no longer fit
    lean = library_run(st, make_library(fab, "stratacl"), 0)
    pool = library_run(st, make_library(fab, "stratacl", data_path=DataPath.pool, pool_GB=6.0), 0)
    assert pool.memory.library_bytes == pytest.approx(6.0e9)
    assert not lean.memory.resident.any()
    # the cache loses the pool and whatever the pool's allocator (expandable segments off) reserves
    # beyond the other's (± a few MiB: 2 MiB segment rounding instead of 20 MiB pages)
    extra = pool.memory.reserved_bytes - lean.memory.reserved_bytes
    np.testing.assert_allclose(lean.memory.cache_bytes - pool.memory.cache_bytes, 6.0e9 + extra)
    assert pool.hit_rate.mean() < lean.hit_rate.mean()
    assert sum(m.sum() for m in pool.built.miss_bytes) > sum(m.sum() for m in lean.built.miss_bytes)


def test_deterministic_for_a_seed() -> None:
    cfg = cfg_of("workload.cache_GB_per_die=4")
    fab = Fabric(cfg.fabric)
    lib = make_library(fab, "hccl")
    a = library_run(prepare(cfg.workload, fab, 3), lib, 3).built
    b = library_run(prepare(cfg.workload, fab, 3), lib, 3).built
    assert a.trace.to_frame().equals(b.trace.to_frame())
    assert simulate(a.trace, lib).makespan_s == simulate(b.trace, lib).makespan_s


def test_cache_is_what_the_allocator_leaves() -> None:
    """The dense state and the iterations' buffers go through the library's allocator: its
    reserved peak (tensors + fragmentation) and the library's memory come off the cache."""
    _, fab, st = setup_of("workload.runtime_reserve_GB=20")
    lib = make_library(fab, "stratacl")
    lr = library_run(st, lib, 0)
    m = lr.memory
    assert (m.reserved_bytes >= m.dense_bytes).all()  # at least the replicated dense state
    assert (m.fragmentation_bytes >= 0).all()
    expect = fab.hbm_bytes - 20e9 - m.reserved_bytes - m.library_bytes
    np.testing.assert_allclose(m.cache_bytes, np.minimum(expect, m.table_bytes))
