"""Idle-fabric operator times equal the α–β closed forms; busbw factors follow nccl-tests."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import make_library

from stratacl.config import Algorithm, DataPath, Mover
from stratacl.engine.replay import simulate
from stratacl.metrics import busbw_factor
from stratacl.trace import Trace

# StrataCL Table 1 tiers as configured in conf/fabric/cloudmatrix384.yaml; a synchronised step
# costs the tier's α plus its flag-write sync (2506.12708 Table 1)
ALPHA = {"die": 0.2e-6 + 0.5e-6, "node": 0.7e-6 + 1.3e-6, "supernode": 2.1e-6 + 2.1e-6}
LAUNCH = 5e-6  # per-operator kernel launch (conf/library/*.yaml)
BETA = {"die": 210e9, "node": 170e9, "supernode": 150e9}


def one_op_time(fabric, lib, coll: str, ranks: range, size: float) -> float:  # noqa: ANN001
    tr = Trace(world_size=max(ranks) + 1)
    tr.add_family("g", [ranks])
    tr.collective(coll, "g", size)
    res = simulate(tr, lib)
    return float(res.end[0] - res.start[0])


@pytest.fixture()
def zero_copy_ring(cm384):  # noqa: ANN001
    return make_library(cm384, data_path=DataPath.pool, algorithm=Algorithm.ring, mover=Mover.vector_cores)


@pytest.mark.parametrize("n, tier", [(8, "node"), (16, "node"), (32, "supernode")])
@pytest.mark.parametrize("size", [64 * 1024, 16 * 2**20, 2**30])
def test_ring_allreduce_closed_form(cm384, zero_copy_ring, n, tier, size) -> None:  # noqa: ANN001
    # a ring over contiguous dies is paced by its slowest hop: intra-node inside a node,
    # inter-node once it spans two nodes
    expected = LAUNCH + 2 * (n - 1) * ALPHA[tier] + 2 * (n - 1) / n * size / BETA[tier]
    assert one_op_time(cm384, zero_copy_ring, "allreduce", range(n), size) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("coll", ["allgather", "reducescatter"])
def test_ring_allgather_reducescatter_take_n_minus_1_steps(cm384, zero_copy_ring, coll) -> None:  # noqa: ANN001
    n, size = 32, 64 * 2**20
    expected = LAUNCH + (n - 1) * ALPHA["supernode"] + (n - 1) / n * size / BETA["supernode"]
    assert one_op_time(cm384, zero_copy_ring, coll, range(n), size) == pytest.approx(expected, rel=1e-9)


def test_fullmesh_is_one_step_over_mixed_tiers(cm384) -> None:  # noqa: ANN001
    # enough cores, balanced among the 31 peers, that the ports are the bottleneck
    lib = make_library(cm384, "stratacl", data_path=DataPath.pool, algorithm=Algorithm.fullmesh,
                       mover=Mover.vector_cores, comm_cores=48, fanout_cap=8)
    n, size = 32, 256 * 2**20
    chunk = size / n
    # rank 0's peers: 1 on its package (SIO plane), 14 in its node, 16 in the other node (UB plane)
    ub = 14 * chunk / BETA["node"] + 16 * chunk / BETA["supernode"]
    sio = chunk / BETA["die"]
    expected = LAUNCH + ALPHA["supernode"] + max(ub, sio)
    assert one_op_time(cm384, lib, "allgather", range(n), size) == pytest.approx(expected, rel=1e-9)
    # allreduce = reduce-scatter exchange + all-gather exchange
    expected_ar = LAUNCH + 2 * ALPHA["supernode"] + 2 * max(ub, sio)
    assert one_op_time(cm384, lib, "allreduce", range(n), size) == pytest.approx(expected_ar, rel=1e-9)


def test_p2p_closed_form(cm384) -> None:  # noqa: ANN001
    lib = make_library(cm384, data_path=DataPath.pool, mover=Mover.vector_cores)
    tr = Trace(world_size=32)
    tr.add("p2p", [0, 20], src=[0], dst=[20], nbytes=2**26)
    res = simulate(tr, lib)
    assert res.end[0] == pytest.approx(LAUNCH + ALPHA["supernode"] + 2**26 / BETA["supernode"], rel=1e-9)


def test_staged_allgather_copies_one_plus_n_times_m(cm384) -> None:  # noqa: ANN001
    lib = make_library(cm384, "hccl")
    n, m = 32, 4 * 2**20  # M bytes per rank, S = N·M
    tr = Trace(world_size=n)
    tr.add_family("g", [range(n)])
    tr.collective("allgather", "g", n * m)
    res = simulate(tr, lib)
    assert res.copy_bytes[0] == pytest.approx((1 + n) * m * n)  # per rank (1+N)·M, summed over ranks


@pytest.mark.parametrize("coll, n, factor", [
    ("allreduce", 8, 2 * 7 / 8), ("allgather", 8, 7 / 8), ("reducescatter", 32, 31 / 32),
    ("alltoall", 32, 31 / 32), ("broadcast", 16, 1.0),
])
def test_busbw_factors(coll, n, factor) -> None:  # noqa: ANN001
    assert busbw_factor(coll, n) == pytest.approx(factor)


def test_bigger_messages_never_lower_busbw_on_idle_ring(cm384, zero_copy_ring) -> None:  # noqa: ANN001
    sizes = [2**k for k in range(16, 31, 2)]
    bw = [s / one_op_time(cm384, zero_copy_ring, "allreduce", range(32), s) for s in sizes]
    assert np.all(np.diff(bw) > 0)
