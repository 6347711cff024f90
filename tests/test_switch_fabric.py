"""The switched scale-up network (fabric.fidelity=switch): ports at their nominal rate shared by
all flows, flows capped at their tier's β, node uplink/downlink port groups."""

from __future__ import annotations

import pytest
from helpers import compose_run, make_library
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stratacl.config import Algorithm, DataPath
from stratacl.engine.replay import simulate
from stratacl.machine.fabric import Fabric
from stratacl.trace import Trace

PORT = 196e9  # UB port per die (2506.12708 §3.3.1)
INTER = 150e9  # inter-node tier β (StrataCL Table 1)
# launch + inter-node α + flag sync of one p2p step + the SDMA start of hccl_zerocopy's AI_CPU
# expansion: AI CPU kernel 8 us + first descriptor + engine start-up (conf/fabric)
_CM = Fabric(compose_run([]).fabric)
FIXED = 5e-6 + 2.1e-6 + 2.1e-6 + (8e-6 + _CM.sdma_descriptor_s["aicpu"] + _CM.sdma_startup_s)


def _fabric(*overrides: str) -> Fabric:
    """The switch model with SDMA queues unbounded (the in-flight windows have their own tests,
    tests/test_sdma_windows.py): these closed forms are of ports, links and uplinks."""
    return Fabric(compose_run(["fabric.fidelity=switch", "fabric.tiers.supernode.in_flight.put=0",
                               "fabric.tiers.supernode.in_flight.get=0", "fabric.tiers.node.in_flight.get=0",
                               *overrides]).fabric)


def _incast(fab: Fabric, senders: int, size: float) -> float:
    """`senders` dies of node 1 each send `size` bytes to die 0 (node 0) at once; op time."""
    tr = Trace(world_size=32)
    for s in range(senders):
        tr.add("p2p", [0, 16 + s], src=[16 + s], dst=[0], nbytes=size, stream=f"s{s}")
    # cores not binding, and all senders in flight at once (HCCL's 6 AI_CPU graphs per card would queue 8)
    res = simulate(tr, make_library(fab, "hccl_zerocopy", comm_cores=48, aicpu_graphs_per_card=64), check=True)
    assert res.max_violation < 1e-9
    return float(res.end.max() - res.start.min())


@pytest.mark.parametrize("n", [2, 4, 8])
def test_incast_n_senders_take_n_times_one_through_the_receiver_port(n: int) -> None:
    size = 256 * 2**20
    # a fabric whose single flow fills the port (inter-node β = port rate): exactly N×
    full = _fabric("fabric.tiers.supernode.beta_GBps=196")
    one = _incast(full, 1, size) - FIXED
    assert _incast(full, n, size) - FIXED == pytest.approx(n * one, rel=1e-9)
    # CloudMatrix384: one flow runs at its tier β, N flows share the receiver's 196 GB/s port
    cm = _fabric()
    assert _incast(cm, 1, size) - FIXED == pytest.approx(size / INTER, rel=1e-9)
    assert _incast(cm, n, size) - FIXED == pytest.approx(max(n * size / PORT, size / INTER), rel=1e-9)


def test_fan_out_fills_the_port_a_single_flow_cannot() -> None:
    # an all-to-all over 32 dies: every die sends to 31 peers at once; with 48 cores and SDMA-free
    # movers the port (not a flow's β) bounds it under the switch model
    size = 512 * 2**20
    die = Fabric(compose_run(["fabric.fidelity=die_ports"]).fabric)
    sw = _fabric()

    def t(fab: Fabric) -> float:
        lib = make_library(fab, "stratacl_no_sdma", algorithm=Algorithm.fullmesh, comm_cores=48,
                           data_path=DataPath.pool)
        tr = Trace(world_size=32)
        tr.add_family("g", [range(32)])
        tr.collective("alltoall", "g", size)
        return float(simulate(tr, lib).end[0])

    chunk = size / 32
    ub_bytes = 30 * chunk  # 14 node peers + 16 inter-node peers on the UB port
    assert t(sw) < t(die)
    assert t(sw) == pytest.approx(5e-6 + 4.2e-6 + ub_bytes / PORT, rel=0.02)


