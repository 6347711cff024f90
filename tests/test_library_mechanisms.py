"""One test (at least) per library mechanism of docs/architecture.md / REFERENCE §3-4 (docs/sources.md)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from helpers import compose_run, make_library

from stratacl.comm import partition
from stratacl.comm.context import DEFAULT_UNIT_KiB
from stratacl.comm.datapath import DATA_PATHS, staging_bytes
from stratacl.comm.families import FAMILIES
from stratacl.comm.movers import MOVERS
from stratacl.config import (
    Algorithm,
    DataPath,
    ExpansionMode,
    Mover,
    Partitioning,
    RegistrationMechanism,
)
from stratacl.engine.replay import simulate
from stratacl.machine.fabric import Fabric
from stratacl.memory import JitRegistrationCache, NoRegistration, RegistrationOnAllocation
from stratacl.trace import Trace


@pytest.fixture(scope="module")
def cm384(cm384_ideal):  # noqa: ANN001, ANN201
    """These tests check the engine's sharing with closed forms that price compute as the ideal
    kernel (roofline); the achieved-throughput kernel model is tested in test_kernel_model.py."""
    return cm384_ideal


def _one(lib, coll: str, n: int, size: float, buffer: str = "buf"):  # noqa: ANN001, ANN202
    tr = Trace(world_size=n)
    tr.add_family("g", [range(n)])
    tr.collective(coll, "g", size, buffer=buffer)
    return simulate(tr, lib)


# ------------------------------------------------------------------ data paths
def test_staging_traffic_allgather_is_one_plus_n_times_m() -> None:
    n, m = 32, 1000.0
    cin, cout = staging_bytes("allgather", n * m, n)
    assert cin + cout == pytest.approx((1 + n) * m)


def test_every_mechanism_choice_has_its_class() -> None:
    assert set(DATA_PATHS) == set(DataPath) and set(MOVERS) == set(Mover) and set(FAMILIES) == set(Algorithm)
    assert all(DATA_PATHS[k].kind == k for k in DataPath) and all(MOVERS[k].kind == k for k in Mover)


@pytest.mark.parametrize(("path", "mechanism"), [
    (DataPath.staged, RegistrationMechanism.none), (DataPath.pool, RegistrationMechanism.none),
    (DataPath.jit_register, RegistrationMechanism.jit), (DataPath.on_alloc, RegistrationMechanism.on_alloc)])
def test_what_each_data_path_holds_and_registers(cm384, path, mechanism) -> None:  # noqa: ANN001
    """Staged: two 200 MiB CCL buffers per communicator (HCCL_BUFFSIZE) and nothing registered at
    run time; pool: its 1.72 GB outside the allocator, expandable segments off; JIT / on-alloc:
    nothing held, their registration listening to the allocator."""
    lib = make_library(cm384, "hccl", data_path=path, comm_buffer_MiB=200.0, comm_buffers=2, pool_GB=1.72)
    assert lib.user_buffer_registration is mechanism
    staged, pool = path == DataPath.staged, path == DataPath.pool
    assert lib.held_memory_bytes(3) == (3 * 2 * 200 * 2**20 if staged else 1.72e9 if pool else 0.0)
    assert lib.forces_expandable_segments_off == pool
    die = lib.die_memory(64e9, peers=15)
    expected = {RegistrationMechanism.jit: JitRegistrationCache, RegistrationMechanism.on_alloc: RegistrationOnAllocation,
                RegistrationMechanism.none: NoRegistration}[mechanism]
    assert type(die.registrar) is expected


def test_staged_payload_larger_than_buffer_runs_in_rounds(cm384) -> None:  # noqa: ANN001
    lib = make_library(cm384, "hccl", comm_buffer_MiB=16.0, algorithm=Algorithm.ring)
    # a 32-die ring spans two nodes: 2·31 steps of the inter-node α 2.1 µs + flag sync 2.1 µs
    ring_sync = 2 * 31 * (2.1e-6 + 2.1e-6)
    phases = lib.collective_phases("allreduce", 64e6, tuple(range(32)))
    assert _sync_s(phases) == pytest.approx(4 * ring_sync)  # 64 MB / 16 MB buffer = 4 rounds, a sync each
    one = lib.collective_phases("allreduce", 16e6, tuple(range(32)))
    assert _sync_s(one) == pytest.approx(ring_sync)


@pytest.mark.parametrize(("size", "rounds"), [
    (205e6, 1),  # between 200e6 B and 200 MiB (209.7e6 B): fits one HCCL_BUFFSIZE=200 buffer
    (200 * 2**20, 1), (200 * 2**20 + 1, 2), (2 * 200 * 2**20, 2), (2 * 200 * 2**20 + 1, 3),
    (2**30, 6),  # 1 GiB = 5.12 buffers of 200 MiB
])
def test_staging_rounds_count_the_buffer_in_MiB(cm384, size, rounds) -> None:  # noqa: ANN001
    """HCCL_BUFFSIZE is in MiB (CANN: unit M, 200 by default): an allreduce whose per-rank copy is
    S bytes runs ceil(S / (200 * 2^20)) rounds of the algorithm's synchronised steps."""
    lib = make_library(cm384, "hccl", algorithm=Algorithm.ring)
    assert lib.cfg.comm_buffer_MiB == 200.0
    group = tuple(range(8))
    plan = lib.wire_plan("allreduce", size, group)
    assert _sync_s(lib.collective_phases("allreduce", size, group)) == pytest.approx(rounds * plan.latency_s)


