"""DeepEP's normal kernels across nodes (stratacl/comm/ep.py) and node-limited routing, checked
against counts made token by token from a routing, independently of the code under test."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers import compose_run, make_library
from hypothesis import given
from hypothesis import strategies as st

from stratacl.comm.ep import MoeOp
from stratacl.errors import ConfigError, TraceError
from stratacl.machine.fabric import Fabric
from stratacl.trace import MoeShape, Trace
from workloads.common.routing import (
    GroupLimit,
    copies_matrix,
    ep_routing,
    expert_weights,
    group_tokens,
    model_group_limit,
    route,
)

EP, G, EXPERTS, TOP_K, TOKENS = 32, 8, 64, 6, 96  # 4 nodes of 8 GPUs
FP8, BF16 = 7392.0, 14336.0  # DeepEP FP8 token (7168 + 7168/128·4 scales) and BF16 token


@pytest.fixture(scope="module")
def h800() -> Fabric:
    return Fabric(compose_run(["fabric=hgx_h800", "fabric.topology.nodes=4", "fabric.topology.supernodes=4"]).fabric)


@pytest.fixture(scope="module")
def routed() -> np.ndarray:
    """Destination rank of each (source rank, token, selected expert), skewed so ranks differ."""
    w = expert_weights(EXPERTS, "zipf", 0.8, seed=3)
    choice = route(TOKENS, EP, EXPERTS, TOP_K, w, np.random.default_rng(5))
    return choice // (EXPERTS // EP)


def _by_token(dest: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token by token, with Python sets: RDMA tokens each rank sends to other nodes, RDMA tokens
    each rank receives, NVLink token copies each forwarder sends inside its node."""
    rdma_tx, rdma_rx, nvl_tx = np.zeros(EP), np.zeros(EP), np.zeros(EP)
    for s in range(EP):
        for t in range(TOKENS):
            ranks = {int(r) for r in dest[s, t]}
            for node in {r // G for r in ranks}:
                forwarder = node * G + s % G  # the GPU with the sender's local index
                if node != s // G:
                    rdma_tx[s] += 1
                    rdma_rx[forwarder] += 1
                nvl_tx[forwarder] += len({r for r in ranks if r // G == node} - {forwarder})
    return rdma_tx, rdma_rx, nvl_tx


def _op_plan(lib, coll: str, dest: np.ndarray, per_token: float):  # noqa: ANN001, ANN202
    copies = copies_matrix(dest * (EXPERTS // EP), EP, EXPERTS, per_expert=False)
    mat = copies if coll == "dispatch" else copies.T
    peer = tuple((mat * per_token).ravel())
    moe = MoeOp("ht", per_token, EXPERTS // EP, TOP_K, tuple(group_tokens(dest, EP)))
    return lib.wire_plan(coll, float(mat.sum(axis=1).max() * per_token), tuple(range(EP)), peer, moe=moe)


def _flows(lib, coll: str, dest: np.ndarray, per_token: float) -> np.ndarray:  # noqa: ANN001
    copies = copies_matrix(dest * (EXPERTS // EP), EP, EXPERTS, per_expert=False)
    mat = copies if coll == "dispatch" else copies.T
    moe = MoeOp("ht", per_token, EXPERTS // EP, TOP_K, tuple(group_tokens(dest, EP)))
    g, flows = lib.ht_path.node_flows(lib.ctx, coll, tuple(range(EP)), tuple((mat * per_token).ravel()), moe)
    assert g == G
    return np.asarray(flows).reshape(EP, EP)


def test_rdma_bytes_are_distinct_token_node_pairs_times_token_bytes(h800: Fabric, routed: np.ndarray) -> None:
    lib = make_library(h800, "deepep")
    rdma_tx, rdma_rx, _ = _by_token(routed)
    flows = _flows(lib, "dispatch", routed, FP8)
    node = np.arange(EP) // G
    across = node[:, None] != node[None, :]
    np.testing.assert_allclose(np.where(across, flows, 0).sum(axis=1), rdma_tx * FP8)
    np.testing.assert_allclose(np.where(across, flows, 0).sum(axis=0), rdma_rx * FP8)
    # RDMA goes only to the GPU with the same local index
    assert not np.any(flows[across & ((np.arange(EP)[:, None] % G) != (np.arange(EP)[None, :] % G))])
    # the plan's RDMA port time is the busiest NIC's pairs × bytes / β (flat: one copy per rank)
    plan = _op_plan(lib, "dispatch", routed, FP8)
    beta = h800.tier(3, lib.cfg.plane).beta_Bps
    assert plan.tx_s["rdma"] == pytest.approx(rdma_tx.max() * FP8 / beta)
    assert plan.rx_s["rdma"] == pytest.approx(rdma_rx.max() * FP8 / beta)
    flat = _op_plan(make_library(h800, "deepep", moe_ht_path="flat"), "dispatch", routed, FP8)
    assert flat.tx_s["rdma"] > 1.5 * plan.tx_s["rdma"]  # per rank vs per node: top-6 reaches ~2.6 ranks a node


def test_nvlink_forwarding_bytes(h800: Fabric, routed: np.ndarray) -> None:
    lib = make_library(h800, "deepep")
    _, _, nvl_tx = _by_token(routed)
    flows = _flows(lib, "dispatch", routed, FP8)
    node = np.arange(EP) // G
    inside = node[:, None] == node[None, :]
    np.testing.assert_allclose(np.where(inside, flows, 0).sum(axis=1), nvl_tx * FP8)
    plan = _op_plan(lib, "dispatch", routed, FP8)
    assert plan.tx_s["nvlink"] == pytest.approx(nvl_tx.max() * FP8 / h800.tier(1, lib.cfg.plane).beta_Bps)
    assert plan.algorithm == "node_forward"


def test_fp8_dispatch_and_bf16_combine_bytes(h800: Fabric, routed: np.ndarray) -> None:
    """The combine runs the dispatch's flows backwards at BF16: one copy per (token, node) back over
    RDMA to the token's owner, after the forwarder reduced its node's partials."""
    lib = make_library(h800, "deepep")
    rdma_tx, _, nvl_tx = _by_token(routed)
    disp, comb = _flows(lib, "dispatch", routed, FP8), _flows(lib, "combine", routed, BF16)
    np.testing.assert_allclose(comb, disp.T * BF16 / FP8)
    node = np.arange(EP) // G
    across = node[:, None] != node[None, :]
    np.testing.assert_allclose(np.where(across, comb, 0).sum(axis=0), rdma_tx * BF16)  # owners receive
    np.testing.assert_allclose(np.where(across, comb, 0).sum(), rdma_tx.sum() * BF16)
    np.testing.assert_allclose(np.where(~across, comb, 0).sum(axis=0), nvl_tx * BF16)  # forwarders receive
    d, c = _op_plan(lib, "dispatch", routed, FP8), _op_plan(lib, "combine", routed, BF16)
    assert c.reduce_bytes > 0 == d.reduce_bytes
    assert c.group_wire_bytes == pytest.approx(d.group_wire_bytes * BF16 / FP8)


def test_flat_inside_a_node_and_for_other_paths(h800: Fabric) -> None:
    """Inside one node DeepEP's intranode kernels send straight over NVLink: the flat plan."""
    w = expert_weights(EXPERTS, "uniform")
    dest = route(TOKENS, G, EXPERTS, TOP_K, w, np.random.default_rng(0)) // (EXPERTS // G)
    copies = copies_matrix(dest * (EXPERTS // G), G, EXPERTS, per_expert=False)
    peer = tuple((copies * FP8).ravel())
    moe = MoeOp("ht", FP8, EXPERTS // G, TOP_K, tuple(group_tokens(dest, G)))
    lib = make_library(h800, "deepep")
    a = lib.wire_plan("dispatch", 1e6, tuple(range(G)), peer, moe=moe)
    b = lib.wire_plan("dispatch", 1e6, tuple(range(G)), peer, moe=replace(moe, group_tokens=()))
    assert a.algorithm == b.algorithm == "fullmesh" and a.tx_s == b.tx_s
    # an LL op or a flat library never forwards
    assert lib.ht_path.node_flows(lib.ctx, "dispatch", tuple(range(EP)), (1.0,) * EP * EP, MoeOp("ll", FP8, 2, 6, (1.0,)))[1] == ()
    cann = make_library(h800, "cann_ep")
    assert cann.ht_path.node_flows(cann.ctx, "dispatch", tuple(range(EP)), (1.0,) * EP * EP,
                                   MoeOp("ht", FP8, 2, 6, (1.0,)))[1] == ()


def test_notify_is_two_hops_after_the_layout_kernel(h800: Fabric, routed: np.ndarray) -> None:
    lib = make_library(h800, "deepep")
    copies = copies_matrix(routed * (EXPERTS // EP), EP, EXPERTS, per_expert=False)
    moe = MoeOp("ht", FP8, EXPERTS // EP, TOP_K, tuple(group_tokens(routed, EP)))
    notify = lib.ht_path.notify(lib.ctx, lib, tuple(range(EP)), tuple((copies * FP8).ravel()), moe, None)
    kinds = [p.category for p in notify]
    assert kinds[0] == "launch" and kinds.count("launch") == 2  # layout kernel, notify kernel
    wires = [p for p in notify if p.category == "wire"]
    assert len(wires) == 2  # RDMA among same-index GPUs, then NVLink inside the node
    assert sum(w.wire_bytes for w in wires) > 0


def test_notify_forwards_exactly_where_the_dispatch_does(h800: Fabric, routed: np.ndarray) -> None:
    """The two-hop notify (two launches: layout kernel, notify kernel) runs for an HT op on a group
    filling several nodes in equal contiguous blocks, with (token, node) counts; its decision does
    not depend on the payload bytes (an op priced without them still notifies in two hops)."""
    lib = make_library(h800, "deepep")
    peer = tuple((copies_matrix(routed * (EXPERTS // EP), EP, EXPERTS, per_expert=False) * FP8).ravel())
    gt = tuple(group_tokens(routed, EP))
    ht = MoeOp("ht", FP8, EXPERTS // EP, TOP_K, gt)
    half = tuple(range(2 * G))  # two nodes, with its own counts
    ht_half = MoeOp("ht", FP8, EXPERTS // EP, TOP_K, tuple(group_tokens(routed[:2 * G] % (2 * G), 2 * G)))
    cases = [(tuple(range(EP)), peer, ht, True), (tuple(range(EP)), (), ht, True), (half, (), ht_half, True),
             (tuple(range(G)), (), ht, False),  # inside one node: the intranode kernels
             (tuple(range(G + G // 2)), (), ht, False),  # 8 + 4 GPUs: unequal blocks
             (tuple(range(EP)), peer, replace(ht, mode="ll"), False),  # LL mode
             (tuple(range(EP)), peer, replace(ht, group_tokens=()), False)]  # no (token, node) counts
    for group, pb, moe, two_hop in cases:
        kinds = [p.category for p in lib.ht_path.notify(lib.ctx, lib, group, pb, moe, None)]
        assert (kinds.count("launch") == 2) is two_hop, (len(group), len(pb), moe.mode, len(moe.group_tokens))


def test_group_tokens_count_distinct_blocks(routed: np.ndarray) -> None:
    gt = group_tokens(routed, EP)
    off = 0
    for g in (d for d in range(1, EP + 1) if EP % d == 0):
        m = gt[off:off + EP * (EP // g)].reshape(EP, EP // g)
        off += EP * (EP // g)
        want = np.zeros_like(m)
        for s in range(EP):
            for t in range(TOKENS):
                for b in {int(r) // g for r in routed[s, t]}:
                    want[s, b] += 1
        np.testing.assert_array_equal(m, want)
    assert off == gt.size


def test_trace_checks_and_round_trips_group_tokens(tmp_path, routed: np.ndarray) -> None:  # noqa: ANN001
    tr = Trace(world_size=EP, moe=MoeShape(7168.0, 14336.0, 4, 8))
    tr.add_family("ep", [range(EP)])
    gt = group_tokens(routed, EP)
    tr.collective("dispatch", "ep", 1.0, moe_mode="ht", group_tokens=gt)
    tr.validate()
    tr.save(tmp_path / "t.parquet")
    assert Trace.load(tmp_path / "t.parquet").ops[0].group_tokens == tuple(gt)
    tr.collective("dispatch", "ep", 1.0, moe_mode="ht", group_tokens=gt[:-1])
    with pytest.raises(TraceError, match="group_tokens"):
        tr.validate()


@given(st.sampled_from([(64, 8), (64, 4), (256, 8), (48, 6), (32, 2)]), st.integers(1, 8),
       st.integers(1, 8), st.floats(0.0, 1.5), st.integers(0, 2**16))
def test_node_limited_routing_never_exceeds_its_groups(shape, topk_group, top_k, skew, seed) -> None:  # noqa: ANN001
    experts, n_group = shape
    topk_group = min(topk_group, n_group)
    top_k = min(top_k, topk_group * experts // n_group)
    w = expert_weights(experts, "zipf", skew, seed=seed)
    choice = route(16, 4, experts, top_k, w, np.random.default_rng(seed), limit=GroupLimit(n_group, topk_group))
    flat = choice.reshape(-1, top_k)
    groups = flat // (experts // n_group)
    assert max(len(set(r)) for r in groups.tolist()) <= topk_group
    assert all(len(set(r)) == top_k for r in flat.tolist())  # distinct experts
    assert flat.min() >= 0 and flat.max() < experts


def test_node_limited_routing_follows_popularity() -> None:
    """Within the limit the draw still follows expert popularity: with groups = nodes and every
    token allowed all groups, the per-expert shares match the weights."""
    w = expert_weights(32, "zipf", 1.0, seed=1)
    choice = route(4000, 1, 32, 1, w, np.random.default_rng(2), limit=GroupLimit(4, 4))
    share = np.bincount(choice.ravel(), minlength=32) / choice.size
    np.testing.assert_allclose(share, w, atol=0.02)


def test_group_limit_errors_name_the_field() -> None:
    w = expert_weights(64, "uniform")
    with pytest.raises(ConfigError, match="n_group"):
        route(4, 4, 64, 4, w, np.random.default_rng(0), limit=GroupLimit(7, 2))
    with pytest.raises(ConfigError, match="topk_group"):
        route(4, 4, 64, 8, w, np.random.default_rng(0), limit=GroupLimit(64, 4))


def test_model_group_limit_reads_the_models_config() -> None:
    from transformers import AutoConfig

    assert model_group_limit(AutoConfig.for_model("deepseek_v3")) == GroupLimit(8, 4)  # n_group, topk_group
    assert model_group_limit(AutoConfig.for_model("mixtral")) == GroupLimit()


def test_training_routing_scales_a_token_sample() -> None:
    r = ep_routing(16, 64, 6, 1024, 0.3, 0, 1, 2, GroupLimit(8, 2), sample=128)
    assert r.rows.sum() == pytest.approx(16 * 1024 * 6)  # every (token, expert) row
    assert 16 * 1024 <= r.copies.sum() < r.rows.sum()  # one copy per distinct rank
    np.testing.assert_allclose(r.group_tokens[:16 * 16].reshape(16, 16), r.copies)


def test_moe_workload_counts_token_node_pairs_as_deepep_does() -> None:
    """DeepEP's internode convention (tests/legacy/test_internode.py): `num_rdma_token_sent` = the
    (token, node) pairs of a rank's tokens, its own node included."""
    from workloads.moe import workload as moe
    from workloads.moe.schema import MoeConfig, MoeMode

    cfg = MoeConfig(ep=EP, tokens_ht=TOKENS, experts=EXPERTS, top_k=TOP_K, iters=1, warmup=0,
                    dispatch_bytes_per_token=int(FP8), n_group=4, topk_group=2)
    tr, pts = moe.build_trace(cfg, MoeMode.ht, 0, node_ranks=G)
    w = expert_weights(EXPERTS, "uniform")
    choice = route(TOKENS, EP, EXPERTS, TOP_K, w, np.random.default_rng(0), limit=GroupLimit(4, 2))
    nodes = choice // (EXPERTS // EP) // G
    pairs = sum(len(set(tok)) for tok in nodes.reshape(-1, TOP_K).tolist())
    assert max(len(set(tok)) for tok in nodes.reshape(-1, TOP_K).tolist()) <= 2
    disp = next(p for p in pts if p["kind"] == "dispatch")
    assert disp["rdma_bytes_mean"] == pytest.approx(pairs / EP * FP8)
    assert tr.ops[disp["op"]].group_tokens == tuple(group_tokens(choice // (EXPERTS // EP), EP))
