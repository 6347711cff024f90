"""NCCL as NCCL runs it (stratacl/comm/nccl.py): closed forms of the rail-optimised multi-channel
ring and the double-binary tree on a two-node HGX H100 fabric, NVLS bytes per GPU, PXN rail
aggregation, and the algorithm / protocol choice of NCCL's tuning model."""

from __future__ import annotations

import pytest
from helpers import compose_run, make_library
from test_closed_forms import one_op_time

from stratacl.comm import nccl
from stratacl.config import DataPath
from stratacl.machine.fabric import Fabric

GiB = 2**30
P, BETA_NVL, BETA_NET = 8, 370.8e9, 50e9  # hgx_h100: GPUs per node, NVLink and NIC β per GPU
CHANNELS = 16  # conf/library/nccl.yaml comm_cores


@pytest.fixture(scope="module")
def h100() -> Fabric:
    cfg = compose_run(["fabric=hgx_h100"]).fabric
    cfg.nvls = False  # rings and trees only (NVLS has its own tests)
    return Fabric(cfg)


@pytest.fixture(scope="module")
def h100_nvls() -> Fabric:
    return Fabric(compose_run(["fabric=hgx_h100"]).fabric)


def _lib(fab: Fabric, algos: list[str] | None = None, protos: list[str] | None = None):  # noqa: ANN202
    # registered buffers (no staging copies), so the wire is the whole op
    return make_library(fab, "nccl", data_path=DataPath.pool, pool_GB=1.0,
                        nccl_algos=algos or [], nccl_protos=protos or [])


