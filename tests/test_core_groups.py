"""Die-level coupling: kernels on core groups, communication holding cores, SDMA submission,
stream core limits, HCCL expansion modes (issue 12). Closed forms on an idle fabric."""

from __future__ import annotations

import math

import pytest
from helpers import compose_run, make_library

from stratacl.comm import sdma
from stratacl.config import DataPath, ExpansionMode, Mover, validate_library
from stratacl.engine.replay import simulate
from stratacl.errors import ConfigError, TraceError
from stratacl.trace import Trace


@pytest.fixture(scope="module")
def cm384(cm384_ideal):  # noqa: ANN001, ANN201
    """These tests check the engine's sharing with closed forms that price compute as the ideal
    kernel (roofline); the achieved-throughput kernel model is tested in test_kernel_model.py."""
    return cm384_ideal

T = 1e-3  # a kernel's time alone on the whole die
BETA_NODE = 170e9
PRE_WIRE = 5e-6 + 0.7e-6 + 1.3e-6  # vector mover: launch + tier α + flag sync before the wire phase


def _kernel(tr: Trace, fab, core: str, ranks=(0,), stream: str = "compute", **kw) -> int:  # noqa: ANN001
    if core == "mixed":  # cube-bound group time T, vector part half of it
        return tr.compute(list(ranks), flops=fab.cube_flops * T, vector_flops=fab.vector_flops * T / 2,
                          core="mixed", stream=stream, **kw)
    peak = fab.cube_flops if core == "cube" else fab.vector_flops
    return tr.compute(list(ranks), flops=peak * T, core=core, stream=stream, **kw)


def _beside_transfer(fab, lib, core: str) -> float:  # noqa: ANN001
    """Duration of a kernel on die 0 beside a long p2p transfer from die 0 (14 ms on the wire)."""
    tr = Trace(world_size=16)
    tr.add("p2p", [0, 2], src=[0], dst=[2], nbytes=2**31, stream="comm")
    k = _kernel(tr, fab, core)
    res = simulate(tr, lib, check=True)
    assert res.max_violation <= 1e-9
    return float(res.end[k] - res.start[k])


@pytest.mark.parametrize("held", [12, 24, 36])
def test_mixed_kernel_loses_the_core_groups_a_comm_kernel_holds(cm384, held) -> None:  # noqa: ANN001
    lib = make_library(cm384, data_path=DataPath.pool, mover=Mover.vector_cores, comm_cores=held)
    # full speed until the transfer's wire phase holds `held` of 48 AIVs, then the complete
    # groups left: rate 1 − held/48 for the rest of its work
    rate = 1 - held / cm384.vector_cores
    expected = PRE_WIRE + (T - PRE_WIRE) / rate
    assert _beside_transfer(cm384, lib, "mixed") == pytest.approx(expected, rel=1e-9)


def test_cube_kernel_is_not_slowed_by_held_vector_cores(cm384) -> None:  # noqa: ANN001
    lib = make_library(cm384, data_path=DataPath.pool, mover=Mover.vector_cores, comm_cores=36)
    assert _beside_transfer(cm384, lib, "cube") == pytest.approx(T, rel=1e-12)
    assert _beside_transfer(cm384, lib, "mixed") > 3 * T  # the same hold takes 3/4 of the groups


def test_mixed_kernel_shares_cube_units_with_a_cube_kernel(cm384) -> None:  # noqa: ANN001
    lib = make_library(cm384, data_path=DataPath.pool, mover=Mover.vector_cores)
    tr = Trace(world_size=2)
    a = _kernel(tr, cm384, "mixed", stream="s0")
    b = _kernel(tr, cm384, "cube", stream="s1")
    c = _kernel(tr, cm384, "vector", ranks=(1,), stream="s0")  # another die: unaffected
    res = simulate(tr, lib, check=True)
    # both need all AICs: max-min gives each half until both end together
    assert res.end[a] == pytest.approx(2 * T, rel=1e-12) and res.end[b] == pytest.approx(2 * T, rel=1e-12)
    assert res.end[c] == pytest.approx(T, rel=1e-12)


def _sdma_lib(fab, **kw):  # noqa: ANN001, ANN202
    return make_library(fab, "stratacl", data_path=DataPath.pool, **kw)


@pytest.mark.parametrize("nbytes", [2**20, 2**26])
def test_sdma_holds_cores_only_while_writing_descriptors(cm384, nbytes) -> None:  # noqa: ANN001
    lib = _sdma_lib(cm384)
    tr = Trace(world_size=16)
    tr.add("p2p", [0, 2], src=[0], dst=[2], nbytes=nbytes, stream="comm")
    k = _kernel(tr, cm384, "mixed")
    res = simulate(tr, lib, check=True)
    # the descriptors: one per 256 KiB transfer unit (node tier) + one completion; 4 cores write them
    n_desc = math.ceil(nbytes / (256 * 1024)) + 1
    agents = min(4, n_desc)
    write_s = math.ceil(n_desc / agents) * cm384.sdma_descriptor_s["device"]
    assert res.core_s[0] == pytest.approx(agents * write_s, rel=1e-9)  # core-seconds = writing only
    # the mixed kernel loses exactly the group-time those cores were held
    assert res.end[k] - res.start[k] == pytest.approx(T + agents / cm384.vector_cores * write_s, rel=1e-9)
    vec = simulate(tr, make_library(cm384, "stratacl", data_path=DataPath.pool, mover=Mover.vector_cores))
    assert res.core_s[0] < 0.05 * vec.core_s[0]


