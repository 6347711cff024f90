"""The host tier (issue 26): CPUs and DRAM as fabric facts, host<->device transfers as trace ops
whose time on an idle or shared fabric follows closed forms from conf/fabric host sections."""

from __future__ import annotations

import copy

import pytest
from helpers import compose_run, make_library

from stratacl.engine.replay import simulate
from stratacl.errors import ConfigError, TraceError
from stratacl.machine.fabric import Fabric
from stratacl.trace import Trace

B = 64 * 2**20
# conf/fabric/cloudmatrix384.yaml host: 160 GB/s per CPU, 4 dies per CPU, 1.0 / 1.1 us local
# read / write, 1.7 us remote read; the die's UB port 196 GB/s
CPU, PORT, READ, WRITE, REMOTE_READ = 160e9, 196e9, 1.0e-6, 1.1e-6, 1.7e-6
DRAM = 8 * 23.464e9  # Kunpeng 920: 8 DDR4-2933 channels per socket, reads and writes together


def run(fabric: Fabric, build) -> list[float]:  # noqa: ANN001
    tr = Trace(world_size=fabric.world if fabric.world <= 64 else 64)
    build(tr)
    # the zerocopy pool: a transfer starts at once (HCCL's staged path would copy it in first, and a
    # 256 MiB copy-in outlasts the fetch it is meant to share the port with)
    res = simulate(tr, make_library(fabric, "hccl_zerocopy"))
    return [float(e - s) for s, e in zip(res.start, res.end, strict=True)]


def test_facts_from_conf(cm384) -> None:  # noqa: ANN001
    assert cm384.host_cpus_per_node == 4 and cm384.host_link_Bps == CPU
    assert cm384.host.dies_per_cpu == 4 and cm384.host_dram_bytes_per_die == 512e9 / 4
    assert [cm384.host.cpu_of(d) for d in (0, 3, 4, 15, 16)] == [0, 0, 1, 3, 4]


def test_one_die_fetch_is_latency_plus_cpu_link(cm384) -> None:  # noqa: ANN001
    t = run(cm384, lambda tr: tr.memcpy([0], B, peer="host"))
    assert t[0] == pytest.approx(READ + B / CPU, rel=1e-9)
    t = run(cm384, lambda tr: tr.memcpy([0], B, peer="host", direction="d2h"))
    assert t[0] == pytest.approx(WRITE + B / CPU, rel=1e-9)


def test_two_dies_on_one_cpu_share_its_link(cm384) -> None:  # noqa: ANN001
    """Dies 0 and 1 hang off CPU 0: its 160 GB/s carries both; dies 0 and 4 use two CPUs."""
    t = run(cm384, lambda tr: tr.memcpy([0, 1], B, peer="host"))
    assert t[0] == pytest.approx(READ + 2 * B / CPU, rel=1e-9)
    t = run(cm384, lambda tr: tr.memcpy([0, 4], B, peer="host"))
    assert t[0] == pytest.approx(READ + B / CPU, rel=1e-9)
    # two separate ops on one CPU share it fairly and end together
    t = run(cm384, lambda tr: (tr.memcpy([0], B, peer="host"), tr.memcpy([1], B, peer="host")))
    assert t == pytest.approx([READ + 2 * B / CPU] * 2, rel=1e-9)


def test_fetch_and_writeback_use_opposite_directions_but_share_dram(cm384) -> None:  # noqa: ANN001
    """Fetch (link tx) and write-back (link rx) of one die each have a link way, but both load the
    CPU's 187.7 GB/s DRAM. The fetch starts 0.1 us earlier (1.0 vs 1.1 us latency) and runs alone
    at the link's 160 GB/s; then the two share DRAM at D/2 each (< 160), the fetch ends first and the
    write-back's last (WRITE - READ)·160 GB/s of bytes run alone again at the link rate."""
    assert cm384.host.dram_Bps == pytest.approx(DRAM)
    t = run(cm384, lambda tr: (tr.memcpy([0], B, peer="host"),
                               tr.memcpy([0], B, peer="host", direction="d2h", stream="wb")))
    alone = (WRITE - READ) * CPU
    fetch = WRITE + (B - alone) / (DRAM / 2)
    assert t == pytest.approx([fetch, fetch + alone / CPU], rel=1e-9)


def test_fetch_is_bounded_by_the_slower_of_link_and_dram(cm384) -> None:  # noqa: ANN001
    """min(link, DRAM): with 1 channel of 100 GB/s the DRAM binds; dies on one CPU share it."""
    cfg = copy.deepcopy(compose_run().fabric)
    cfg.host.dram_channels, cfg.host.dram_channel_GBps = 1, 100.0
    slow = Fabric(cfg)
    assert run(slow, lambda tr: tr.memcpy([0], B, peer="host"))[0] == pytest.approx(READ + B / 100e9, rel=1e-9)
    assert run(slow, lambda tr: tr.memcpy([0, 1], B, peer="host"))[0] == pytest.approx(READ + 2 * B / 100e9,
                                                                                       rel=1e-9)
    assert run(slow, lambda tr: tr.memcpy([0, 4], B, peer="host"))[0] == pytest.approx(READ + B / 100e9, rel=1e-9)
    # four dies of one Kunpeng fetching: 4B through its link (160) and its DRAM (187.7): the link binds
    assert run(cm384, lambda tr: tr.memcpy(range(4), B, peer="host"))[0] == pytest.approx(READ + 4 * B / CPU,
                                                                                          rel=1e-9)