def test_two_node_ring_uses_every_rail(h100) -> None:  # noqa: ANN001
    # 16 channels of rings over 2 nodes: each ring leaves a node through a different NIC, so the
    # node's 8 NICs share the ring's 2(n-1)/n·S: busbw = 8 × 50 GB/s, not one NIC's 50
    n, size = 16, 1.0 * GiB
    lib = _lib(h100, ["ring"], ["Simple"])
    # tuning.cc, ring Simple, 2 nodes: base 8.4 µs; intra hops max(NVLink 3.4, net overhead 3 × 1.0);
    # 2(m-1) = 2 inter-node steps at 14 µs; × 1.4 plateau (ring Simple all-reduce across nodes)
    latency = (8.4 + (2 * (n - 1) - 2) * 3.4 + 2 * 14.0) * 1.4 * 1e-6
    wire = 2 * (n - 1) / n * size / (P * BETA_NET)
    assert wire > 2 * (n - 1) / n * size * (CHANNELS - CHANNELS // P) / CHANNELS / BETA_NVL  # NIC-bound
    assert one_op_time(h100, lib, "allreduce", range(n), size) == pytest.approx(latency + wire, rel=1e-9)
    plan = lib.wire_plan("allreduce", size, tuple(range(n)))
    assert plan.algorithm == "nccl:ring/Simple"
    assert plan.send_bytes == pytest.approx(2 * (n - 1) / n * size)  # every die: the ring's bytes once


def test_two_node_tree_closed_form(h100) -> None:  # noqa: ANN001
    # chains in the nodes (reduce up, broadcast down: a die sends 2(p-1)/p·S over NVLink with the
    # channel heads rotating), double binary tree between the 2 nodes (each node: parent in one
    # tree, child in the other: S/p per NIC). NVLink-bound here; NCCL's tree bandwidth factor 0.92.
    n, size = 16, 1.0 * GiB  # ≥ 2^29 B: no tree correction factor
    lib = _lib(h100, ["tree"], ["Simple"])
    latency = (8.4 + 2 * ((P - 1) * 4.0 + 1 * 14.0)) * 1e-6  # base + 2((p-1)·NVLink + log2(2)·net)
    nvl = 2 * (P - 1) / P * size / BETA_NVL
    net = size / P / BETA_NET
    assert nvl > net
    expected = latency + nvl / 0.92
    assert one_op_time(h100, lib, "allreduce", range(n), size) == pytest.approx(expected, rel=1e-9)


def test_dtree_links_match_ncclGetDtree() -> None:
    # 4 ranks: btree 0-(2)-{1,3}; the mirror tree puts rank 1 where 2 was: ranks 1 and 2 are
    # interior in one tree each (3 links) and leaves in the other (1 link)
    assert nccl.btree_links(4).tolist() == [1, 1, 3, 1]
    assert nccl.dtree_links(4).tolist() == [2, 4, 4, 2]
    assert nccl.dtree_links(2).tolist() == [2, 2]
    assert nccl.dtree_links(5).max() <= 4


def test_nvls_allreduce_bytes_per_gpu(h100_nvls) -> None:  # noqa: ANN001
    # in-switch reduction: a GPU sends its S to the switch and reads back its reduced S/p shard,
    # then multicasts its shard and receives all S; the GPU reduces nothing
    size = 1.0 * GiB
    plan = _lib(h100_nvls, ["nvls"]).wire_plan("allreduce", size, tuple(range(P)))
    assert plan.algorithm == "nccl:nvls/Simple"
    assert plan.send_bytes == pytest.approx(size + size / P)
    assert plan.recv_bytes == pytest.approx(size / P + size)
    assert plan.reduce_bytes == 0.0
    ring = _lib(h100_nvls, ["ring"], ["Simple"]).wire_plan("allreduce", size, tuple(range(P)))
    assert ring.send_bytes == pytest.approx(2 * (P - 1) / P * size) and ring.reduce_bytes > 0


def test_pxn_sends_through_the_destinations_rail(h100) -> None:  # noqa: ANN001
    # every GPU of node 0 sends 1 MiB to rank 8 (node 1, rail 0) only: PXN forwards them over
    # NVLink to rank 0, whose NIC carries all 8 MiB; a flat mesh would load 8 NICs with 1 MiB each
    n, mib = 16, 2.0**20
    peer = [[0.0] * n for _ in range(n)]
    for i in range(P):
        peer[i][P] = mib
    flat = tuple(x for row in peer for x in row)
    plan = _lib(h100).wire_plan("alltoallv", mib, tuple(range(n)), flat)
    assert plan.algorithm == "nccl:pxn"
    assert plan.port_bytes["rdma"] == pytest.approx(P * mib)
    assert plan.port_bytes["nvlink"] == pytest.approx(mib)  # each sender's hop to rank 0
    uniform = _lib(h100).wire_plan("alltoall", n * mib, tuple(range(n)))
    assert uniform.port_bytes["rdma"] == pytest.approx(P * mib)  # its 8 remote peers' slices


def test_choice_small_tree_ll_large_ring_simple(h100) -> None:  # noqa: ANN001
    # NCCL's model on 2 nodes × 8 GPUs without NVLS: tiny all-reduces are latency-bound, where the
    # tree's 2·log2 network steps and LL's 0.6 µs hops win; large ones are bandwidth-bound, where
    # Simple's full-width lines and the ring's 8 rails win
    lib = _lib(h100)
    g = tuple(range(16))
    assert lib.wire_plan("allreduce", 8192.0, g).algorithm == "nccl:tree/LL"
    assert lib.wire_plan("allreduce", 4.0 * GiB, g).algorithm == "nccl:ring/Simple"
    # the protocol only moves towards wider lines as the size grows (LL → LL128 → Simple)
    order = {"LL": 0, "LL128": 1, "Simple": 2}
    protos = [order[lib.wire_plan("allreduce", float(2**k), g).algorithm.split("/")[1]] for k in range(10, 33)]
    assert protos == sorted(protos) and protos[0] == 0 and protos[-1] == 2


def test_nvls_chosen_on_a_node_when_the_switch_reduces(h100, h100_nvls) -> None:  # noqa: ANN001
    g = tuple(range(P))
    assert _lib(h100_nvls).wire_plan("allreduce", 1.0 * GiB, g).algorithm == "nccl:nvls/Simple"
    assert _lib(h100).wire_plan("allreduce", 1.0 * GiB, g).algorithm.startswith("nccl:ring")
    two = _lib(h100_nvls).wire_plan("allreduce", 1.0 * GiB, tuple(range(16))).algorithm
    assert two == "nccl:nvls_tree/Simple"  # NVLS alone needs CollNet across nodes


def test_unknown_nccl_algo_is_a_config_error() -> None:
    from stratacl.config import validate_library
    from stratacl.errors import ConfigError

    cfg = compose_run(["fabric=hgx_h100", "library=[nccl]", "baseline=nccl"])
    lib = cfg.library["nccl"]
    lib.nccl_algos = ["collnet"]
    with pytest.raises(ConfigError, match="nccl_algos"):
        validate_library("nccl", lib, cfg.fabric)


def test_nvl72_rack_is_one_nccl_node() -> None:
    # multi-node NVLink: the 72 GPUs of a rack reach each other without a NIC, so NCCL sees one
    # node (NVLS in the switch trays, nothing on the NICs); two racks run NVLS-tree over the rails
    fab = Fabric(compose_run(["fabric=gb200_nvl72"]).fabric)
    rack = _lib(fab).wire_plan("allreduce", 1.0 * GiB, tuple(range(72)))
    assert rack.algorithm == "nccl:nvls/Simple" and "rdma" not in rack.tx_s
    assert rack.send_bytes == pytest.approx(GiB * (1 + 1 / 72))
    two = _lib(fab).wire_plan("allreduce", 1.0 * GiB, tuple(range(144)))
    assert two.algorithm.startswith("nccl:nvls_tree") and two.port_bytes["rdma"] > 0


@pytest.mark.parametrize("size", [2**16, 2**20, 2**33])
def test_pipelined_staging_exposes_one_slot_per_channel(h100, size: int) -> None:  # noqa: ANN001
    """NCCL copies through NCCL_STEPS slots of NCCL_BUFFSIZE / NCCL_STEPS per channel: only the first
    slot's copy is exposed at each end, one chunk of a small payload, at most channels x slot of a
    large one (an 8 GiB all-reduce exposes ~5 µs of copy, not 1/8 of the payload)."""
    lib = make_library(h100, "nccl")
    cfg = lib.cfg
    cin = size  # all-reduce: the whole payload is staged in (datapath.staging_bytes)
    copies = [p for p in lib.collective_phases("allreduce", size, tuple(range(8))) if p.category == "copy"]
    slot_cap = cfg.comm_cores * cfg.comm_buffer_MiB * 2**20 / cfg.pipeline_chunks
    assert len(copies) == 2
    assert copies[0].copy_bytes / 8 == pytest.approx(min(cin / cfg.pipeline_chunks, slot_cap), rel=1e-9)