def test_node_uplinks_bind_when_the_clos_is_tapered() -> None:
    # 4:1 taper (7 GB/s links): 16 dies of a node sending inter-node share a quarter of their ports
    size = 256 * 2**20
    full, taper = _fabric(), _fabric("fabric.switch.link_GBps=7")

    def t(fab: Fabric) -> float:
        tr = Trace(world_size=32)
        tr.add("p2p", list(range(32)), src=list(range(16)), dst=list(range(16, 32)), nbytes=size)
        return float(simulate(tr, make_library(fab, "hccl_zerocopy", comm_cores=48), check=True).end[0])

    uplinks = 7 * 16 * 7e9
    assert t(full) - FIXED == pytest.approx(size / INTER, rel=1e-9)  # non-blocking: as die ports
    assert t(taper) - FIXED == pytest.approx(16 * size / uplinks, rel=1e-9)


@st.composite
def cross_node_traces(draw) -> Trace:  # noqa: ANN001
    world = 48  # three nodes
    tr = Trace(world_size=world)
    tr.add_family("g", [range(0, 24), range(24, 48)])
    tr.add_family("w", [range(world)])
    for _ in range(draw(st.integers(1, 8))):
        stream = draw(st.sampled_from(["a", "b", "c", "d"]))
        kind = draw(st.sampled_from(["collective", "p2p"]))
        if kind == "collective":
            coll = draw(st.sampled_from(["allreduce", "allgather", "alltoall", "reducescatter"]))
            tr.collective(coll, draw(st.sampled_from(["g", "w", "g[1]"])), draw(st.floats(2**16, 2**28)),
                          stream=stream)
        else:
            pairs = draw(st.lists(st.tuples(st.integers(0, world - 1), st.integers(0, world - 1)).filter(
                lambda p: p[0] != p[1]), min_size=1, max_size=6, unique_by=lambda p: p[0]))
            src = [p[0] for p in pairs]
            dst = [p[1] for p in pairs]
            if len(set(dst)) < len(dst) or set(src) & set(dst):
                continue
            tr.add("p2p", sorted(set(src) | set(dst)), src=src, dst=dst, nbytes=draw(st.floats(1e3, 2**28)),
                   stream=stream)
    tr.validate()
    return tr


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tr=cross_node_traces(), link=st.sampled_from([28.0, 7.0, 2.0]))
def test_switch_port_capacity_holds_under_random_traffic(tr: Trace, link: float) -> None:
    fab = _fabric(f"fabric.switch.link_GBps={link}")
    for preset in ("hccl", "stratacl", "hccl_zerocopy"):
        res = simulate(tr, make_library(fab, preset), check=True)
        assert res.max_violation < 1e-9, "no port or switch port group above capacity"
        assert res.work_error < 1e-7


def test_rings_pace_at_their_hops_and_keep_the_sio_half() -> None:
    # the A3 double ring puts half of every die's bytes on SIO: under the switch model the UB port
    # carries half the ring's bytes at 196 GB/s and the ring still paces at its UB hop's β
    die, sw = Fabric(compose_run(["fabric.fidelity=die_ports"]).fabric), _fabric()
    g = tuple(range(16))
    t = {}
    for name, fab in (("die", die), ("sw", sw)):
        lib = make_library(fab, "hccl_zerocopy", algorithm=Algorithm.hierarchical, comm_cores=48)
        t[name] = sum(p.standalone_s() for p in lib.collective_phases("allgather", 2**30, g))
        plan = lib.wire_plan("allgather", 2**30, g)
    assert t["sw"] == pytest.approx(t["die"], rel=1e-12)  # one flow per hop: its β, not the port
    ring = (plan.stages or (plan,))[0]
    assert ring.port_bytes["ub"] == pytest.approx(ring.port_bytes["sio"]) == pytest.approx(ring.send_bytes / 2)
