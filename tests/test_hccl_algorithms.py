"""HCCL's A3 algorithms (stratacl/comm/hierarchical.py): closed forms of the hierarchical
collectives on an idle fabric, and HCCL's selection rules at their documented boundaries."""

from __future__ import annotations

import math

import pytest
from helpers import make_library
from test_closed_forms import one_op_time

from stratacl.comm import hierarchical as hier
from stratacl.config import Algorithm, DataPath

LAUNCH = 5e-6
STEP = {"node": 0.7e-6 + 1.3e-6, "supernode": 2.1e-6 + 2.1e-6}  # α + flag sync per step
BETA = {"die": 210e9, "node": 170e9, "supernode": 150e9}
MiB = 2**20


def test_hierarchical_allreduce_matches_its_closed_form(cm384) -> None:  # noqa: ANN001
    # 2 servers × 16 dies: double-ring reduce-scatter in the server, NHR all-reduce of 1/16 between
    # the servers (2 servers: one exchange per half), double-ring all-gather in the server. Each
    # ring carries half the buffer and paces at its UB hop; 48 cores keep the ports the bottleneck.
    lib = make_library(cm384, "hccl_zerocopy", algorithm=Algorithm.hierarchical, comm_cores=48)
    n, k, size = 32, 16, 256 * MiB
    ring_stage = (k - 1) * STEP["node"] + (k - 1) * (size / 2 / k) / BETA["node"]
    inter_stage = 2 * STEP["supernode"] + 2 * (size / k / 2) / BETA["supernode"]
    # AI_CPU expansion (SDMA mover): the AI CPU kernel starts once per operator (8 us), each stage's
    # engines start after its first descriptor and the engine start-up
    sdma_start = cm384.sdma_launch_s["aicpu"] + 3 * (cm384.sdma_descriptor_s["aicpu"] + cm384.sdma_startup_s)
    # between the servers one put is in flight: each of the 16 MiB's descriptors (at most
    # descriptor_KiB each) waits the supernode round trip
    inter_waits = math.ceil(size / k / cm384.sdma_descriptor_bytes) * cm384.tiers["supernode"].round_trip_s
    expected = LAUNCH + 2 * ring_stage + inter_stage + inter_waits + sdma_start
    plan = lib.wire_plan("allreduce", size, tuple(range(n)))
    assert plan.algorithm == "hccl:double_ring+nhr" and len(plan.stages) == 3
    assert plan.steps == 2 * (k - 1) + 2
    assert one_op_time(cm384, lib, "allreduce", range(n), size) == pytest.approx(expected, rel=1e-9)


def test_double_ring_sends_half_over_sio(cm384) -> None:  # noqa: ANN001
    # one server: the reverse ring puts every die's second half on its SIO link, so the UB port
    # carries half of what a single ring puts on it
    lib = make_library(cm384, "hccl_zerocopy", algorithm=Algorithm.hierarchical)
    # a single ring all-gather sends (n − 1)/n·S per die over its UB port at the node tier's β
    single_ub = 15 / 16 * 64 * MiB / BETA["node"]
    double = lib.wire_plan("allgather", 64 * MiB, tuple(range(16)))
    assert double.tx_s["ub"] == pytest.approx(single_ub / 2, rel=1e-12)
    # the other half leaves on SIO, paced at the ring's UB hop (the SIO hop is faster, 210 GB/s)
    assert double.tx_s["sio"] == pytest.approx(double.tx_s["ub"])
    assert double.send_bytes == pytest.approx(15 / 16 * 64 * MiB)  # both halves: the ring's bytes


def test_hierarchical_allgather_moves_n_minus_1_chunks(cm384) -> None:  # noqa: ANN001
    lib = make_library(cm384, "hccl_zerocopy", algorithm=Algorithm.hierarchical)
    n, size = 64, 64 * MiB
    plan = lib.wire_plan("allgather", size, tuple(range(n)))
    assert plan.recv_bytes == pytest.approx((n - 1) / n * size)
    assert [s.algorithm for s in plan.stages] == ["nhr", "double_ring"]  # 4 servers: NHR, then in-server
    assert plan.steps == 2 + 15


