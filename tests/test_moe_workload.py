"""workloads.moe in process: byte conservation of dispatch/combine, op structure, busbw accounting."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers import compose_run

from stratacl.comm.library import LibraryModel
from stratacl.config import validate_run
from stratacl.errors import ConfigError
from stratacl.machine.compute import ComputeLowering
from stratacl.machine.fabric import Fabric
from stratacl.trace import Trace
from stratacl.workload_api import RunContext
from workloads.moe import workload as moe

SMALL = ["workload=moe", "workload.ep=8", "workload.experts=32", "workload.top_k=4", "workload.tokens_ht=256",
         "workload.tokens_ll=32", "workload.iters=2", "workload.warmup=1",
         "library=[cann_ep,stratacl]", "baseline=cann_ep"]


def _cfg(*extra: str):  # noqa: ANN202
    return compose_run([*SMALL, *extra])


def _ctx(seed: int = 0, *extra: str) -> RunContext:
    cfg = _cfg(*extra)
    fab = Fabric(cfg.fabric)
    libs = {n: LibraryModel(n, c, fab) for n, c in cfg.library.items()}
    return RunContext(cfg=cfg, fabric=fab, libraries=libs, baseline=cfg.baseline, seed=seed)


def _matrix(tr: Trace, op_id: int, ep: int) -> np.ndarray:
    return np.asarray(tr.ops[op_id].peer_bytes, dtype=float).reshape(ep, ep)


def _ops(tr: Trace, points: list[dict], kind: str) -> list[int]:
    return [p["op"] for p in points if p["kind"] == kind]


@pytest.mark.parametrize("mode", ["ht", "ll"])
def test_dispatch_conserves_token_copies_and_combine_is_its_transpose(mode: str) -> None:
    w = _cfg().workload
    tr, points = moe.build_trace(w, mode, seed=0)
    tr.validate()
    tokens = w.tokens_ht if mode == "ht" else w.tokens_ll
    dispatches, combines = _ops(tr, points, "dispatch"), _ops(tr, points, "combine")
    assert len(dispatches) == len(combines) == w.warmup + w.iters
    for d, c in zip(dispatches, combines, strict=True):
        copies = _matrix(tr, d, w.ep) / w.dispatch_bytes_per_token
        assert copies == pytest.approx(np.rint(copies))  # whole token copies
        per_source = copies.sum(axis=1)
        if mode == "ll":  # one copy per selected expert
            assert per_source == pytest.approx(np.full(w.ep, tokens * w.top_k))
        else:  # one copy per destination rank of a token: between 1 and top_k of them
            assert (per_source >= tokens).all() and (per_source <= tokens * w.top_k).all()
            assert per_source.sum() < w.ep * tokens * w.top_k  # 4 experts per rank: tokens share ranks
        np.testing.assert_allclose(_matrix(tr, c, w.ep), copies.T * w.combine_bytes_per_token, rtol=1e-12)
        for op_id in (d, c):  # the op's size is its busiest sender's bytes
            assert tr.ops[op_id].nbytes == (pytest.approx(_matrix(tr, op_id, w.ep).sum(axis=1).max()),)
        assert tr.ops[c].deps == (d,)


@pytest.mark.parametrize("mode", ["ht", "ll"])
def test_gate_allocates_the_buffers_and_each_op_carries_its_mode(mode: str) -> None:
    """Per iteration: gate → dispatch → combine; the router's output (re)sizes both buffers at
    the gate; the mode rides on the ops (the library adds HT's count exchange to its dispatch)."""
    w = _cfg().workload
    tr, points = moe.build_trace(w, mode, seed=0)
    gates = [op.id for op in tr.ops if op.kind == "compute"]
    assert len(tr.ops) == 3 * len(gates) and len(gates) == w.warmup + w.iters
    assert tr.buffers["dispatch"] == tr.buffers["combine"] == tuple(gates)
    for it, (d, c) in enumerate(zip(_ops(tr, points, "dispatch"), _ops(tr, points, "combine"), strict=True)):
        assert tr.ops[d].deps == (gates[it],) and tr.ops[c].deps == (d,)
        assert tr.ops[d].moe_mode == tr.ops[c].moe_mode == mode
        assert (tr.ops[d].buffer, tr.ops[c].buffer) == ("dispatch", "combine")
        if it:
            assert tr.ops[gates[it]].deps == (tr.ops[c].id - 3,)  # after the previous combine


def test_routing_is_sampled_per_iteration_and_per_seed() -> None:
    w = _cfg().workload
    tr, points = moe.build_trace(w, "ll", seed=0)
    again, _ = moe.build_trace(w, "ll", seed=0)
    other, _ = moe.build_trace(w, "ll", seed=1)
    d = _ops(tr, points, "dispatch")
    assert [op.peer_bytes for op in tr.ops] == [op.peer_bytes for op in again.ops]
    assert tr.ops[d[0]].peer_bytes != tr.ops[d[1]].peer_bytes  # a fresh sample each iteration
    assert tr.ops[d[0]].peer_bytes != other.ops[d[0]].peer_bytes


def test_points_record_received_bytes() -> None:
    w = _cfg().workload
    tr, points = moe.build_trace(w, "ll", seed=0)
    for p in points:
        recv = _matrix(tr, p["op"], w.ep).sum(axis=0)
        assert p["recv_bytes_mean"] == pytest.approx(recv.mean()) and p["recv_bytes_max"] == pytest.approx(recv.max())
    # every copy a rank sends is received somewhere: mean received = tokens·k·bytes in LL mode
    assert points[0]["recv_bytes_mean"] == pytest.approx(w.tokens_ll * w.top_k * w.dispatch_bytes_per_token)
    assert [p["measured"] for p in points if p["kind"] == "dispatch"] == [False, True, True]


@pytest.fixture(scope="module")
def result():  # noqa: ANN201
    return moe.run(_ctx())


def test_run_prices_every_op_once_per_library_on_the_same_routing(result) -> None:  # noqa: ANN001
    rows = result.rows
    assert len(rows) == 2 * 2 * 3 * 2  # libraries × modes × (warmup + iters) × {dispatch, combine}
    by_lib = {lib: g.reset_index(drop=True) for lib, g in rows.groupby("library", sort=False)}
    assert list(by_lib) == ["cann_ep", "stratacl"]
    same = ["mode", "kind", "iteration", "recv_bytes_mean", "recv_bytes_max"]
    pd.testing.assert_frame_equal(by_lib["cann_ep"][same], by_lib["stratacl"][same])
    # stratacl registers the buffers the gate allocates (on_alloc): 8 µs + 10.8 µs × 7 peers =
    # 83.6 µs per buffer, jobs queued on the die's one registration worker in map order (dispatch,
    # then combine), from the gate's start (the allocation). The first dispatch waits for what the
    # gate's own time leaves of its job; the first combine, right after it, waits for the second
    # job: it ends c after the first, so the combine waits c − (the dispatch's own time). The
    # staged cann_ep never registers a user buffer.
    c = 83.6e-6
    strat0 = (rows["library"] == "stratacl") & (rows["iteration"] == 0)
    first = strat0 & (rows["kind"] == "dispatch")
    ctx = _ctx()
    for mode, got in zip(ctx.cfg.workload.modes, rows.loc[first, "register_s"], strict=True):
        tr, _ = moe.build_trace(ctx.cfg.workload, mode, 0)
        gate = sum(p.standalone_s() for p in ComputeLowering(ctx.fabric).lower(tr.ops[0]))
        assert 0 < gate < c
        assert got == pytest.approx(c - gate, abs=0.2e-6)
    for mode in ("ht", "ll"):
        d = rows[first & (rows["mode"] == mode)].iloc[0]
        comb = rows[strat0 & (rows["kind"] == "combine") & (rows["mode"] == mode)].iloc[0]
        assert comb.register_s == pytest.approx(c - (d.time_s - d.register_s), rel=1e-9)
    assert (rows.loc[~strat0, "register_s"] == 0).all()
    assert (rows.loc[first, "time_s"] > rows.loc[first, "register_s"]).all()
    np.testing.assert_allclose(rows["deepep_logical_GBps"], rows["recv_bytes_mean"] / rows["time_s"] / 1e9, rtol=1e-12)
    n = ctx.cfg.workload.ep  # nccl-tests all-to-all: S = bytes a rank sends, busbw = S/t·(n−1)/n
    np.testing.assert_allclose(rows["algbw_GBps"], rows["send_bytes_mean"] / rows["time_s"] / 1e9, rtol=1e-12)
    np.testing.assert_allclose(rows["busbw_GBps"], rows["algbw_GBps"] * (n - 1) / n, rtol=1e-12)


def test_run_metrics_average_the_measured_iterations(result) -> None:  # noqa: ANN001
    rows = result.rows
    for lib, m in result.metrics.items():
        for mode in ("ht", "ll"):
            for kind in ("dispatch", "combine"):
                sub = rows[(rows["library"] == lib) & (rows["mode"] == mode) & (rows["kind"] == kind)]
                steady = sub[sub["measured"]]
                assert m[f"{kind}_{mode}_deepep_logical_GBps"] == pytest.approx(
                    (steady["recv_bytes_mean"] / steady["time_s"]).mean() / 1e9, rel=1e-12)
                assert m[f"{kind}_{mode}_time_us"] == pytest.approx(steady["time_s"].mean() * 1e6, rel=1e-12)
                assert m[f"{kind}_{mode}_first_time_us"] == pytest.approx(sub["time_s"].iloc[0] * 1e6, rel=1e-12)
    assert set(result.timelines) == {"cann_ep", "stratacl"}


def test_run_is_deterministic_for_a_seed(result) -> None:  # noqa: ANN001
    pd.testing.assert_frame_equal(moe.run(_ctx()).rows, result.rows)
    other = moe.run(_ctx(1)).rows
    assert not np.array_equal(other["recv_bytes_max"], result.rows["recv_bytes_max"])


@pytest.mark.parametrize("override, field", [
    ("workload.iters=0", "workload.iters"),
    ("workload.tokens_ll=0", "workload.tokens_ll"),
    ("workload.ep=1024", "workload.ep"),
    ("workload.ep=12", "workload.ep"),  # does not divide 32 experts
])
def test_bad_configs_name_the_field(override: str, field: str) -> None:
    """As a run sees them: the schema's ranges first (validate_run), then the workload's checks."""
    with pytest.raises(ConfigError) as err:
        ctx = _ctx(0, override)
        validate_run(ctx.cfg)
        moe.run(ctx)
    assert err.value.field == field
