"""Fluid sharing on the fabric: ports, HBM and cores are shared as the physics says."""

from __future__ import annotations

import pytest
from helpers import make_library

from stratacl.config import DataPath, Mover
from stratacl.engine.replay import simulate
from stratacl.trace import Trace, stream_predecessors


@pytest.fixture(scope="module")
def cm384(cm384_ideal):  # noqa: ANN001, ANN201
    """These tests check the engine's sharing with closed forms that price compute as the ideal
    kernel (roofline); the achieved-throughput kernel model is tested in test_kernel_model.py."""
    return cm384_ideal

BETA_NODE = 170e9
ALPHA_NODE = 5e-6 + 0.7e-6 + 1.3e-6  # launch + tier α + flag sync before the wire phase


def test_two_equal_transfers_through_one_port_each_get_half(cm384) -> None:  # noqa: ANN001
    lib = make_library(cm384, data_path=DataPath.pool, mover=Mover.vector_cores)
    nbytes = 2**28
    tr = Trace(world_size=16)
    tr.add("p2p", [0, 2], src=[0], dst=[2], nbytes=nbytes, stream="a")
    tr.add("p2p", [0, 4], src=[0], dst=[4], nbytes=nbytes, stream="b")
    res = simulate(tr, lib, check=True)
    alone = nbytes / BETA_NODE
    for i in range(2):
        assert res.end[i] - res.start[i] == pytest.approx(ALPHA_NODE + 2 * alone, rel=1e-9)
    assert res.max_violation <= 1e-9


def test_transfers_on_different_ports_do_not_interfere(cm384) -> None:  # noqa: ANN001
    lib = make_library(cm384, data_path=DataPath.pool, mover=Mover.vector_cores)
    tr = Trace(world_size=16)
    tr.add("p2p", [0, 2], src=[0], dst=[2], nbytes=2**28, stream="a")
    tr.add("p2p", [4, 6], src=[4], dst=[6], nbytes=2**28, stream="b")
    res = simulate(tr, lib)
    assert res.end[0] == pytest.approx(res.end[1]) == pytest.approx(ALPHA_NODE + 2**28 / BETA_NODE)


def test_staging_copy_and_memory_bound_kernel_share_hbm(cm384) -> None:  # noqa: ANN001
    lib = make_library(cm384, data_path=DataPath.pool, mover=Mover.vector_cores)
    hbm = cm384.hbm_Bps
    nbytes = 2**30  # a copy reads + writes: 2·nbytes of HBM traffic
    tr = Trace(world_size=2)
    tr.add("memcpy", [0], nbytes=nbytes, stream="copy")
    tr.compute([0], flops=1e6, hbm_bytes=2 * nbytes, core="vector", stream="compute")
    res = simulate(tr, lib, check=True)
    alone = 2 * nbytes / hbm
    # equal HBM demand: each runs at half bandwidth for its whole life
    assert res.end[0] == pytest.approx(2 * alone, rel=1e-9)
    assert res.end[1] == pytest.approx(2 * alone, rel=1e-9)


def test_transfer_holding_vector_cores_slows_vector_compute(cm384) -> None:  # noqa: ANN001
    lib = make_library(cm384, data_path=DataPath.pool, mover=Mover.vector_cores, comm_cores=24)
    tr = Trace(world_size=16)
    tr.add("p2p", [0, 2], src=[0], dst=[2], nbytes=2**31, stream="comm")  # ~12.6 ms on the wire
    flops = cm384.vector_flops * 1e-3  # 1 ms alone on all 48 vector cores
    tr.compute([0], flops=flops, core="vector", stream="compute")
    res = simulate(tr, lib, check=True)
    # after the transfer's α (kernel at full speed), it holds 24 of 48 vector cores: the kernel
    # runs on half of them for the rest
    assert res.end[1] - res.start[1] == pytest.approx(ALPHA_NODE + 2 * (1e-3 - ALPHA_NODE), rel=1e-9)
    # the same kernel beside an SDMA transfer keeps all its cores
    sdma = make_library(cm384, data_path=DataPath.pool, mover=Mover.sdma)
    res2 = simulate(tr, sdma, check=True)
    assert res2.end[1] - res2.start[1] == pytest.approx(1e-3, rel=1e-9)


def test_cube_compute_is_not_slowed_by_vector_core_transfer(cm384) -> None:  # noqa: ANN001
    lib = make_library(cm384, data_path=DataPath.pool, mover=Mover.vector_cores)
    tr = Trace(world_size=16)
    tr.add("p2p", [0, 2], src=[0], dst=[2], nbytes=2**31, stream="comm")
    tr.compute([0], flops=cm384.cube_flops * 1e-3, core="cube", stream="compute")
    res = simulate(tr, lib)
    assert res.end[1] - res.start[1] == pytest.approx(1e-3, rel=1e-9)


def test_bytes_conserved_and_causality(cm384) -> None:  # noqa: ANN001
    lib = make_library(cm384, "hccl")
    tr = Trace(world_size=32)
    tr.add_family("g", [range(0, 16), range(16, 32)])
    a = tr.collective("allreduce", "g", 2**24, stream="comm")
    b = tr.compute(range(32), flops=1e12, hbm_bytes=1e9, stream="compute")
    c = tr.collective("allgather", "g", 2**22, stream="comm", deps=[b])
    tr.add("p2p", range(32), src=range(16), dst=range(16, 32), nbytes=2**20, deps=[a, c])
    res = simulate(tr, lib, check=True)
    assert res.work_error < 1e-9  # every fluid activity integrated exactly its work
    preds = stream_predecessors(tr)
    for i, ps in enumerate(preds):
        for p in ps:
            assert res.start[i] >= res.end[p] - 1e-15
    # wire bytes of the allreduce = ring formula 2(n-1)/n·S per rank, summed over 32 ranks
    assert res.wire_bytes[a] == pytest.approx(2 * 15 / 16 * 2**24 * 32)
