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
`tp[i]`. Where a family's groups are disjoint (the harness's own tp/fsdp/ep), a rank is in one group
of it, so on each rank the previous collective of the same family is its predecessor. Where they
overlap (an imported trace's process groups `pg[k]`, one family), the order is kept per group: two
groups sharing a rank are two communicators and run concurrently. Point-to-point ops are not
ordered here (ProcessGroupNCCL keeps separate per-pair communicators for them).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import numpy as np

from stratacl.errors import TraceError
from stratacl.trace import Trace, _check_acyclic, family_of, stream_predecessors
from stratacl.vocab import OpKind


def communicator_predecessors(trace: Trace) -> list[Sequence[int]]:
    """Per op: the previous collective on each of its ranks' communicator (empty for other ops).
    Cost: O(total rank memberships of collectives)."""
    last: dict[str, np.ndarray] = {}  # family -> last op per rank, once its ops differ in ranks
    same: dict[str, tuple[tuple[int, ...], int]] = {}  # family -> (ranks, last op) while they do not
    arrays: dict[tuple[int, ...], np.ndarray] = {}
    out: list[Sequence[int]] = [()] * len(trace.ops)
    overlapping = _overlapping_families(trace)
    for op in trace.ops:
        if op.kind != OpKind.collective:
            continue
        fam = family_of(op.comm)
        if fam in overlapping:  # a rank is in several of its groups: order per group
            fam = op.comm
        lst = last.get(fam)
        if lst is None:  # fast path: a family's ops usually all span the same ranks
            prior = same.get(fam)
            if prior is None or prior[0] == op.ranks:
                out[op.id] = (prior[1],) if prior else ()
                same[fam] = (op.ranks, op.id)
                continue
            lst = last[fam] = np.full(trace.world_size, -1, dtype=np.int64)
            lst[list(prior[0])] = prior[1]
        arr = arrays.get(op.ranks)
        if arr is None:
            arr = arrays[op.ranks] = np.fromiter(op.ranks, dtype=np.int64, count=len(op.ranks))
        prev = lst[arr]
        first = int(prev[0])
        if first >= 0 and (prev == first).all():
            out[op.id] = [first]
        else:
            out[op.id] = [int(x) for x in np.unique(prev) if x >= 0]
        lst[arr] = op.id
    return out


def _overlapping_families(trace: Trace) -> set[str]:
    """Families with two groups that share a rank."""
    seen: dict[str, set[int]] = {}
    out: set[str] = set()
    for name, ranks in trace.communicators.items():
        fam = family_of(name)
        members = seen.setdefault(fam, set())
        if members.intersection(ranks):
            out.add(fam)
        members.update(ranks)
    return out


def op_predecessors(trace: Trace) -> list[list[int]]:
    """Deps, stream order and communicator order together; raises TraceError on a cycle (a trace
    whose deps contradict a communicator's issue order would hang a real job too). Memoised per
    trace while no op is added (a trace replays once per library)."""
    hit = _MEMO.get(id(trace))
    if hit is not None and hit[0]() is trace and hit[1] == len(trace.ops):
        return hit[2]
    preds = stream_predecessors(trace)  # acyclic, checked there
    merged = preds
    for i, comm in enumerate(communicator_predecessors(trace)):
        extra = [j for j in comm if j not in preds[i]]
        if extra:  # most collectives already follow their communicator's last op on their stream
            if merged is preds:
                merged = list(preds)
            merged[i] = sorted([*preds[i], *extra])
    if merged is not preds:
        try:
            _check_acyclic(trace, merged)
        except TraceError as exc:
            raise TraceError(f"{exc} or communicator issue order (collectives on one communicator run "
                             "in the order they were issued)") from None
    _MEMO.clear()  # one trace at a time: replay_all replays it per library, then the next comes
    _MEMO[id(trace)] = (weakref.ref(trace), len(trace.ops), merged)
    return merged


_MEMO: dict[int, tuple[weakref.ref[Trace], int, list[list[int]]]] = {}
