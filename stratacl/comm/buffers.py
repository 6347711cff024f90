"""How big a buffer-centric library makes its communication buffers.

HCCL gives every communicator two buffers (send and receive) of HCCL_BUFFSIZE MiB, default 200,
exclusively its own (CANN environment-variable reference, HCCL_BUFFSIZE; REFERENCE §3). A
framework may configure a size per communicator (`hccl_buffer_size` in the process group's HCCL
config; vLLM-Ascend does so for every group but the MoE one, vllm_ascend/utils.py
`get_hccl_config_for_pg_options`), else the communicator takes the process-wide HCCL_BUFFSIZE.

The fused MoE dispatch/combine (CANN `MoeDistributeDispatch`/`Combine`, "MC2") lays its windows
out inside the buffer of its EP communicator, so deployments raise HCCL_BUFFSIZE to what the
operator documents (CANN ops-transformer, aclnnMoeDistributeDispatchV2-V4 "环境变量约束",
Atlas A3, EP communicator, commAlg "fullmesh_v1" / default):

    HCCL_BUFFSIZE >= 2 * (localExpertNum * maxBs * epWorldSize * Align512(Align32(2 * H) + 64)
                          + (K + sharedExpertNum) * maxBs * Align512(2 * H))      bytes, in MiB

Since HCCL_BUFFSIZE is process-wide, every communicator without its own configured size (the
MoE one and the default/world group) then holds buffers of that size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from stratacl.memory.allocator import MiB
from stratacl.memory.communicators import Communicator, MoeWindows


def _align(x: int, a: int) -> int:
    return -(-x // a) * a


def moe_window_bytes(w: MoeWindows, ep_ranks: int) -> int:
    """The documented lower bound of HCCL_BUFFSIZE (bytes) for the fused dispatch/combine."""
    token_in = _align(_align(2 * w.hidden, 32) + 64, 512)  # one dispatched token + scale/index
    token_out = _align(2 * w.hidden, 512)  # one combined token (BF16)
    return 2 * (w.local_experts * w.max_tokens * ep_ranks * token_in
                + (w.top_k + w.shared_experts) * w.max_tokens * token_out)


def buffer_sizes_MiB(comms: Sequence[Communicator], default_MiB: float) -> dict[str, float]:
    """The buffer size (MiB) of each communicator with peers: its configured size, else the
    process-wide default raised to what the MoE windows on any communicator need."""
    env = default_MiB
    for c in comms:
        if c.moe is not None and c.ranks > 1:
            env = max(env, float(math.ceil(moe_window_bytes(c.moe, c.ranks) / MiB)))
    out: dict[str, float] = {}
    for c in comms:
        if c.ranks < 2:
            continue  # a one-rank group exchanges nothing: no communicator buffers
        if c.moe is not None:
            out[c.name] = env  # MC2 partitions its windows by HCCL_BUFFSIZE, not per-group config
        else:
            out[c.name] = c.buffer_MiB if c.buffer_MiB is not None else env
    return out