def _sync_s(phases) -> float:  # noqa: ANN001
    """Sync time of a phase list, also inside merged delays (which keep their parts)."""
    return sum(sec for p in phases for cat, sec in (p.parts or ((p.category, p.delay_s),)) if cat == "sync")


def test_staging_copies_cost_time_and_pool_does_not(cm384) -> None:  # noqa: ANN001
    staged = _one(make_library(cm384, "hccl"), "allgather", 32, 2**28)
    pool = _one(make_library(cm384, "hccl_zerocopy"), "allgather", 32, 2**28)
    assert staged.copy_bytes[0] > 0 and pool.copy_bytes[0] == 0
    assert staged.split["copy"][0] > 0 and pool.split["copy"][0] == 0
    assert staged.end[0] > pool.end[0]


def test_pipelined_staging_hides_most_of_the_copy(cm384) -> None:  # noqa: ANN001
    plain = _one(make_library(cm384, "hccl"), "allgather", 32, 2**28)
    piped = _one(make_library(cm384, "hccl", pipeline_chunks=8), "allgather", 32, 2**28)
    assert piped.split["copy"][0] == pytest.approx(plain.split["copy"][0] / 8, rel=0.05)
    assert piped.end[0] < plain.end[0]


@pytest.mark.parametrize(("n", "expected_us"), [(4, 40.4), (8, 83.6), (16, 170.0), (32, 342.8)])
def test_jit_registration_linear_in_peers_and_cached(cm384, n, expected_us) -> None:  # noqa: ANN001
    """8 µs + (n - 1) peers × 10.8 µs (conf/library/hccl_jit.yaml) on first use, then cached."""
    lib = make_library(cm384, "hccl_jit")
    tr = Trace(world_size=n)
    tr.add_family("g", [range(n)])
    for _ in range(3):
        tr.collective("allgather", "g", 2**20, buffer="x")
    res = simulate(tr, lib)
    assert res.split["register"][0] == pytest.approx(expected_us * 1e-6)
    assert res.split["register"][1] == 0 and res.split["register"][2] == 0  # cached


