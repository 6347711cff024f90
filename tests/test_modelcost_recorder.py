"""The recorder lists what PyTorch TP (DTensor), FSDP2, TP x FSDP2 and expert-parallel all-to-all
actually issue on the fake backend."""

from __future__ import annotations

from collections import Counter

import pytest

from workloads.common.routing import RoutingModel
from workloads.modelcost.recorder import record_collectives
from workloads.modelcost.recorder_ep import moe_split_sizes, record_moe_collectives, routing_counts

HIDDEN, TOKENS, LAYERS = 64, 8, 2
F32 = 4


def test_tp_two_layers_allreduces():
    recs = record_collectives(world_size=2, tp=2, layers=LAYERS, hidden=HIDDEN, tokens=TOKENS)
    assert {r.op for r in recs} == {"allreduce"}
    fwd = [r for r in recs if r.phase == "forward"]
    bwd = [r for r in recs if r.phase == "backward"]
    # One all-reduce per rowwise `down` in forward; in backward one per colwise `up` whose input
    # needs a gradient (the first block's input is data, so only the second block's).
    assert len(fwd) == LAYERS and len(bwd) == LAYERS - 1
    assert all(r.bytes_per_rank == TOKENS * HIDDEN * F32 and r.group_ranks == [0, 1] for r in recs)


def test_fsdp_two_layers_allgathers_and_reducescatters():
    recs = record_collectives(world_size=2, fsdp=2, layers=LAYERS, hidden=HIDDEN, tokens=TOKENS)
    count = Counter((r.op, r.phase) for r in recs)
    # Reshard-after-forward: gather each block in forward and again in backward; one
    # reduce-scatter of each block's gradients.
    assert count == {("allgather", "forward"): LAYERS, ("allgather", "backward"): LAYERS,
                     ("reducescatter", "backward"): LAYERS}
    block_bytes = 2 * HIDDEN * 4 * HIDDEN * F32  # up + down weights, unsharded (nccl-tests size)
    assert all(r.bytes_per_rank == block_bytes and r.group_size == 2 for r in recs)


def test_tp_x_fsdp_allreduces_on_tp_rows_and_fsdp_traffic_on_columns():
    # 2-D ("fsdp", "tp") = (2, 2) mesh traced as rank 3: TP group [2, 3], FSDP group [1, 3].
    recs = record_collectives(world_size=4, tp=2, fsdp=2, layers=LAYERS, hidden=HIDDEN,
                              tokens=TOKENS, rank=3)
    count = Counter((r.op, r.phase, tuple(r.group_ranks)) for r in recs)
    tp_grp, fsdp_grp = (2, 3), (1, 3)
    assert count == {("allreduce", "forward", tp_grp): LAYERS,
                     ("allreduce", "backward", tp_grp): LAYERS - 1,
                     ("allgather", "forward", fsdp_grp): LAYERS,
                     ("allgather", "backward", fsdp_grp): LAYERS,
                     ("reducescatter", "backward", fsdp_grp): LAYERS}
    tp_block_bytes = 2 * HIDDEN * 4 * HIDDEN * F32 // 2  # FSDP gathers this rank's TP shard
    for r in recs:
        assert r.group_size == 2
        want = TOKENS * HIDDEN * F32 if r.op == "allreduce" else tp_block_bytes
        assert r.bytes_per_rank == want, r


# --- expert parallelism: all-to-all with split sizes from a routing model -------------------

N_EXPERTS, TOP_K = 4, 2
SKEWED = RoutingModel("zipf", skew=1.2, seed=3)


def test_routing_counts_rows_are_valid_top_k_draws():
    for layer in range(3):
        rows = routing_counts(SKEWED, TOKENS, TOP_K, N_EXPERTS, ep=2, layer=layer)
        assert len(rows) == 2 and all(len(r) == N_EXPERTS for r in rows)
        assert all(sum(r) == TOKENS * TOP_K and max(r) <= TOKENS for r in rows)
    assert routing_counts(SKEWED, TOKENS, TOP_K, N_EXPERTS, 2, 0) != routing_counts(
        SKEWED, TOKENS, TOP_K, N_EXPERTS, 2, 1)  # each layer draws its own routing
    even = routing_counts(RoutingModel(), TOKENS, TOP_K, N_EXPERTS, ep=2, sampled=False)
    assert even == [[TOKENS * TOP_K // N_EXPERTS] * N_EXPERTS] * 2
    assert moe_split_sizes(even, 1) == ([TOKENS, TOKENS], [TOKENS, TOKENS])
    skew = routing_counts(SKEWED, TOKENS, TOP_K, N_EXPERTS, ep=2, sampled=False)
    assert all(sum(r) == TOKENS * TOP_K and max(r) <= TOKENS for r in skew)
    # dispatch on ep rank r sends rows[r] grouped by destination; receives column blocks
    rows = [[1, 2, 5, 8], [2, 1, 7, 6]]
    assert moe_split_sizes(rows, 0) == ([3, 13], [3, 3])
    assert moe_split_sizes(rows, 1) == ([3, 13], [13, 13])


@pytest.mark.parametrize("impl", ["functional", pytest.param("c10d", marks=pytest.mark.slow)])
def test_moe_two_layers_dispatch_and_combine_all_to_alls(impl: str):
    # world 4 = ("dp", "ep") (2, 2); rank 3 is EP rank 1 of group [2, 3].
    recs = record_moe_collectives(world_size=4, ep=2, layers=LAYERS, hidden=HIDDEN, tokens=TOKENS,
                                  n_experts=N_EXPERTS, top_k=TOP_K, routing=SKEWED, impl=impl,
                                  rank=3)
    assert all(r.op == "alltoall" and r.group_ranks == [2, 3] and r.group_size == 2 for r in recs)
    row = HIDDEN * F32
    expected = []  # (phase, send bytes per peer, recv bytes per peer), in issue order
    splits = [moe_split_sizes(routing_counts(SKEWED, TOKENS, TOP_K, N_EXPERTS, 2, layer), 1)
              for layer in range(LAYERS)]
    for send, recv in splits:  # forward: dispatch, combine (splits swapped)
        expected += [("forward", send, recv), ("forward", recv, send)]
    for send, recv in reversed(splits):  # backward: combine's grad, then dispatch's grad
        expected += [("backward", send, recv), ("backward", recv, send)]
    got = [(r.phase, r.send_split_bytes, r.recv_split_bytes) for r in recs]
    assert got == [(p, [s * row for s in snd], [s * row for s in rcv]) for p, snd, rcv in expected]
    # nccl-tests alltoall convention: bytes per rank = the whole send buffer
    assert all(r.bytes_per_rank == sum(r.send_split_bytes) for r in recs)
    dispatch = [r.bytes_per_rank for r in recs[0:LAYERS * 2:2]]
    assert dispatch == [TOKENS * TOP_K * row] * LAYERS
    # the skewed routing really makes the all-to-all uneven
    assert any(len(set(r.send_split_bytes)) > 1 for r in recs)
