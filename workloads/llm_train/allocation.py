"""One die's tensors over training iterations, run through the library's device allocator.

FSDP2 as TorchTitan runs it, per die: the sharded fp32 parameters of every unit exist from the
start; each iteration all-gathers a unit's parameters into an unsharded bf16 tensor before its
forward (`prefetch` units ahead) and frees it after (reshard after forward); the forward keeps the
unit's saved activations (one tensor per sub-block), or, when the block is checkpointed
(checkpointing.py), its input and what a selective policy saves; the backward gathers the
parameters again, recomputes the rest of the activations if the block was checkpointed, produces the unit's unsharded gradient, reduce-scatters it into the sharded gradient
(allocated at the first backward and kept) and frees the rest; the optimizer step allocates its
states at the first step. Two iterations run, so the second reuses what the first cached, as in
steady state.

The allocator's reserved peak (tensors plus what it could not reuse: fragmentation, more with
expandable segments off) is what the die must hold.
"""

from __future__ import annotations

from stratacl.memory import GiB, MemoryPeak
from stratacl.workload_api import Library

from .blocks import ModelPlan
from .checkpointing import AcMode, kept_bytes
from .layout import Layout
from .schedule import Knobs

ITERATIONS = 2


def iteration_ops(plan: ModelPlan, layout: Layout, k: Knobs) -> list[tuple]:
    """Start-up and ITERATIONS training iterations as ("alloc", name, bytes) / ("free", name)."""
    ops: list[tuple] = []
    units = plan.units
    local = [layout.shard_params(u) for u in units]
    full = [u.params + u.expert_params for u in units]
    decoders = sum(1 for u in units if u.decoder) or 1
    boundary = plan.boundary_bytes / decoders
    for i, n in enumerate(local):
        ops.append(("alloc", f"param{i}", n * k.master_bytes))

    def saved(i: int, tag: str, nbytes: float | None = None) -> None:
        subs = max(1, len(units[i].subs))
        nbytes = units[i].saved_bytes if nbytes is None else nbytes
        for j in range(subs):
            ops.append(("alloc", f"{tag}{i}.{j}", nbytes / subs))

    def free_saved(i: int, tag: str) -> None:
        for j in range(max(1, len(units[i].subs))):
            ops.append(("free", f"{tag}{i}.{j}"))

    gathered: list[int] = []

    def gather(i: int) -> None:
        if 0 <= i < len(units) and i not in gathered:
            ops.append(("alloc", f"unsharded{i}", full[i] * k.act_bytes))
            gathered.append(i)

    for it in range(ITERATIONS):

        for i, u in enumerate(units):  # forward
            for j in range(i, i + k.prefetch + 1):
                gather(j)
            ac = k.unit_ac(units, i)
            checkpoint = ac != AcMode.none
            if checkpoint:
                kept = kept_bytes(u, ac)
                ops.append(("alloc", f"boundary{i}", boundary))
                if kept:
                    saved(i, "kept", kept)  # what the selective policy saves
                saved(i, "tmp", u.saved_bytes - kept)  # the rest lives only while it runs
                free_saved(i, "tmp")
            else:
                saved(i, "act")
            ops.append(("free", f"unsharded{i}"))
            gathered.remove(i)
        for i in reversed(range(len(units))):  # backward
            for j in range(i, i - k.prefetch - 1, -1):
                gather(j)
            u = units[i]
            ac = k.unit_ac(units, i)
            checkpoint = ac != AcMode.none
            if checkpoint:
                saved(i, "act", u.saved_bytes - kept_bytes(u, ac))  # recomputed
            ops.append(("alloc", f"ugrad{i}", full[i] * k.grad_bytes))
            free_saved(i, "act")
            if checkpoint:
                if kept_bytes(u, ac):
                    free_saved(i, "kept")
                ops.append(("free", f"boundary{i}"))
            ops.append(("free", f"unsharded{i}"))
            gathered.remove(i)
            if it == 0:
                ops.append(("alloc", f"grad{i}", local[i] * k.grad_bytes))  # kept across iterations
            ops.append(("free", f"ugrad{i}"))
        if it == 0:  # Adam's two moments, created at the first step
            for i, n in enumerate(local):
                ops.append(("alloc", f"exp_avg{i}", n * k.state_bytes / 2))
                ops.append(("alloc", f"exp_avg_sq{i}", n * k.state_bytes / 2))
    return ops


def allocator_peak(plan: ModelPlan, layout: Layout, k: Knobs, library: Library, capacity_bytes: float,
                   expandable_segments: bool = True) -> MemoryPeak | None:
    """The sequence's peaks through the library's allocator on `capacity_bytes`; None if it runs out of memory."""
    mem = library.die_memory(capacity_bytes, 0, expandable_segments=expandable_segments)
    return mem.peak(iteration_ops(plan, layout, k))


def describe(p: MemoryPeak) -> str:
    return (f"{p.reserved / GiB:.1f} GiB reserved ({p.fragmentation / GiB:.2f} GiB fragmentation, "
            f"expandable segments {'on' if p.expandable_segments else 'off'})")