def test_fetch_shares_the_die_port_with_collective_traffic(cm384) -> None:  # noqa: ANN001
    """A p2p into die 0 (UB rx) beside a fetch into die 0 (UB rx): the port's 196 GB/s is shared,
    so the fetch takes longer than alone; the same p2p into another die leaves it alone."""
    alone = READ + B / CPU
    def with_p2p(dst: int):  # noqa: ANN202
        return lambda tr: (tr.memcpy([0], B, peer="host"),
                           tr.add("p2p", [dst, 20], src=[20], dst=[dst], nbytes=4 * B, stream="c"))
    assert run(cm384, with_p2p(8))[0] == pytest.approx(alone, rel=1e-9)
    assert run(cm384, with_p2p(0))[0] > alone * 1.05


def test_pool_stripes_over_every_cpu_of_the_span(cm384) -> None:  # noqa: ANN001
    """32 dies (2 nodes, 8 CPUs) each fetch B from the pool: 4 B per CPU, remote latency."""
    t = run(cm384, lambda tr: tr.memcpy(range(32), B, peer="pool"))
    assert t[0] == pytest.approx(REMOTE_READ + 32 * B / 8 / CPU, rel=1e-9)


def test_gpu_host_link_is_the_pcie_port() -> None:
    """HGX H100: a GPU's PCIe x16 (64 GB/s) binds, not the CPU's 256 GB/s: two GPUs on one CPU
    each take B / 64 GB/s."""
    fab = Fabric(compose_run(["fabric=hgx_h100"]).fabric)
    assert fab.host.plane == "pcie"
    t = run(fab, lambda tr: tr.memcpy([0, 1], B, peer="host"))
    assert t[0] == pytest.approx(2e-6 + B / 64e9, rel=1e-9)


def test_bad_host_input_is_one_error(cm384) -> None:  # noqa: ANN001
    tr = Trace(world_size=2)
    tr.memcpy([0], B, peer="disk")
    with pytest.raises(TraceError, match="peer 'disk'"):
        tr.validate()
    cfg = copy.deepcopy(compose_run().fabric)
    cfg.host.cpus_per_node = 3
    with pytest.raises(ConfigError, match="cpus_per_node"):
        Fabric(cfg)
    cfg.host.cpus_per_node = 4
    cfg.host.dram_channel_GBps = 0.0
    with pytest.raises(ConfigError, match="dram_channel_GBps"):
        Fabric(cfg)
    cfg.host.cpus_per_node = 0
    with pytest.raises(TraceError, match="no host CPUs"):
        run(Fabric(cfg), lambda tr: tr.memcpy([0], B, peer="host"))


def test_host_fields_round_trip(tmp_path) -> None:  # noqa: ANN001
    tr = Trace(world_size=4)
    tr.memcpy([0, 1], [1.0, 2.0], peer="pool", direction="d2h")
    back = Trace.load(tr.save(tmp_path / "t.parquet"))
    assert (back.ops[0].peer, back.ops[0].direction) == ("pool", "d2h")


def test_checked_and_recorded_replay_with_host_ops(cm384) -> None:  # noqa: ANN001
    """The CPU pseudo-dies fit the utilisation recorder and never exceed capacity (check mode)."""
    tr = Trace(world_size=32)
    tr.memcpy(range(32), B, peer="host")
    tr.memcpy(range(16), B, peer="pool", direction="d2h", stream="wb")
    tr.add("p2p", [0, 20], src=[20], dst=[0], nbytes=B, stream="c")
    res = simulate(tr, make_library(cm384, "hccl"), check=True, utilisation=True)
    assert res.max_violation < 1e-9 and res.work_error < 1e-9
    assert res.wire_bytes[0] == pytest.approx(32 * B) and res.wire_bytes[1] == pytest.approx(16 * B)


def test_gpu_pool_bytes_from_other_nodes_come_through_the_nic() -> None:
    """HGX H100 at 8 nodes: 64 GPUs fetch B each from the pool striped over their 16 CPUs; 7/8 of a
    GPU's bytes live on other nodes and arrive through its 50 GB/s NIC (GPUDirect RDMA), which binds
    before its 64 GB/s PCIe link: 5 us remote latency + 7/8 B / 50 GB/s. On one node PCIe binds."""
    fab = Fabric(compose_run(["fabric=hgx_h100", "fabric.topology.nodes=8", "fabric.topology.supernodes=8"]).fabric)
    t = run(fab, lambda tr: tr.memcpy(range(64), B, peer="pool"))
    assert t[0] == pytest.approx(5e-6 + 7 / 8 * B / 50e9, rel=1e-9)
    one_node = run(fab, lambda tr: tr.memcpy(range(8), B, peer="pool"))
    assert one_node[0] == pytest.approx(5e-6 + B / 64e9, rel=1e-9)


def test_ub_pool_bytes_from_other_nodes_stay_on_ub(cm384) -> None:  # noqa: ANN001
    """CloudMatrix384's EMS pool spans the nodes over UB itself: no RDMA-plane load."""
    from stratacl.machine.compute import lower_host
    from stratacl.machine.fabric import R

    tr = Trace(world_size=32)
    tr.memcpy(range(32), B, peer="pool")
    used = {r for ph in lower_host(tr.ops[0], cm384) for _, r, _ in ph.loads}
    assert R["ub_rx"] in used and not used & {R["rdma_rx"], R["rdma_tx"]}