def test_jit_misses_when_the_buffer_size_changes(cm384) -> None:  # noqa: ANN001
    lib = make_library(cm384, "hccl_jit")
    tr = Trace(world_size=8)
    tr.add_family("g", [range(8)])
    for size in (2**20, 2**21, 2**20):
        tr.collective("alltoall", "g", size, buffer="dispatch")
    res = simulate(tr, lib)
    assert res.split["register"][0] > 0 and res.split["register"][1] > 0
    assert res.split["register"][2] == 0


def _alloc_then_use(lib, gap_flops: float):  # noqa: ANN001, ANN202
    tr = Trace(world_size=32)
    tr.add_family("g", [range(32)])
    alloc = tr.compute(range(32), flops=gap_flops)  # the op that maps the buffer; its length = gap
    tr.add_buffer("kv", alloc_op=alloc)
    tr.collective("allgather", "g", 2**20, buffer="kv")
    return simulate(tr, lib)


def test_on_alloc_is_free_when_allocation_is_long_before_use(cm384) -> None:  # noqa: ANN001
    lib = make_library(cm384, "stratacl")
    res = _alloc_then_use(lib, gap_flops=cm384.cube_flops * 1e-2)  # 10 ms gap ≫ registration
    assert res.split["register"][1] == 0


def test_on_alloc_waits_only_for_the_remainder_when_use_is_soon(cm384) -> None:  # noqa: ANN001
    lib = make_library(cm384, "stratacl")
    gap = 100e-6
    res = _alloc_then_use(lib, gap_flops=cm384.cube_flops * gap)
    full = 342.8e-6  # 8 µs + 31 peers × 10.8 µs (conf/library/{stratacl,hccl_jit}.yaml)
    jit = _alloc_then_use(make_library(cm384, "hccl_jit"), gap_flops=cm384.cube_flops * gap)
    assert jit.split["register"][1] == pytest.approx(full)  # JIT pays it all at first use
    # registering at allocation runs during the gap: only the remainder is exposed
    assert res.split["register"][1] == pytest.approx(full - gap, rel=1e-9)
    # the data_path knob alone on one preset: the op ends exactly `gap` earlier than under JIT
    alloc = _alloc_then_use(make_library(cm384, "hccl_jit", data_path=DataPath.on_alloc),
                            gap_flops=cm384.cube_flops * gap)
    assert alloc.end[1] == pytest.approx(jit.end[1] - gap, rel=1e-9)


def test_buffers_allocated_before_the_trace_cost_nothing_on_alloc(cm384) -> None:  # noqa: ANN001
    res = _one(make_library(cm384, "stratacl"), "allgather", 32, 2**20, buffer="weights")
    assert res.split["register"][0] == 0


def test_library_hbm_accounting(cm384) -> None:  # noqa: ANN001
    hccl = make_library(cm384, "hccl")
    assert hccl.held_memory_bytes(communicators=3) == pytest.approx(3 * 2 * 200 * 2**20)  # HCCL_BUFFSIZE in MiB
    zc = make_library(cm384, "hccl_zerocopy")
    # the pool only: the fragmentation of its expandable-segments-off allocator emerges from the
    # allocator model (tests/test_serving_memory.py), it is no longer a constant
    assert zc.held_memory_bytes(1, "inference") == pytest.approx(1.72e9)
    assert zc.held_memory_bytes(1, "training") == pytest.approx(1.72e9)
    assert make_library(cm384, "stratacl").held_memory_bytes(5, "training") == 0.0


# ------------------------------------------------------------------ algorithms
def test_ring_steps_dominate_small_sizes_fullmesh_pays_one(cm384) -> None:  # noqa: ANN001
    # AIV expansion: no AI CPU task submission in the way of the step counts
    ring = make_library(cm384, "hccl_zerocopy", algorithm=Algorithm.ring, mover=Mover.vector_cores)
    mesh = make_library(cm384, "hccl_zerocopy", algorithm=Algorithm.fullmesh, mover=Mover.vector_cores)
    g = tuple(range(32))
    assert ring.wire_plan("allgather", 65536, g).steps == 31
    assert mesh.wire_plan("allgather", 65536, g).steps == 1
    assert _one(mesh, "allgather", 32, 65536).end[0] < _one(ring, "allgather", 32, 65536).end[0] / 3


