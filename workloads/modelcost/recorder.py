"""Record the collectives real PyTorch parallelism issues, on the in-process `fake` backend.

One rank is traced per process (the fake group cannot be re-initialised with another
rank), so `record_collectives` runs the trace in a subprocess and returns plain records.
The model is a small stack of transformer-style MLP blocks (Linear up, activation, Linear
down) wrapped with a DTensor tensor-parallel plan (colwise up / rowwise down) and FSDP2
`fully_shard`; parameters are FakeTensors (FSDP2 refuses meta), meshes are made outside
the fake mode. Records: op (allreduce/allgather/reducescatter/alltoall/broadcast), bytes
per rank in the nccl-tests convention (allreduce/reducescatter/alltoall: input buffer,
allgather: output buffer), group size and ranks, phase (forward/backward).

TP x FSDP on a 2-D ("fsdp", "tp") mesh. Unpatched, `fully_shard` of a TP-parallelised
block fails inside PyTorch with `DynamicOutputShapeException: aten.nonzero.default`:
for DTensor parameters FSDP2 (`FSDPParam._init_sharding_spec_tp`) builds the combined
mesh with `DeviceMesh._concatenate([dp_mesh, tp_mesh])`, whose `DeviceMesh.__init__`
materialises the mesh tensor and finds this rank's coordinates with
`(mesh_tensor == rank).nonzero()`. That runs inside the FakeTensorMode the model is built
in, so the mesh tensor is a FakeTensor and `nonzero` has a data-dependent output shape.
Creating the meshes outside the mode does not help, because this mesh is created by
FSDP2 itself. `_fake_safe_device_mesh` suspends the fake mode (`unset_fake_temporarily`)
around `DeviceMesh._concatenate` only, so the mesh bookkeeping uses real int tensors
while parameters, activations and collectives stay fake; it is applied only while the
model is being parallelised and is undone afterwards.

The process group of a c10d op is a `torch.ScriptObject` (unboxed to a ProcessGroup);
functional collectives carry a group name. Send/receive buffers are found by the op
schema's argument names, so uneven all-to-alls (`alltoall_base_`, whose first argument is
the *output*) are sized by the send buffer. Expert-parallel all-to-all with a routing
model is recorded by `workloads.modelcost.recorder_ep.record_moe_collectives`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

import contextlib
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
# Schema argument names of the send (input) and receive (output) buffers of c10d and
# functional collectives.
_SEND_ARGS = ("input", "input_tensor", "input_tensors", "inputs", "tensors")
_RECV_ARGS = ("output", "output_tensor", "output_tensors", "outputs")
_GROUP_ARGS = ("process_group", "group_name", "group")


@dataclass
class CollectiveRecord:
    op: str
    bytes_per_rank: int
    group_size: int
    group_ranks: list[int]
    phase: str
    torch_op: str
    # all-to-all only: bytes this rank sends to / receives from each group member (in
    # group-rank order); None for other collectives.
    send_split_bytes: list[int] | None = None
    recv_split_bytes: list[int] | None = None


def _collective_recorder(world: int, records: list[dict], state: dict):
    """A TorchDispatchMode appending one record per collective to `records`.

    `state["phase"]` is stamped on each record; the caller switches it between forward and
    backward.
    """
    import torch
    import torch.distributed as dist
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    def group_ranks(arg) -> list[int]:
        if arg is None:
            return list(range(world))
        if isinstance(arg, str):
            from torch.distributed.distributed_c10d import _resolve_process_group

            arg = _resolve_process_group(arg)
        elif isinstance(arg, torch.ScriptObject):
            arg = dist.ProcessGroup.unbox(arg)
        return dist.get_process_group_ranks(arg)

    def tensors(value) -> list:
        return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]

    def nbytes(ts) -> int:
        return int(sum(t.numel() * t.element_size() for t in ts))

    def split_bytes(buf, splits, n: int) -> list[int]:
        rows = buf.shape[0] if buf.dim() else 1
        row_bytes = (buf.numel() // rows if rows else 0) * buf.element_size()
        splits = list(splits) if splits else [rows // n] * n
        return [int(s) * row_bytes for s in splits]

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = func._schema.name.split("::")[-1]
            op = _NORMALISE.get(name) if func.namespace in ("c10d", "_c10d_functional") else None
            if op is None:
                return func(*args, **kwargs)
            bound = dict(zip((a.name for a in func._schema.arguments), args, strict=False))
            bound.update(kwargs)
            group = next((bound[k] for k in _GROUP_ARGS if k in bound), None)
            ranks = group_ranks(group)
            out = func(*args, **kwargs)
            send = next((tensors(bound[k]) for k in _SEND_ARGS if k in bound), [])
            recv = next((tensors(bound[k]) for k in _RECV_ARGS if k in bound), None)
            if recv is None:  # functional collectives return their output
                recv = tensors(out)
            size_src = recv if op in _OUTPUT_SIZED else send
            send_split = recv_split = None
            if op == "alltoall":
                if name == "alltoall_":  # list form: one tensor per peer
                    send_split, recv_split = [nbytes([t]) for t in send], [nbytes([t]) for t in recv]
                else:
                    send_split = split_bytes(send[0], bound.get("input_split_sizes"), len(ranks))
                    recv_split = split_bytes(recv[0], bound.get("output_split_sizes"), len(ranks))
            records.append(asdict(CollectiveRecord(op, nbytes(size_src), len(ranks), ranks,
                                                   state["phase"], str(func), send_split,
                                                   recv_split)))
            return out

    return Recorder()


@contextlib.contextmanager
def _fake_safe_device_mesh():
    """Let FSDP2 build its (dp, tp) DeviceMesh inside a FakeTensorMode (see module doc)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    original = DeviceMesh.__dict__["_concatenate"]

    def concatenate(device_mesh_list):
        with unset_fake_temporarily():
            return original.__func__(device_mesh_list)

    DeviceMesh._concatenate = staticmethod(concatenate)
    try:
        yield
    finally:
        DeviceMesh._concatenate = original


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
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with fake:
        model = nn.Sequential(*[Block() for _ in range(layers)])
        if tp > 1:
            for blk in model:
                parallelize_module(blk, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        if fsdp > 1:
            with _fake_safe_device_mesh():
                for blk in model:
                    fully_shard(blk, mesh=mesh["fsdp"])
                fully_shard(model, mesh=mesh["fsdp"])
        x = torch.empty(tokens, hidden, requires_grad=False)
        # Warm-up iteration: DTensor's sharding propagation runs ops on global shapes once.
        model(x).sum().backward()
        record_iteration(model, x, world, records, state)
    dist.destroy_process_group()
    return records


def record_iteration(model: torch.nn.Module, x: torch.Tensor, world: int, records: list,
                     state: dict) -> None:
    """One forward + backward with the collectives recorded and tagged by phase."""
    with _collective_recorder(world, records, state):
        state["phase"] = "forward"
        y = model(x)
        state["phase"] = "backward"
        y.sum().backward()


def _run_traced(module: str, kwargs: dict, timeout_s: float) -> list[CollectiveRecord]:
    """Run `python -m module '<json kwargs>'` and parse the records it prints last."""
    proc = subprocess.run([sys.executable, "-m", module, json.dumps(kwargs)], capture_output=True,
                          text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"recorder subprocess failed: {proc.stderr.strip().splitlines()[-1:]}")
    return [CollectiveRecord(**r) for r in json.loads(proc.stdout.strip().splitlines()[-1])]


def record_collectives(world_size: int, tp: int = 1, fsdp: int = 1, layers: int = 2, hidden: int = 64,
                       tokens: int = 8, rank: int = 0, timeout_s: float = 120.0) -> list[CollectiveRecord]:
    """Collectives one rank issues for a forward + backward, traced in a fresh subprocess.

    `world_size` must equal `tp * fsdp`; the mesh is ("fsdp", "tp") row-major, so the TP
    group of `rank` is its row and the FSDP group its column.
    """
    return _run_traced("workloads.modelcost.recorder",
                       dict(rank=rank, world=world_size, tp=tp, fsdp=fsdp, layers=layers,
                            hidden=hidden, tokens=tokens), timeout_s)


if __name__ == "__main__":
    print(json.dumps(_trace(**json.loads(sys.argv[1]))))
