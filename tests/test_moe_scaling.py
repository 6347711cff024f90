"""MoE dispatch/combine across EP sizes from the same mechanisms (per-peer / per-window start-ups,
count exchange, signalling round trips, the host in the loop)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from helpers import compose_run, make_library

from stratacl.comm import sdma
from stratacl.comm.ep import MoeOp
from stratacl.engine.replay import simulate
from stratacl.machine.fabric import Fabric
from workloads.moe.workload import build_trace


def _busbw(fab: Fabric, preset: str, ep: int, mode: str, coll: str = "dispatch") -> float:
    cfg = compose_run(["workload=moe", f"workload.ep={ep}", "workload.iters=1", "workload.warmup=1"]).workload
    trace, points = build_trace(cfg, mode, seed=0)
    res = simulate(trace, make_library(fab, preset))
    p = next(p for p in points if p["kind"] == coll and p["measured"])  # after first-use registration
    return p["recv_bytes_mean"] / float(res.end[p["op"]] - res.start[p["op"]]) / 1e9


def _flat_fabric(fab: Fabric, alpha_us: float) -> Fabric:
    """Every tier at the same β (and α): what is left of an EP trend is per-peer overhead."""
    cfg = copy.deepcopy(fab.cfg)
    for name in ("node", "supernode"):
        cfg.tiers[name].beta_GBps = 150.0
        cfg.tiers[name].alpha_us = alpha_us
        cfg.tiers[name].sync_us = alpha_us
    return Fabric(cfg)


def test_busbw_falls_with_ep_for_fixed_tokens_per_rank(cm384) -> None:  # noqa: ANN001
    # balanced core partitioning (no core-group discretisation), every tier at one β: what changes
    # with EP is the number of peers — each a window start-up and a completion flag on the cores
    eps = (8, 16, 32, 64, 128)
    with_overhead = [_busbw(_flat_fabric(cm384, 2.1), "stratacl_no_sdma", ep, "ll") for ep in eps]
    assert all(b < a for a, b in zip(with_overhead, with_overhead[1:], strict=False)), with_overhead
    without = [_busbw(_flat_fabric(cm384, 0.0), "stratacl_no_sdma", ep, "ll") for ep in eps]
    # the share of the time per-peer overhead costs grows with the number of peers
    loss = [1 - w / o for w, o in zip(with_overhead, without, strict=True)]
    assert loss[-1] > loss[0] > 0, loss


def test_ll_windows_cost_start_ups_on_vector_cores(cm384) -> None:  # noqa: ANN001
    # LL writes one window per expert hit: with 8 experts per rank (EP32) a peer's ~4 copies land
    # in ~3.7 windows, each a start-up; the same bytes as one packed window are cheaper (the
    # per-expert window model; the cann_ep preset stores every copy on its own, checked last)
    lib = make_library(cm384, "cann_ep", moe_ll_windows="per_expert")
    g = tuple(range(32))
    peer = np.full((32, 32), 4 * 7680.0)
    np.fill_diagonal(peer, 0.0)
    flat = tuple(peer.ravel())
    size = float(peer.sum(axis=1).max())
    packed = sum(p.standalone_s() for p in lib.collective_phases("dispatch", size, g, flat, "ll"))
    windows = sum(p.standalone_s() for p in lib.collective_phases("dispatch", size, g, flat, "ll",
                                                                    moe=MoeOp("ll", 7680.0, 8)))
    plan = lib.wire_plan("dispatch", size, g, flat, moe=MoeOp("ll", 7680.0, 8))
    assert set(plan.peer_copies) == {3}  # 4 copies over 8 experts hit 8·(1 − (7/8)^4) = 3.3 of them
    assert windows > packed
    assert lib.ctx.transfer_windows(plan) == 31 * 3 + 31  # windows + one completion flag per peer
    # an SDMA lowering writes at least one descriptor per window: 3 per peer here (30 KiB each, far
    # under one descriptor's length) + one completion per peer
    packed_plan = lib.wire_plan("dispatch", size, g, flat)
    assert sdma.descriptors(packed_plan, cm384) == 31 + 31
    assert sdma.descriptors(plan, cm384) == 31 * 3 + 31 == lib.ctx.transfer_windows(plan)
    per_copy = make_library(cm384, "cann_ep").wire_plan("dispatch", size, g, flat, moe=MoeOp("ll", 7680.0, 8))
    assert set(per_copy.peer_copies) == {4}  # one store per token copy


def test_the_host_in_the_loop(cm384) -> None:  # noqa: ANN001
    g = tuple(range(32))
    hccl, deepep, cann, sc = (make_library(cm384, p) for p in ("hccl", "deepep", "cann_ep", "stratacl"))
    assert hccl.needs_host("alltoallv") and not hccl.needs_host("alltoall")
    assert deepep.needs_host("dispatch", "ht") and not deepep.needs_host("dispatch", "ll")
    assert not deepep.needs_host("combine", "ht")
    assert not cann.needs_host("dispatch", "ht") and not sc.needs_host("dispatch", "ll")
    # a host round trip sits on the operator's critical path
    t = {p: sum(ph.standalone_s() for ph in deepep.collective_phases("dispatch", 2**20, g, (), p)) for p in ("ht", "ll")}
    split = [ph for ph in deepep.collective_phases("dispatch", 2**20, g, (), "ht") if ph.is_delay]
    assert any(c == "host" for ph in split for c, _ in (ph.parts or ((ph.category, ph.delay_s),)))
    assert t["ht"] > t["ll"]
    # decode step with 61 MoE layers: device-driven = one graph launch; HCCL all-to-all-v needs the
    # host in every dispatch and combine, so the step runs eagerly: no launch, 122 round trips
    def syncs(lib, mode: str) -> int:  # noqa: ANN001 - host-synchronising operators of the step
        return 61 * sum(lib.needs_host(c, mode) for c in ("dispatch", "combine"))

    assert (syncs(sc, "ll"), syncs(hccl, "ll"), syncs(deepep, "ll"), syncs(deepep, "ht")) == (0, 122, 0, 61)
    assert sc.step_graph_launch_s(0) == pytest.approx(700e-6) == deepep.step_graph_launch_s(0)
    assert hccl.step_graph_launch_s(122) == 0.0 == deepep.step_graph_launch_s(61)