def test_recursive_halving_doubling_closed_form(cm384) -> None:  # noqa: ANN001
    lib = make_library(cm384, "hccl_zerocopy", algorithm=Algorithm.rhd, mover=Mover.vector_cores)
    size = 2**26
    # partners at distance 16 (other node), 8, 4, 2 (same node), 1 (same package); halving data
    step = {16: (2.1e-6 + 2.1e-6, 150e9), 8: (0.7e-6 + 1.3e-6, 170e9), 4: (0.7e-6 + 1.3e-6, 170e9),
            2: (0.7e-6 + 1.3e-6, 170e9), 1: (0.2e-6 + 0.5e-6, 210e9)}
    half = sum(a + size / 2 ** (i + 1) / b for i, (a, b) in enumerate(step.values()))
    plan = lib.wire_plan("allreduce", size, tuple(range(32)))
    assert plan.steps == 10
    assert plan.latency_s + plan.wire_s == pytest.approx(2 * half, rel=1e-12)
    assert plan.send_bytes == pytest.approx(2 * 31 / 32 * size)  # bandwidth-optimal, like a ring
    res = _one(lib, "allreduce", 32, size)
    assert res.end[0] == pytest.approx(5e-6 + 2 * half, rel=1e-9)


def test_auto_switches_algorithm_across_sizes(cm384) -> None:  # noqa: ANN001
    # uniform core groups: full-mesh is core-bound
    flat = (Algorithm.ring, Algorithm.mesh, Algorithm.fullmesh)
    lib = make_library(cm384, "stratacl_no_partition", algorithm=Algorithm.auto, auto_candidates=flat)
    g = tuple(range(32))

    def chosen(size: float) -> str:
        # each candidate forced through the public knob, run on an idle fabric: auto is the fastest
        times = {a: _one(make_library(cm384, "stratacl_no_partition", algorithm=a), "allreduce", 32, size).end[0]
                 for a in flat}
        best = min(times, key=times.get)
        assert _one(lib, "allreduce", 32, size).end[0] == pytest.approx(times[best], rel=1e-12)
        assert lib.chosen_algorithm("allreduce", size, g) == best.value
        return best.value

    small, large = chosen(65536), chosen(2**30)
    assert small == "fullmesh" and large != "fullmesh"


# ------------------------------------------------------------------ cores and movers
def test_lpt_balances_uneven_payloads_and_never_loses_to_uniform() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        peers = [partition.PeerWork(float(b), 1e-6, 7.76e9) for b in rng.lognormal(15, 1.5, size=31)]
        uni = partition.uniform(peers, 24)
        bal = partition.balanced(peers, 24, [256 * 1024] * 31, fanout_cap=24)
        assert bal.makespan_s <= uni.makespan_s + 1e-12
        assert bal.spread < uni.spread
    # 31 equal peers on 24 cores: uniform leaves 7 cores with two peers, LPT evens it out
    eq = [partition.PeerWork(8e6, 2e-6, 7.76e9)] * 31
    assert partition.uniform(eq, 24).spread == pytest.approx(0.5, abs=0.01)
    assert partition.balanced(eq, 24, [256 * 1024] * 31, fanout_cap=4).spread <= 0.05


def test_sdma_frees_the_vector_cores(cm384) -> None:  # noqa: ANN001
    def with_kernel(lib):  # noqa: ANN001, ANN202
        tr = Trace(world_size=32)
        tr.add_family("g", [range(32)])
        tr.collective("allgather", "g", 2**30, stream="comm")
        tr.compute(range(32), flops=cm384.vector_flops * 1e-3, core="vector", stream="compute")
        return simulate(tr, lib)

    mesh = Algorithm.fullmesh  # one plan for both movers
    vec = with_kernel(make_library(cm384, "stratacl", mover=Mover.vector_cores, algorithm=mesh))
    sdma = with_kernel(make_library(cm384, "stratacl", algorithm=mesh))
    assert vec.end[1] - vec.start[1] > 1.9e-3  # kernel on half the cores
    assert sdma.end[1] - sdma.start[1] < 1.01e-3  # cores held only for descriptor writes