def test_sdma_descriptor_count_follows_units_and_steps(cm384) -> None:  # noqa: ANN001
    lib = _sdma_lib(cm384)
    g = tuple(range(32))
    plan = lib.wire_plan("allgather", 32 * 2**20, g)  # full mesh: 31 peers × 1 MiB
    units = {0: 256 * 1024, 1: 256 * 1024, 2: 512 * 1024}
    # die and node peers (15) move 1 MiB in 4 units, inter-node peers (16) in 2; one tail flag each
    assert sdma.descriptors(plan, cm384, units) == 15 * 4 + 16 * 2 + 31
    sub = sdma.submission(plan, cm384, "device", 4, units)
    assert sub.total_s == pytest.approx(math.ceil(123 / 4) * cm384.sdma_descriptor_s["device"])
    aicpu = cm384.sdma_descriptor_s["aicpu"]  # one writer whatever the cores asked for
    assert sdma.submission(plan, cm384, "aicpu", 4, units).total_s == pytest.approx(123 * aicpu)


def test_stream_limits_cap_a_kernels_cores(cm384) -> None:  # noqa: ANN001
    lib = make_library(cm384, data_path=DataPath.pool, mover=Mover.vector_cores)
    tr = Trace(world_size=2)
    tr.limit_stream("attn", 16, 32)
    tr.limit_stream("moe", 8, 16)
    a = _kernel(tr, cm384, "mixed", stream="attn")
    b = _kernel(tr, cm384, "mixed", stream="moe")
    c = _kernel(tr, cm384, "cube", stream="moe", block_dim=4)  # after b: blockDim 4 of the 8 AICs
    d = _kernel(tr, cm384, "vector", ranks=(1,), stream="free", block_dim=12)  # die 1: 12 of 48 AIVs
    res = simulate(tr, lib, check=True)
    assert res.end[a] == pytest.approx(T * 24 / 16, rel=1e-12)  # disjoint splits: no interference
    assert res.end[b] == pytest.approx(T * 24 / 8, rel=1e-12)
    assert res.end[c] - res.start[c] == pytest.approx(T * 24 / 4, rel=1e-12)
    assert res.end[d] - res.start[d] == pytest.approx(T * 48 / 12, rel=1e-9)
    # a library preset that drops the split gives every kernel the whole die
    free = simulate(tr, make_library(cm384, data_path=DataPath.pool, mover=Mover.vector_cores,
                                     stream_core_split=False))
    assert free.end[a] == pytest.approx(2 * T, rel=1e-12)  # a and b now share all groups


def test_stream_limit_caps_the_cores_a_comm_kernel_holds(cm384) -> None:  # noqa: ANN001
    lib = make_library(cm384, data_path=DataPath.pool, mover=Mover.vector_cores, comm_cores=24)
    tr = Trace(world_size=16)
    tr.limit_stream("comm", 8, 16)
    tr.add("p2p", [0, 2], src=[0], dst=[2], nbytes=2**30, stream="comm")
    res = simulate(tr, lib)
    wire = res.split["wire"][0]
    assert res.core_s[0] == pytest.approx(16 * wire, rel=1e-9)  # 16 AIVs held, not 24


def test_mixed_kernel_needs_whole_groups_in_its_stream_limit(cm384) -> None:  # noqa: ANN001
    tr = Trace(world_size=1)
    tr.limit_stream("tiny", 4, 1)
    _kernel(tr, cm384, "mixed", stream="tiny")
    with pytest.raises(TraceError, match="no mixed core"):
        simulate(tr, make_library(cm384, data_path=DataPath.pool))


def test_hccl_expansion_modes_pick_the_mover(cm384) -> None:  # noqa: ANN001
    ai_cpu = make_library(cm384, "hccl", data_path=DataPath.pool)
    aiv = make_library(cm384, "hccl", data_path=DataPath.pool, expansion_mode=ExpansionMode.aiv)
    assert ai_cpu.mover == Mover.sdma and aiv.mover == Mover.vector_cores
    tr = Trace(world_size=32)
    tr.add_family("g", [range(32)])
    tr.collective("allgather", "g", 2**26)
    a, v = simulate(tr, ai_cpu), simulate(tr, aiv)
    assert a.core_s[0] == 0.0 and v.core_s[0] > 0.0  # AI_CPU holds no AI core, AIV does
    assert a.split["launch"][0] > v.split["launch"][0]  # AI CPU dispatch + task writes: static overhead


def test_expansion_mode_contradicted_by_an_explicit_mover_is_a_config_error() -> None:
    cfg = compose_run(["library=[hccl]", "library.hccl.mover=sdma", "library.hccl.expansion_mode=aiv"])
    with pytest.raises(ConfigError, match="contradicts expansion_mode"):
        validate_library("hccl", cfg.library["hccl"], cfg.fabric)


def test_staging_copies_run_on_the_mover(cm384) -> None:  # noqa: ANN001
    tr = Trace(world_size=32)
    tr.add_family("g", [range(32)])
    tr.collective("allgather", "g", 2**28)
    sd = simulate(tr, make_library(cm384, "hccl"))  # AI_CPU: SDMA memcpy tasks, no core held
    av = simulate(tr, make_library(cm384, "hccl", expansion_mode=ExpansionMode.aiv))
    assert sd.copy_bytes[0] == av.copy_bytes[0] > 0
    assert sd.core_s[0] == 0.0
    # AIV: the comm kernel's 24 cores are held during the copies as well as the transfer
    assert av.core_s[0] == pytest.approx(24 * (av.split["copy"][0] + av.split["wire"][0]), rel=1e-9)
