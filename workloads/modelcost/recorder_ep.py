"""Record expert-parallel all-to-alls of a small MoE model on the in-process `fake` backend.

Each MoE block is: RMSNorm -> router (Linear, softmax, top-k) -> dispatch all-to-all ->
this rank's local experts (Linear, ReLU, Linear) -> combine all-to-all -> gate-weighted sum
-> residual. The all-to-alls are real PyTorch collectives (`all_to_all_single_autograd`
from the functional collectives, or the c10d `torch.distributed.nn.functional
.all_to_all_single`) on the "ep" dimension of a ("dp", "ep") DeviceMesh, so forward
dispatch + combine and the two mirrored all-to-alls autograd issues in backward are all
recorded (with `recorder.record_iteration`).

Fake tensors carry no values, so the router's choice cannot decide the split sizes (and
`.tolist()` on a fake tensor fails). The split sizes are plain ints from a routing model:
`routing_counts` gives, per layer, rows[s][e] = how many (token, expert) rows EP rank s
sends to expert e, either as a seeded top-k draw without replacement from
`RoutingModel.expert_share` (`sampled=True`, each source rank and layer its own seed) or
as the expected counts (`sampled=False`: same on every rank, largest-remainder rounded,
at most `tokens` rows per expert). Experts are placed contiguously (`n_experts // ep` per
rank, as in `RoutingModel.rank_load`). Bytes follow nccl-tests "alltoall": bytes per rank
= the whole send buffer; the records also carry per-peer send/receive bytes.
"""

from __future__ import annotations

import json
import sys
import zlib

import numpy as np

from workloads.common.routing import RoutingModel

from .errors import CostInputError
from .recorder import CollectiveRecord, _run_traced


def routing_counts(routing: RoutingModel, tokens: int, top_k: int, n_experts: int, ep: int,
                   layer: int = 0, sampled: bool = True) -> list[list[int]]:
    """rows[s][e]: (token, expert) rows EP rank s routes to expert e in MoE layer `layer`.

    Every rank holds `tokens` tokens and sends each to `top_k` distinct experts, so each
    row sums to tokens * top_k and no entry exceeds `tokens`.
    """
    if n_experts % ep:
        raise CostInputError(f"ep: {ep} does not divide n_experts={n_experts}")
    if not 1 <= top_k <= n_experts:
        raise CostInputError(f"top_k: must be in 1..n_experts={n_experts}, got {top_k}")
    share = routing.expert_share(n_experts)
    if not sampled:
        return [_expected_counts(share, tokens, top_k)] * ep
    rows = []
    for src in range(ep):
        rng = np.random.default_rng(zlib.crc32(f"{routing.seed}/{layer}/{src}".encode()))
        # Gumbel top-k = sampling top_k distinct experts per token proportionally to share.
        keys = np.log(share)[None, :] + rng.gumbel(size=(tokens, n_experts))
        chosen = np.argpartition(-keys, top_k - 1, axis=1)[:, :top_k]
        rows.append([int(c) for c in np.bincount(chosen.ravel(), minlength=n_experts)])
    return rows


def _expected_counts(share: np.ndarray, tokens: int, top_k: int) -> list[int]:
    """tokens * top_k rows by share, capped at `tokens` per expert, rounded to ints."""
    total = tokens * top_k
    want = share * total
    for _ in range(len(share)):  # water-fill the excess of capped experts onto the others
        over = want > tokens
        if not over.any():
            break
        free = ~over & (want < tokens)
        excess = float((want[over] - tokens).sum())
        want[over] = tokens
        want[free] += excess * want[free] / want[free].sum()
    counts = np.minimum(np.floor(want + 1e-9).astype(int), tokens)
    for e in np.argsort(-(want - counts), kind="stable"):  # largest remainder
        if counts.sum() >= total:
            break
        if counts[e] < tokens:
            counts[e] += 1
    return [int(c) for c in counts]


def moe_split_sizes(rows: list[list[int]], ep_rank: int) -> tuple[list[int], list[int]]:
    """(input_split_sizes, output_split_sizes) in rows for the dispatch on EP rank `ep_rank`.

    The combine all-to-all uses them swapped; autograd's backward all-to-alls mirror each.
    """
    ep, n_experts = len(rows), len(rows[0])
    per = n_experts // ep
    send = [sum(rows[ep_rank][d * per:(d + 1) * per]) for d in range(ep)]
    recv = [sum(rows[s][ep_rank * per:(ep_rank + 1) * per]) for s in range(ep)]
    return send, recv