def test_uniform_partitioning_makes_fullmesh_core_bound_balanced_fixes_it(cm384) -> None:  # noqa: ANN001
    uni = make_library(cm384, "stratacl_no_partition", algorithm=Algorithm.fullmesh)
    bal = make_library(cm384, "stratacl_no_sdma", algorithm=Algorithm.fullmesh)
    assert uni.cfg.partitioning == Partitioning.uniform and bal.cfg.partitioning == Partitioning.balanced
    t_uni = _one(uni, "allgather", 32, 2**30).end[0]
    t_bal = _one(bal, "allgather", 32, 2**30).end[0]
    assert t_bal < 0.9 * t_uni


def test_rdma_plane_carries_inter_node_traffic(cm384) -> None:  # noqa: ANN001
    ub = make_library(cm384, "cann_ep_zerocopy", core_access="get")  # the planes alone, at beta
    rdma = make_library(cm384, "cann_ep_zerocopy", plane="rdma", core_access="get")
    intra = tuple(range(16))  # one node: scale-up links either way
    assert rdma.wire_plan("alltoall", 2**26, intra).wire_s == pytest.approx(ub.wire_plan("alltoall", 2**26, intra).wire_s)
    two_nodes = tuple(range(32))
    assert "rdma" in rdma.wire_plan("alltoall", 2**26, two_nodes).tx_s
    assert rdma.wire_plan("alltoall", 2**26, two_nodes).wire_s > 3 * ub.wire_plan("alltoall", 2**26, two_nodes).wire_s


# per-rank bytes a staged library copies (in + out) for size S per rank on N ranks, written out
# from the nccl-tests conventions rather than read from the library's table
STAGED_BYTES = {
    "allgather": lambda s, n: s / n + s,  # M = S/N in, the gathered N·M out: (1 + N)·M
    "reducescatter": lambda s, n: s + s / n,
    "allreduce": lambda s, n: 2 * s,
    "broadcast": lambda s, n: 2 * s,
}


@pytest.mark.parametrize("coll", list(STAGED_BYTES))
def test_staged_data_path_adds_its_copies_at_hbm_rate(cm384, coll) -> None:  # noqa: ANN001
    """The data_path knob alone: staged = pool + copy-in + copy-out, each a device copy that reads
    and writes HBM (2 bytes of traffic per byte) at the die's HBM bandwidth."""
    n, size = 32, 64 * 2**20  # fits one 200 MB buffer round: the algorithm runs once either way
    # AIV mode and no copy-engine cap: the copies run in-kernel at the die's HBM rate
    knobs = dict(algorithm=Algorithm.ring, expansion_mode=ExpansionMode.aiv, copy_GBps=0.0)
    staged = make_library(cm384, "hccl", **knobs)
    pool = make_library(cm384, "hccl", data_path=DataPath.pool, **knobs)
    assert staged.cfg.data_path == DataPath.staged and staged.cfg.copy_GBps == 0  # copies at HBM rate
    a, b = _one(staged, coll, n, size), _one(pool, coll, n, size)
    copied = STAGED_BYTES[coll](size, n)
    extra = 2 * copied / cm384.hbm_Bps
    assert a.end[0] - b.end[0] == pytest.approx(extra, rel=1e-9)
    assert a.split["copy"][0] == pytest.approx(extra, rel=1e-9) and b.split["copy"][0] == 0
    assert a.copy_bytes[0] == pytest.approx(n * copied, rel=1e-12) and b.copy_bytes[0] == 0
    assert a.wire_bytes[0] == pytest.approx(b.wire_bytes[0], rel=1e-12)  # same traffic on the wire


