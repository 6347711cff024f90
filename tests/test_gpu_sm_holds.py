"""SMs held by communication on GPU dies (issue 22 item 4), through the core mechanism Ascend dies
use: a communication kernel holds its SMs (`comm_cores`: NCCL's channels, DeepEP's num_sms) while it
moves data and an overlapped compute kernel runs on the rest. Closed forms on hgx_h800 (132 SMs, a
memory-bound kernel reaches the HBM rate on hbm_saturation_cores = 66 of them):
- compute-bound: its time while overlapped × C / (C − h);
- memory-bound: unchanged while C − h ≥ sat, else × sat / (C − h)."""

from __future__ import annotations

import pytest
from helpers import compose_run, make_library

from stratacl.config import DataPath
from stratacl.engine.replay import simulate
from stratacl.machine.fabric import Fabric
from stratacl.machine.kernel_model import kernel_model
from stratacl.trace import Trace

WAIT = 200e-6  # the kernel starts after this on its stream: the comm kernel already holds its SMs


@pytest.fixture(scope="module")
def h800() -> Fabric:
    return Fabric(compose_run(["fabric=hgx_h800"]).fabric)


def _kernel(tr: Trace, fab: Fabric, bound: str) -> int:
    tr.compute([0], fixed_time_s=WAIT, stream="compute")
    if bound == "compute":  # a GEMM of 1 ms at peak: compute-bound
        return tr.compute([0], flops=fab.cube_flops * 1e-3, hbm_bytes=1e6, core="cube", stream="compute")
    return tr.compute([0], flops=1e6, hbm_bytes=fab.hbm_Bps * 1e-3, core="vector", kernel="elementwise",
                      stream="compute")


def _beside_comm(fab: Fabric, bound: str, held: int, comm: str) -> tuple[float, float]:
    """(kernel time beside a communication kernel holding `held` SMs, the kernel's part alone)."""
    lib = make_library(fab, "nccl", data_path=DataPath.pool, comm_cores=held)
    tr = Trace(world_size=16)
    tr.add_family("w", [range(16)])
    if comm == "p2p":  # die 0 sends 2 GiB to the next node over its NIC: 43 ms
        tr.add("p2p", [0, 8], src=[0], dst=[8], nbytes=2**31, stream="comm")
    else:  # a two-node all-gather of 1 GiB per rank
        tr.collective("allgather", "w", 2**30, stream="comm")
    k = _kernel(tr, fab, bound)
    res = simulate(tr, lib, check=True)
    assert res.max_violation <= 1e-9 and res.end[0] > res.end[k]  # overlapped for its whole time
    km = kernel_model(fab)
    kt = km.price(tr.ops[k], 1.0, fab.cube_peak(""), fab.vector_flops, fab.cube_format(""))
    return float(res.end[k] - res.start[k] - km.launch_s), kt.alone_s


@pytest.mark.parametrize("comm", ["p2p", "allgather"])
@pytest.mark.parametrize("held", [20, 66, 100])
def test_compute_bound_kernel_runs_on_the_sms_left(h800, held, comm) -> None:  # noqa: ANN001
    t, alone = _beside_comm(h800, "compute", held, comm)
    assert t == pytest.approx(alone * 132 / (132 - held), rel=1e-9)  # e.g. 20 held: × 132/112


@pytest.mark.parametrize("held", [20, 66])
def test_memory_bound_kernel_above_saturation_is_not_slowed(h800, held) -> None:  # noqa: ANN001
    t, alone = _beside_comm(h800, "memory", held, "p2p")
    assert t == pytest.approx(alone, rel=1e-9)


@pytest.mark.parametrize("held", [80, 100, 120])
def test_memory_bound_kernel_below_saturation_gets_its_share_of_hbm(h800, held) -> None:  # noqa: ANN001
    t, alone = _beside_comm(h800, "memory", held, "p2p")
    assert t == pytest.approx(alone * 66 / (132 - held), rel=1e-9)


def test_the_hold_lasts_the_comm_kernels_transfer(h800) -> None:  # noqa: ANN001
    """SM-seconds held = SMs × the transfer (its synchronised steps before it are a delay)."""
    lib = make_library(h800, "nccl", data_path=DataPath.pool, comm_cores=20)
    tr = Trace(world_size=16)
    tr.add_family("w", [range(16)])
    tr.collective("allgather", "w", 2**20)
    res = simulate(tr, lib)
    assert res.core_s[0] == pytest.approx(20 * res.split["wire"][0], rel=1e-9)
