"""The recorder lists what PyTorch TP (DTensor) and FSDP2 actually issue on the fake backend."""

from __future__ import annotations

from collections import Counter

from workloads.modelcost.recorder import record_collectives

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