def test_balanced_units_unsized_tiers_take_the_finest_configured(cm384) -> None:  # noqa: ANN001
    """Units shape the LPT schedule; a tier missing from unit_KiB uses the library's finest unit,
    no unit at all the documented default."""
    plan = make_library(cm384, "stratacl").wire_plan("allgather", 2**28, tuple(range(32)), algorithm="fullmesh")
    tiers = ("die", "node", "supernode", "scaleout")

    def schedule(units: dict[str, float]):  # noqa: ANN202
        return make_library(cm384, "stratacl", unit_KiB=units).ctx.core_schedule(plan)

    assert schedule({"node": 64.0}) == schedule(dict.fromkeys(tiers, 64.0))
    assert schedule({}) == schedule(dict.fromkeys(tiers, DEFAULT_UNIT_KiB))
    assert schedule(dict.fromkeys(tiers, 64.0)) != schedule(dict.fromkeys(tiers, 4096.0))  # units matter


def test_fabric_without_the_far_tiers_prices_groups_inside_it(run_cfg) -> None:  # noqa: ANN001
    """Plans look up only the distances a group spans: one supernode needs no scale-out tier."""
    fab_cfg = copy.deepcopy(run_cfg.fabric)
    del fab_cfg.tiers["scaleout"]
    fab = Fabric(fab_cfg)
    for preset in ("hccl", "stratacl"):
        lib = make_library(fab, preset)
        res = _one(lib, "allgather", 32, 2**24)
        assert res.end[0] > 0
        with_scaleout = make_library(Fabric(run_cfg.fabric), preset)
        assert res.end[0] == pytest.approx(_one(with_scaleout, "allgather", 32, 2**24).end[0], rel=1e-12)


def test_time_split_keeps_sync_and_launch_apart_on_families(cm384) -> None:  # noqa: ANN001
    """Merged delays keep their parts, also when a family of several groups scales the accounting."""
    lib = make_library(cm384, "stratacl")
    tr = Trace(world_size=64)
    tr.add_family("fsdp", [range(i, 64, 4) for i in range(4)])
    tr.collective("allgather", "fsdp", 2**24)
    res = simulate(tr, lib)
    assert res.split["launch"][0] >= lib.cfg.launch_us * 1e-6
    assert res.split["sync"][0] > 0
    total = sum(v[0] for v in res.split.values())
    assert total == pytest.approx(res.end[0] - res.start[0], rel=1e-12)


def test_policy_refines_units_only_when_it_shortens_the_makespan() -> None:
    # a 32-rank all-gather as one die sees it: its SIO partner, 14 node peers, 16 inter-node peers
    def peers(size: float) -> list[partition.PeerWork]:
        per = size / 32
        return ([partition.PeerWork(per, 0.2e-6, 7.76e9)] + [partition.PeerWork(per, 0.7e-6, 7.76e9)] * 14
                + [partition.PeerWork(per, 2.1e-6, 7.76e9)] * 16)

    units = [256 * 1024] * 15 + [512 * 1024] * 16
    for size in (2**20, 2**23, 2**25, 2**26, 2**27):
        plain = partition.balanced(peers(size), 24, units, 4)
        refined = partition.balanced(peers(size), 24, units, 4, refine_below=8)
        assert refined.makespan_s <= plain.makespan_s
    # 128 MiB: enough units per core that the stripes even the cores out (REFERENCE §4/§5)
    big = partition.balanced(peers(2**27), 24, units, 4, refine_below=8)
    assert big.spread <= 0.05 < partition.uniform(peers(2**27), 24).spread
    # the per-stripe cap: a peer's units spread over more than fanout_cap cores over the op
    one = partition.balanced([partition.PeerWork(64e6, 1e-6, 7.76e9)], 24, [256 * 1024], 4)
    assert sum(x > 0 for x in one.loads_s) == 24 and one.spread <= 1 / 10  # ≈ 10 units per core