def _trace_moe(rank: int, world: int, ep: int, layers: int, hidden: int, tokens: int,
               n_experts: int, top_k: int, expert_hidden: int, routing: dict, sampled: bool,
               impl: str) -> list[dict]:
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fcol
    import torch.distributed.nn.functional as dist_nn
    from torch import nn
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh

    from .recorder import record_iteration

    if world % ep:
        raise ValueError(f"world_size: {world} is not a multiple of ep {ep}")
    if impl not in ("functional", "c10d"):
        raise ValueError(f"impl: {impl!r}; valid options: functional, c10d")
    dist.init_process_group("fake", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world // ep, ep), mesh_dim_names=("dp", "ep"))  # outside fake
    ep_group, ep_rank = mesh["ep"].get_group(), mesh["ep"].get_local_rank()
    route = RoutingModel(**routing)
    per = n_experts // ep
    local = range(ep_rank * per, (ep_rank + 1) * per)

    def all_to_all(x, out_splits, in_splits):
        if impl == "functional":
            return fcol.all_to_all_single_autograd(x, out_splits, in_splits, ep_group)
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        return dist_nn.all_to_all_single(out, x, out_splits, in_splits, group=ep_group)

    class MoEBlock(nn.Module):
        def __init__(self, layer: int) -> None:
            super().__init__()
            self.rows = routing_counts(route, tokens, top_k, n_experts, ep, layer, sampled)
            self.in_splits, self.out_splits = moe_split_sizes(self.rows, ep_rank)
            self.norm = nn.RMSNorm(hidden)
            self.router = nn.Linear(hidden, n_experts, bias=False)
            self.experts = nn.ModuleList(
                nn.Sequential(nn.Linear(hidden, expert_hidden, bias=False), nn.ReLU(),
                              nn.Linear(expert_hidden, hidden, bias=False)) for _ in local)

        def forward(self, x):
            h = self.norm(x)
            gate, _ = torch.topk(self.router(h).softmax(-1), top_k, dim=-1)  # [T, k]
            # Send buffer: row t*k+j is token t for its j-th expert, ordered by destination
            # (the real permutation is data-dependent; its shape is not).
            send = h.repeat_interleave(top_k, dim=0)
            recv = all_to_all(send, self.out_splits, self.in_splits)  # dispatch
            # recv is [source][local expert]; group rows by expert, run each, restore order.
            chunks = torch.split(recv, [self.rows[s][e] for s in range(ep) for e in local])
            by_expert = [torch.cat([chunks[s * per + j] for s in range(ep)]) for j in range(per)]
            done = [expert(rows) for expert, rows in zip(self.experts, by_expert, strict=True)]
            back = [torch.split(d, [self.rows[s][e] for s in range(ep)])
                    for d, e in zip(done, local, strict=True)]
            y = torch.cat([back[j][s] for s in range(ep) for j in range(per)])
            out = all_to_all(y, self.in_splits, self.out_splits)  # combine
            return x + (out.view(tokens, top_k, hidden) * gate.unsqueeze(-1)).sum(1)

    records: list[dict] = []
    state = {"phase": "forward"}
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = nn.Sequential(*[MoEBlock(i) for i in range(layers)])
        x = torch.empty(tokens, hidden)
        record_iteration(model, x, world, records, state)
    dist.destroy_process_group()
    return records


def record_moe_collectives(world_size: int, ep: int, layers: int = 2, hidden: int = 64,
                           tokens: int = 8, n_experts: int = 4, top_k: int = 2,
                           expert_hidden: int | None = None, routing: RoutingModel | None = None,
                           sampled: bool = True, impl: str = "functional", rank: int = 0,
                           timeout_s: float = 120.0) -> list[CollectiveRecord]:
    """All-to-alls one rank issues for a forward + backward of a `layers`-block MoE (fp32).

    The mesh is ("dp", "ep") = (world_size // ep, ep), row-major, so the EP group of `rank`
    is its row. Split sizes: `moe_split_sizes(routing_counts(routing, tokens, top_k,
    n_experts, ep, layer, sampled), ep_rank)`. Records come in issue order: per layer
    dispatch then combine in forward; per layer (last first) combine then dispatch backward.
    """
    route = routing or RoutingModel()
    routing_counts(route, tokens, top_k, n_experts, ep)  # validate before spawning
    return _run_traced("workloads.modelcost.recorder_ep",
                       dict(rank=rank, world=world_size, ep=ep, layers=layers, hidden=hidden,
                            tokens=tokens, n_experts=n_experts, top_k=top_k,
                            expert_hidden=expert_hidden or 2 * hidden,
                            routing=dict(kind=route.kind, skew=route.skew, seed=route.seed),
                            sampled=sampled, impl=impl), timeout_s)


if __name__ == "__main__":
    print(json.dumps(_trace_moe(**json.loads(sys.argv[1]))))
