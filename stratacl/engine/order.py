"""When an op may start: its explicit deps, stream order and communicator order.

- **Stream order** (`stratacl.trace.stream_predecessors`): ops on one rank's stream run in order,
  as kernels on a device stream do.
- **Communicator order**: collectives on one communicator run in issue (trace) order whatever
  stream they were issued on, as the libraries execute them. NCCL launches each kernel of a
  communicator only after the communicator's previous one, through the communicator's own device
  stream ("Launch kernel, depends on all of {deviceStream, hostStream, userStream[i]...}";
  NVIDIA/nccl src/enqueue.cc ncclLaunchPrepare @5d3ab08); PyTorch's ProcessGroupNCCL issues all
  of a group's collectives on its one internal NCCL stream per device (`ncclStreams_`,
  torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp, torch 2.13), torch_npu's ProcessGroupHCCL
  likewise (`hcclStreams_`). So a user stream only orders what it issues; concurrency comes from
  different communicators, e.g. FSDP2's opt-in separate reduce-scatter process group (torch 2.13
  `FSDPModule.set_separate_reduce_scatter_group`: by default all-gather and reduce-scatter share
  "one NCCL communicator, which processes one collective at a time").

A communicator is one group of a family (`tp[3]`): an op naming the family `tp` runs on every
`tp[i]`, so on each rank the previous collective of the same family is its predecessor. Point-to-
point ops are not ordered here (ProcessGroupNCCL keeps separate per-pair communicators for them).
"""

from __future__ import annotations

import numpy as np

from stratacl.errors import TraceError
from stratacl.trace import Trace, _check_acyclic, family_of, stream_predecessors


def communicator_predecessors(trace: Trace) -> list[list[int]]:
    """Per op: the previous collective on each of its ranks' communicator (empty for other ops).
    Cost: O(total rank memberships of collectives)."""
    last: dict[str, np.ndarray] = {}
    arrays: dict[tuple[int, ...], np.ndarray] = {}
    out: list[list[int]] = [[] for _ in trace.ops]
    for op in trace.ops:
        if op.kind != "collective":
            continue
        arr = arrays.get(op.ranks)
        if arr is None:
            arr = arrays[op.ranks] = np.fromiter(op.ranks, dtype=np.int64, count=len(op.ranks))
        fam = family_of(op.comm)
        lst = last.get(fam)
        if lst is None:
            lst = last[fam] = np.full(trace.world_size, -1, dtype=np.int64)
        prev = lst[arr]
        first = int(prev[0])
        if first >= 0 and (prev == first).all():
            out[op.id] = [first]
        else:
            out[op.id] = [int(x) for x in np.unique(prev) if x >= 0]
        lst[arr] = op.id
    return out


def op_predecessors(trace: Trace) -> list[list[int]]:
    """Deps, stream order and communicator order together; raises TraceError on a cycle (a trace
    whose deps contradict a communicator's issue order would hang a real job too)."""
    preds = stream_predecessors(trace)
    comm = communicator_predecessors(trace)
    merged = [sorted(set(p).union(c)) if c else p for p, c in zip(preds, comm, strict=True)]
    try:
        _check_acyclic(trace, merged)
    except TraceError as exc:
        raise TraceError(f"{exc} or communicator issue order (collectives on one communicator run "
                         "in the order they were issued)") from None
    return merged
