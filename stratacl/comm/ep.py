"""Expert-parallel dispatch/combine across nodes as DeepEP's normal kernels run it (`moe_ht_path:
node_forward`); the flat path (one copy per destination rank, straight to it) is the plain full mesh.

DeepEP V1 normal kernels (deepseek-ai/DeepEP csrc/kernels/legacy/internode.cu @dd758ca, `dispatch`
and `combine`; docs/legacy.md "Normal kernels with NVLink and RDMA forwarding"):

- dispatch: a token goes **once per destination node** over RDMA, to the GPU of that node with the
  sender's local index (`translate_dst_rdma_rank(dst_rdma_rank, nvl_rank)`); that GPU's forwarder
  warps copy it over NVLink to every GPU of its node that hosts one of the token's experts. Tokens
  for the sender's own node are written into its own receive buffer (no NIC: `dst_rdma_rank !=
  rdma_rank` guards the put) and forwarded the same way. RDMA and NVLink traffic run at once
  (chunked, channel by channel), so one wire phase loads both planes.
- combine: the reverse: each GPU sends its partial sum of a token over NVLink to the forwarder with
  the token owner's local index, which reduces the node's partials and sends **one BF16 copy per
  (token, node)** back over RDMA.
- notify (`notify_dispatch`): per-rank / per-expert counts to the same-index GPU of every node over
  RDMA, then inside the node over NVLink (two synchronised exchanges), after the layout kernel
  (`get_dispatch_layout`, layout.cu) has read the routing (top-k indices) and written the per-rank
  flags.
- channels: `num_sms / 2` channels (internode.cu: `num_channels = num_sms / 2`), one SM sending and
  one forwarding / receiving per channel; the library's `comm_cores` is DeepEP's `num_sms` (SMs
  the kernel holds for its lifetime).

The same two-hop path is CANN's `commAlg="hierarchy"` on Atlas A2 (ops-transformer
mc2/moe_distribute_dispatch_v2/docs/aclnnMoeDistributeDispatchV4.md @28ee37e: "only same-index
cards of different servers use RDMA; inside the server HCCS"); on A3 CANN offers only full-mesh
templates.

What the trace must say: the (token, destination rank) and (token, destination node) counts
(`Op.group_tokens`, one matrix per block size the group could have, g = 1 the ranks); the bytes per
token follow from them and the op's `peer_bytes` (its format: FP8 + scales, BF16, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stratacl.comm.context import NODE_FORWARD, CommContext, PricesOps
from stratacl.comm.mechanism import Mechanism
from stratacl.comm.registry import Registry
from stratacl.config import MoeHtPath
from stratacl.machine.fabric import Fabric
from stratacl.machine.phases import Phase, delay

ALGORITHM = NODE_FORWARD  # the plan name it reports (a one-step concurrent exchange)
TOPK_IDX_BYTES = 8  # DeepEP's topk_idx_t is int64 (deep_ep.topk_idx_t)
COUNT_BYTES = 4  # int32 counts in the notify exchange


@dataclass(frozen=True, slots=True)
class MoeOp:
    """A dispatch/combine as its lowering sees it: the kernel family (`ht` / `ll`), the bytes of one
    token copy, the experts per rank and top_k of the layer (the trace's `MoeShape`), and the op's
    (token, block) counts (`Op.group_tokens`)."""

    mode: str
    bytes_per_copy: float
    experts_per_rank: int = 1
    top_k: int = 0
    group_tokens: tuple[float, ...] = ()


MoeArgs = MoeOp | None  # None: not a dispatch/combine, or one whose layer shape the trace lacks


def node_size(fabric: Fabric, group: tuple[int, ...]) -> int:
    """Members per node when the group fills its nodes in member order with equal contiguous blocks
    (member i in block i // g), else 0 (the two-hop path needs same-index peers on every node)."""
    nodes = np.asarray(group) // fabric.dies_per_node
    cuts = np.flatnonzero(np.diff(nodes)) + 1
    sizes = {len(b) for b in np.split(nodes, cuts)}
    if len(sizes) != 1 or len(np.unique(nodes)) != len(cuts) + 1:
        return 0
    return sizes.pop()


def block_tokens(group_tokens: tuple[float, ...], n: int, g: int) -> np.ndarray:
    """The n × n/g (token, block) counts for blocks of g members out of `Op.group_tokens`."""
    off = 0
    for d in range(1, n + 1):
        if n % d:
            continue
        size = n * (n // d)
        if d == g:
            return np.asarray(group_tokens[off:off + size], dtype=float).reshape(n, n // d)
        off += size
    raise ValueError(f"no block size {g} for a group of {n}")


def dispatch_flows(copies: np.ndarray, pairs: np.ndarray, g: int) -> tuple[np.ndarray, np.ndarray]:
    """Token flows of one node-forwarding dispatch, in tokens (row = sender): (over the scale-out
    plane, inside the node). `copies[s, t]`: tokens s sends to rank t (one per distinct destination
    rank); `pairs[s, b]`: tokens s sends to node b (one per distinct destination node); g ranks per
    node, rank = node·g + local index."""
    n = copies.shape[0]
    idx = np.arange(n)
    node, local = idx // g, idx % g
    rdma = np.zeros((n, n))
    for b in range(n // g):
        away = node != b
        rdma[idx[away], b * g + local[away]] = pairs[away, b]
    # forwarder f = (node t, local s) carries s's copies for t; f = s itself inside s's node
    fwd = (local[:, None] == local[None, :]).astype(float) @ copies
    fwd = np.where(node[:, None] == node[None, :], fwd, 0.0)
    np.fill_diagonal(fwd, 0.0)
    return rdma, fwd


def flow_bytes(coll: str, copies: np.ndarray, pairs: np.ndarray, g: int, bytes_per_token: float) -> np.ndarray:
    """n × n bytes each rank puts on the wire to each other rank (row = sender): the dispatch's
    flows, or their reverse for a combine (the forwarder reduces its node's partials first)."""
    rdma, fwd = dispatch_flows(copies, pairs, g)
    flows = (rdma + fwd) * bytes_per_token
    out: np.ndarray = flows.T if coll == "combine" else flows
    return out


def notify_groups(group: tuple[int, ...], g: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The notify's two exchanges for rank 0's view: its same-index peers on every node (RDMA) and
    its own node (NVLink); every rank's are alike."""
    return tuple(group[::g]), tuple(group[:g])


def notify_bytes(n: int, g: int, experts_per_rank: int) -> tuple[float, float]:
    """Bytes per rank of the notify's RDMA and NVLink count exchanges (internode.cu
    `notify_dispatch`): to each node, the token counts of its g ranks, of its experts and of the
    node itself; inside the node, each RDMA rank's per-rank counts."""
    nodes = n // g
    return (COUNT_BYTES * nodes * (g + experts_per_rank * g + 1), COUNT_BYTES * g * nodes)


def layout_bytes(tokens: float, top_k: int, n: int) -> float:
    """HBM bytes of DeepEP's layout kernel (layout.cu `get_dispatch_layout`): it reads the top-k
    expert indices and writes a token × rank flag matrix plus per-rank / node / expert counts."""
    return tokens * (top_k * TOPK_IDX_BYTES + n)


# ---------------------------------------------------------------------------- the HT paths


HT_PATHS: Registry[type[FlatHt]] = Registry("moe_ht_path")


@HT_PATHS.register(MoeHtPath.flat)
class FlatHt(Mechanism):
    """`moe_ht_path: flat`: every rank-level copy straight to its destination rank (the plain full
    mesh); the counts go first as one rank-level all-to-all."""

    def __init__(self, config: object) -> None:
        self.config = config

    def node_flows(self, ctx: CommContext, coll: str, group: tuple[int, ...], peer_bytes: tuple[float, ...],
                   moe: MoeArgs) -> tuple[int, tuple[float, ...]]:
        """(ranks per node, n×n wire bytes) when this path replaces the rank-level matrix; (g, ())
        where the rank-level exchange runs."""
        return 0, ()

    def notify(self, ctx: CommContext, ops: PricesOps, group: tuple[int, ...], peer_bytes: tuple[float, ...],
               moe: MoeArgs, cores: int | None) -> list[Phase]:
        """The count exchange before an HT dispatch, priced as the library runs operators (`ops`)."""
        return ops.op_phases("alltoall", COUNT_BYTES * len(group), group, cores)


@HT_PATHS.register(MoeHtPath.node_forward)
class NodeForwardHt(FlatHt):
    """`moe_ht_path: node_forward`: DeepEP's normal kernels (module docstring): once per (token,
    node) over RDMA, forwarded inside the node; the count exchange is the layout kernel and the
    two-hop `notify_dispatch`. The flat path runs where forwarding does not apply: LL mode, a group
    inside one node (DeepEP's intranode kernels send straight over NVLink), one that does not fill
    its nodes in equal contiguous blocks, or an op without (token, node) counts."""

    def node_flows(self, ctx: CommContext, coll: str, group: tuple[int, ...], peer_bytes: tuple[float, ...],
                   moe: MoeArgs) -> tuple[int, tuple[float, ...]]:
        if moe is None or moe.mode != "ht":
            return 0, ()
        n = len(group)
        g = node_size(ctx.fabric, group)
        gtok = moe.group_tokens
        if g < 2 or g == n or not gtok or not peer_bytes:
            return g, ()
        copies = block_tokens(gtok, n, 1)
        # the op's own bytes per token (its format): peer_bytes counts one copy per destination rank
        per_token = float(np.sum(peer_bytes)) / max(float(copies.sum()), 1e-300)
        return g, tuple(flow_bytes(coll, copies, block_tokens(gtok, n, g), g, per_token).ravel())

    def notify(self, ctx: CommContext, ops: PricesOps, group: tuple[int, ...], peer_bytes: tuple[float, ...],
               moe: MoeArgs, cores: int | None) -> list[Phase]:
        n = len(group)
        # node_flows' conditions for forwarding, without building its n×n matrix
        g = node_size(ctx.fabric, group) if moe is not None and moe.mode == "ht" else 0
        if moe is None or not (2 <= g < n and moe.group_tokens):
            return super().notify(ctx, ops, group, peer_bytes, moe, cores)
        tokens = float(block_tokens(moe.group_tokens, n, n).max())  # routed tokens of the busiest rank
        layout = delay("launch", ctx.launch_us * 1e-6
                       + layout_bytes(tokens, moe.top_k, n) / ctx.fabric.hbm_Bps)
        rdma_g, node_g = notify_groups(group, g)
        rdma_b, nvl_b = notify_bytes(n, g, moe.experts_per_rank)
        rdma = ops.op_phases("alltoall", rdma_b, rdma_g, cores) if len(rdma_g) > 1 else []
        nvl = [p for p in ops.op_phases("alltoall", nvl_b, node_g, cores) if p.category != "launch"]
        return [*layout, *rdma, *nvl]