def _choice(coll: str, size: float, n: int, **kw: object) -> hier.HcclChoice:
    servers = max(1, n // 16)
    return hier.select(coll, size, n, servers, n // servers, paired=True, **kw)


def test_hccl_selection_at_its_boundaries() -> None:
    # allgather small-count: chunk × servers ≤ 1 MiB (SmallCountOptimMultiServer, d % 4 == 0)
    assert _choice("allgather", 32 * 512 * 1024, 32).flat == "hd_stage"
    assert _choice("allgather", 32 * (512 * 1024 + 2), 32).label == "hccl:double_ring+nhr"
    # one server: ≤ 512 KiB per rank
    assert _choice("allgather", 16 * 512 * 1024, 16).flat == "hd_stage"
    assert _choice("allgather", 16 * (512 * 1024 + 2), 16).label == "hccl:double_ring"
    # allreduce: NHR over all ranks up to 1 MiB × dies per server, then double ring + NHR
    assert _choice("allreduce", 16 * MiB, 32).label == "hccl:nhr"
    assert _choice("allreduce", 16 * MiB + 2, 32).label == "hccl:double_ring+nhr"
    # reducescatter on a non-power-of-two rank count: flat RHD up to 256 KiB per rank
    assert _choice("reducescatter", 48 * 256 * 1024, 48).label == "hccl:rhd"
    assert _choice("reducescatter", 48 * (256 * 1024 + 2), 48).label == "hccl:double_ring+ring"
    # level 1 by server count (GetDefaultAlgoLevel1V1; HD → NHR on 910_93)
    assert hier.default_level1(3) == "ring" and hier.default_level1(4) == "nhr"
    assert hier.default_level1(7) == "ring" and hier.default_level1(8) == "nhr"
    assert hier.default_level1(12) == "nhr"
    # HCCL_ALGO override; broadcast supports only NHR/NB between servers
    assert _choice("allreduce", 1e9, 32, configured="ring").level1 == "ring"
    assert _choice("broadcast", 1e9, 32, configured="ring").level1 == "nhr"
    # all-to-all in a supernode: grouped direct full-mesh (AI_CPU), AIV mesh in AIV mode
    assert _choice("alltoall", 1e9, 64).flat == "direct_fullmesh"
    assert _choice("alltoall", 1e9, 64, aiv=True).flat == "mesh"
    assert _choice("alltoall", 1e9, 64, configured="pairwise").flat == "pairwise"
    # AIV cross-node all-gather: ≤ 16 ranks and ≤ 512 KiB, or any ranks and ≤ 32 KiB per rank
    assert _choice("allgather", 16 * 512 * 1024, 16, aiv=True).flat == "mesh"
    assert _choice("allgather", 64 * 32 * 1024, 64, aiv=True).label == "hccl:mesh"
    assert _choice("allgather", 64 * 33 * 1024, 64, aiv=True).flat == "hd_stage"


def test_direct_fullmesh_serves_peers_in_rounds_of_eight(cm384) -> None:  # noqa: ANN001
    lib = make_library(cm384, "hccl_zerocopy")
    for n, rounds in ((16, 2), (32, 4), (64, 8)):
        plan = lib.wire_plan("alltoall", 64 * MiB, tuple(range(n)))
        assert plan.algorithm == "hccl:direct_fullmesh" and plan.steps == rounds
    full = make_library(cm384, "hccl_zerocopy", algorithm=Algorithm.fullmesh).wire_plan(
        "alltoall", 64 * MiB, tuple(range(32)))
    grouped = lib.wire_plan("alltoall", 64 * MiB, tuple(range(32)))
    assert grouped.wire_s == pytest.approx(full.wire_s)  # rounds cost latency, not bytes
    assert grouped.latency_s > 3 * full.latency_s


def test_hccl_is_the_preset_and_flat_algorithms_stay_selectable(cm384) -> None:  # noqa: ANN001
    g = tuple(range(32))
    assert make_library(cm384, "hccl").chosen_algorithm("allreduce", 2**30, g) == "hccl:double_ring+nhr"
    assert make_library(cm384, "hccl", algorithm=Algorithm.ring).chosen_algorithm("allreduce", 2**30, g) == "ring"
    staged = make_library(cm384, "hccl")
    pool = make_library(cm384, "hccl", data_path=DataPath.pool)
    assert one_op_time(cm384, staged, "allgather", range(32), 2**28) > one_op_time(
        cm384, pool, "allgather", range(32), 2**28)
