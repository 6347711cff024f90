"""Record the collectives real PyTorch parallelism issues, on the in-process `fake` backend.

One rank is traced per process (the fake group cannot be re-initialised with another
rank), so `record_collectives` runs the trace in a subprocess and returns plain records.
The model is a small stack of transformer-style MLP blocks (Linear up, activation, Linear
down) wrapped with a DTensor tensor-parallel plan (colwise up / rowwise down) and FSDP2
`fully_shard`; parameters are FakeTensors (FSDP2 refuses meta), meshes are made outside
the fake mode. Records: op (allreduce/allgather/reducescatter/alltoall/broadcast), bytes
per rank in the nccl-tests convention (allreduce/reducescatter/alltoall: input buffer,
allgather: output buffer), group size and ranks, phase (forward/backward).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, dataclass

_NORMALISE = {
    "all_reduce": "allreduce", "allreduce_": "allreduce", "allreduce_coalesced_": "allreduce",
    "all_gather_into_tensor": "allgather", "_allgather_base_": "allgather", "allgather_": "allgather",
    "allgather_into_tensor_coalesced_": "allgather", "all_gather_into_tensor_coalesced": "allgather",
    "reduce_scatter_tensor": "reducescatter", "_reduce_scatter_base_": "reducescatter",
    "reduce_scatter_": "reducescatter", "reduce_scatter_tensor_coalesced_": "reducescatter",
    "reduce_scatter_tensor_coalesced": "reducescatter",
    "all_to_all_single": "alltoall", "alltoall_base_": "alltoall", "alltoall_": "alltoall",
    "broadcast": "broadcast", "broadcast_": "broadcast",
}
_OUTPUT_SIZED = {"allgather"}


@dataclass
class CollectiveRecord:
    op: str
    bytes_per_rank: int
    group_size: int
    group_ranks: list[int]
    phase: str
    torch_op: str


def _trace(rank: int, world: int, tp: int, fsdp: int, layers: int, hidden: int, tokens: int) -> list[dict]:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    if tp * fsdp != world:
        raise ValueError(f"world_size: {world} != tp {tp} x fsdp {fsdp}")
    dist.init_process_group("fake", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (fsdp, tp), mesh_dim_names=("fsdp", "tp"))  # outside fake mode

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = nn.Linear(hidden, 4 * hidden, bias=False)
            self.down = nn.Linear(4 * hidden, hidden, bias=False)

        def forward(self, x):
            return x + self.down(torch.relu(self.up(x)))

    records: list[dict] = []
    state = {"phase": "forward"}

    def group_of(arg) -> list[int]:
        if isinstance(arg, str):
            from torch.distributed.distributed_c10d import _resolve_process_group

            arg = _resolve_process_group(arg)
        return dist.get_process_group_ranks(arg)

    class Rec(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = func._schema.name.split("::")[-1]
            op = _NORMALISE.get(name) if func.namespace in ("c10d", "_c10d_functional") else None
            if op is not None:
                flat = tree_flatten((args, kwargs))[0]
                tensors = [a for a in flat if isinstance(a, torch.Tensor)]
                groups = [a for a in flat if isinstance(a, (str, dist.ProcessGroup)) and not isinstance(a, bool)]
                ranks = group_of(groups[-1]) if groups else list(range(world))
                out = func(*args, **kwargs)
                outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
                if op in _OUTPUT_SIZED:
                    size_src = outs if func.namespace == "_c10d_functional" else tensors[:1]
                else:
                    size_src = tensors[-1:] if func.namespace == "c10d" and op == "reducescatter" else tensors[:1]
                nbytes = sum(t.numel() * t.element_size() for t in size_src)
                records.append(asdict(CollectiveRecord(op, int(nbytes), len(ranks), ranks, state["phase"],
                                                       str(func))))
                return out
            return func(*args, **kwargs)

    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with fake:
        model = nn.Sequential(*[Block() for _ in range(layers)])
        if tp > 1:
            for blk in model:
                parallelize_module(blk, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        if fsdp > 1:
            for blk in model:
                fully_shard(blk, mesh=mesh["fsdp"])
            fully_shard(model, mesh=mesh["fsdp"])
        x = torch.empty(tokens, hidden, requires_grad=False)
        # Warm-up iteration: DTensor's sharding propagation runs ops on global shapes once.
        model(x).sum().backward()
        with Rec():
            state["phase"] = "forward"
            y = model(x)
            state["phase"] = "backward"
            y.sum().backward()
    dist.destroy_process_group()
    return records


def record_collectives(world_size: int, tp: int = 1, fsdp: int = 1, layers: int = 2, hidden: int = 64,
                       tokens: int = 8, rank: int = 0, timeout_s: float = 120.0) -> list[CollectiveRecord]:
    """Collectives one rank issues for a forward + backward, traced in a fresh subprocess."""
    args = json.dumps(dict(rank=rank, world=world_size, tp=tp, fsdp=fsdp, layers=layers, hidden=hidden,
                           tokens=tokens))
    proc = subprocess.run([sys.executable, "-m", "workloads.modelcost.recorder", args], capture_output=True,
                          text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"recorder subprocess failed: {proc.stderr.strip().splitlines()[-1:]}")
    return [CollectiveRecord(**r) for r in json.loads(proc.stdout.strip().splitlines()[-1])]


if __name__ == "__main__":
    print(json.dumps(_trace(**json.loads(sys.argv[1]))))
