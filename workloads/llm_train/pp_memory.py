"""A pipeline rank's tensors under ZeRO 1/2/3, in its schedule's order, through the allocator.

Per die of pipeline rank r (only its stages' units):
- ZeRO-3: fp32 parameter shard; a unit's bf16 parameters gathered at its first use and kept until
  its last micro-batch's backward (freed after each forward too with `reshard_after_forward`),
  as the trace gathers them (pipeline.py); the full gradient accumulated over micro-batches
  (pipelining disables FSDP's gradient sync until the last one).
- ZeRO-2: fp32 shard plus the full bf16 parameters, replicated (kept); the unsharded gradient
  transient, the sharded gradient kept (reduce-scattered every micro-batch).
- ZeRO-1: as ZeRO-2, and the full gradient kept (accumulated over micro-batches, reduce-scattered
  once per step).
Optimizer moments on the shard at every stage. Activations: a forward keeps the unit's saved
tensors per micro-batch (or, checkpointed, its input and what a selective policy saves) until the backward;
with the input/weight split the weight part (`weight_fraction` of them, ASSUMPTION) lives until the
W action. The number of micro-batches in flight is whatever the schedule's order makes it.
"""

from __future__ import annotations

from stratacl.memory import MemoryPeak
from stratacl.workload_api import Library

from .allocation import ITERATIONS
from .blocks import ModelPlan
from .checkpointing import AcMode, kept_bytes
from .layout import Layout
from .pipeline import Pipe, chunk_units
from .pp_schedules import rank_steps, stage_rank
from .schedule import Knobs


def rank_units(plan: ModelPlan, layout: Layout, pipe: Pipe, r: int) -> list[int]:
    n = pipe.n_stages(layout.pp)
    chunks = chunk_units(plan, n, pipe.split)
    return [i for c in range(n) if stage_rank(c, layout.pp, pipe.schedule) == r for i in chunks[c]]


def pipeline_ops(plan: ModelPlan, layout: Layout, k: Knobs, pipe: Pipe, r: int) -> list[tuple]:
    """Start-up and ITERATIONS iterations of pipeline rank r as ("alloc", name, bytes) / ("free", name)."""
    units = plan.units
    chunks = chunk_units(plan, pipe.n_stages(layout.pp), pipe.split)
    mine = rank_units(plan, layout, pipe, r)
    local = {i: layout.shard_params(units[i]) for i in mine}
    full = {i: units[i].params + units[i].expert_params for i in mine}
    boundary = plan.boundary_bytes / (sum(1 for u in units if u.decoder) or 1)
    wf = pipe.weight_fraction
    ops: list[tuple] = [("alloc", f"param{i}", local[i] * k.master_bytes) for i in mine]
    if pipe.zero < 3:
        ops += [("alloc", f"replica{i}", full[i] * k.act_bytes) for i in mine]
    steps = rank_steps(pipe.schedule, layout.pp, pipe.microbatches, pipe.virtual, pipe.combined)[r]

    held: set[int] = set()

    def gather(i: int, on: bool) -> None:
        if pipe.zero != 3 or on == (i in held):
            return
        ops.append(("alloc", f"unsharded{i}", full[i] * k.act_bytes) if on else ("free", f"unsharded{i}"))
        (held.add if on else held.discard)(i)

    def keep(i: int, mb: int, nbytes: float | None = None) -> None:  # saved activations: input and weight part
        nbytes = units[i].saved_bytes if nbytes is None else nbytes
        ops.append(("alloc", f"act{i}.{mb}.in", nbytes * (1 - wf)))
        ops.append(("alloc", f"act{i}.{mb}.w", nbytes * wf))

    for it in range(ITERATIONS):
        for step in steps:
            for a in step:
                acs = [k.unit_ac(units, i) for i in chunks[a.stage]]
                ckpt = [ac != AcMode.none for ac in acs]
                if a.kind == "F":
                    for i, ac in zip(chunks[a.stage], acs, strict=True):
                        gather(i, True)
                        if ac != AcMode.none:
                            kept = kept_bytes(units[i], ac)
                            ops.append(("alloc", f"boundary{i}.{a.mb}", boundary + kept))  # + what SAC saves
                            ops += [("alloc", f"tmp{i}", units[i].saved_bytes - kept), ("free", f"tmp{i}")]
                        else:
                            keep(i, a.mb)
                        if pipe.reshard_after_forward:
                            gather(i, False)
                    continue
                for i, c in zip(reversed(chunks[a.stage]), reversed(ckpt), strict=True):
                    if a.kind == "W":
                        ops.append(("free", f"act{i}.{a.mb}.w"))
                        if c:
                            ops.append(("free", f"boundary{i}.{a.mb}"))
                        continue
                    gather(i, True)
                    if c:
                        keep(i, a.mb, units[i].saved_bytes - kept_bytes(units[i], k.unit_ac(units, i)))  # recomputed
                    if pipe.zero != 2:
                        if it == 0 and a.mb == 0:
                            ops.append(("alloc", f"fgrad{i}", full[i] * k.grad_bytes))  # kept, accumulated
                    else:
                        ops.append(("alloc", f"ugrad{i}", full[i] * k.grad_bytes))
                    ops.append(("free", f"act{i}.{a.mb}.in"))
                    if a.kind == "B":
                        ops.append(("free", f"act{i}.{a.mb}.w"))
                        if c:
                            ops.append(("free", f"boundary{i}.{a.mb}"))
                    if a.mb == pipe.microbatches - 1:
                        gather(i, False)
                    if pipe.zero == 2:
                        if it == 0 and a.mb == 0:
                            ops.append(("alloc", f"grad{i}", local[i] * k.grad_bytes))  # kept
                        ops.append(("free", f"ugrad{i}"))
        if it == 0:
            for i in mine:
                ops.append(("alloc", f"exp_avg{i}", local[i] * k.state_bytes / 2))
                ops.append(("alloc", f"exp_avg_sq{i}", local[i] * k.state_bytes / 2))
    return ops