# ------------------------------------------------------------------ families and movers
@pytest.mark.parametrize(("n", "algorithm", "steps"), [(8, "rhd", 2 * 3), (6, "ring", 2 * 5)])
def test_rhd_halves_on_powers_of_two_and_rings_otherwise(cm384, n, algorithm, steps) -> None:  # noqa: ANN001
    """Recursive halving-doubling allreduce: 2·log2(n) steps on 8 ranks; on 6 ranks (no halving)
    HCCL runs the ring: 2(n−1) steps."""
    lib = make_library(cm384, "hccl", data_path=DataPath.pool, algorithm=Algorithm.rhd)
    plan = lib.wire_plan("allreduce", 2**20, tuple(range(n)))
    assert (plan.algorithm, plan.steps) == (algorithm, steps)


def test_pairwise_libraries_reduce_on_a_ring(cm384) -> None:  # noqa: ANN001
    """Pairwise exchange has no reduction: a pairwise library's allreduce is the ring's, its
    all-to-all n−1 pairwise steps."""
    pw = make_library(cm384, "hccl", data_path=DataPath.pool, algorithm=Algorithm.pairwise)
    ring = make_library(cm384, "hccl", data_path=DataPath.pool, algorithm=Algorithm.ring)
    g = tuple(range(8))
    assert pw.chosen_algorithm("allreduce", 2**22, g) == "ring"
    assert pw.collective_phases("allreduce", 2**22, g) == ring.collective_phases("allreduce", 2**22, g)
    assert pw.wire_plan("alltoall", 2**22, g).steps == 7


def test_the_sdma_mover_is_bounded_by_its_engines(cm384) -> None:  # noqa: ANN001
    """With 16 engines at 0.5 GB/s (8 GB/s per die) an allgather between the two dies of one
    package (S/2 each way) takes at least S/2 / 8 GB/s — far above the die link's time."""
    fab = Fabric(compose_run(["fabric.die.sdma.engine_GBps=0.5"]).fabric)
    lib = make_library(fab, "stratacl", data_path=DataPath.pool)
    size = 2**28
    t = sum(p.standalone_s() for p in lib.collective_phases("allgather", size, (0, 1)))
    assert fab.sdma_Bps == 8e9 and t == pytest.approx(size / 2 / 8e9, rel=0.05)


def test_cores_that_store_move_at_the_tiers_store_rate(cm384) -> None:  # noqa: ANN001
    """A comm kernel whose vector cores store into the peers' memory (core_access=put: CANN's fused
    MoE ops) carries each tier's bytes at its store_GBps (2506.12708 Table 1's writes), one that
    loads at beta: on a one-tier group the port seconds differ by exactly beta / store."""
    put = make_library(cm384, "cann_ep_zerocopy")
    get = make_library(cm384, "cann_ep_zerocopy", core_access="get")
    node = cm384.tiers["node"]
    assert 0 < node.store_Bps < node.beta_Bps
    group = tuple(range(0, 16, 2))  # one die of each NPU of node 0: every pair is the node tier
    size = 2.0**26
    a, b = put.wire_plan("alltoall", size, group), get.wire_plan("alltoall", size, group)
    assert a.tx_s["ub"] == pytest.approx(size * 7 / 8 / node.store_Bps)
    assert a.tx_s["ub"] / b.tx_s["ub"] == pytest.approx(node.beta_Bps / node.store_Bps)
    # DMA transfers keep beta, and a fabric without store rates is its own storing view
    assert make_library(cm384, "stratacl").fabric.tiers["node"].beta_Bps == node.beta_Bps
    h100 = Fabric(compose_run(["fabric=hgx_h100"]).fabric)
    assert h100.storing() is h100