def pipeline_peak(plan: ModelPlan, layout: Layout, k: Knobs, pipe: Pipe, library: Library,
                  capacity_bytes: float, expandable_segments: bool = True) -> MemoryPeak | None:
    """The largest reserved peak over the pipeline ranks; None if one runs out of memory."""
    worst = None
    for r in range(layout.pp):
        mem = library.die_memory(capacity_bytes, 0, expandable_segments=expandable_segments)
        peak = mem.peak(pipeline_ops(plan, layout, k, pipe, r))
        if peak is None:
            return None
        if worst is None or peak.reserved > worst.reserved:
            worst = peak
    return worst


def pipeline_breakdown(plan: ModelPlan, layout: Layout, k: Knobs, pipe: Pipe, library_bytes: float,
                       overhead_bytes: float = 0.0) -> dict[str, float]:
    """Bytes per die by kind on the pipeline rank holding the most (tensor sums, before the
    allocator's rounding and fragmentation)."""
    best: dict[str, float] = {}
    for r in range(layout.pp):
        live: dict[str, float] = {}
        acts = top = 0.0
        for op in pipeline_ops(plan, layout, k, pipe, r):
            if not op[1].startswith(("act", "boundary", "tmp")):
                continue
            if op[0] == "alloc":
                live[op[1]] = op[2]
                acts += op[2]
                top = max(top, acts)
            else:
                acts -= live.pop(op[1], 0.0)
        peak = {"activations": top}
        mine = rank_units(plan, layout, pipe, r)
        local = sum(layout.shard_params(plan.units[i]) for i in mine)
        full = [plan.units[i].params + plan.units[i].expert_params for i in mine]
        rep = sum(full) * k.act_bytes if pipe.zero < 3 else 0.0
        out = {"params": local * k.master_bytes + rep,
               "grads": sum(full) * k.grad_bytes if pipe.zero != 2 else local * k.grad_bytes,
               "optimizer": local * k.state_bytes,
               # ZeRO-3: the stage's units gathered (one at a time with reshard_after_forward);
               # ZeRO-2: one unit's unsharded gradient
               "fsdp_buffers": (max(full) if pipe.reshard_after_forward else sum(full)) * k.act_bytes
               if pipe.zero == 3 else max(full) * k.grad_bytes if pipe.zero == 2 else 0.0,
               **peak, "library": library_bytes, "overhead": overhead_bytes}
        if not best or sum(out.values()) > sum(best.values()):
            best = out
    return best
