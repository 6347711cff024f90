"""Per-iteration figures of a training replay, from the engine's one accounting."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from stratacl.trace import Op, Trace, family_of
from stratacl.vocab import CoreKind, KernelClass, OpKind
from stratacl.workload_api import Exposure

if TYPE_CHECKING:
    from stratacl.engine.replay import SimResult
    from stratacl.machine.fabric import Fabric

COMM_SPLIT = ("wire", "copy", "sync", "register", "launch")
# the step breakdown's compute categories (README "Training step breakdown"), in print order
STEP_PARTS = ("gemm", "attention_fwd", "attention_bwd", "elementwise", "loss", "optimizer", "fsdp_copy")
PASSES = ("fwd", "rfwd", "bwd", "wgrad")  # the pass segment of a training op's name (schedule.py, pipeline.py)
_CUBE = (KernelClass.gemm, KernelClass.grouped_gemm)
_ATTENTION = (KernelClass.attention_prefill, KernelClass.attention_decode, KernelClass.attention_backward)


def iteration_figures(exp: Exposure) -> dict[str, float]:
    """Iteration time, the compute it contains and the communication left exposed (inline TP/EP
    collectives and FSDP gathers that were not prefetched in time), from `SimResult.exposure()`."""
    out = {"iteration_time_s": exp.time_s, "compute_s": exp.compute_s, "exposed_comm_s": exp.exposed_comm_s}
    for cat in COMM_SPLIT:
        out[f"comm_{cat}_s"] = getattr(exp, f"{cat}_s")
    out["comm_time_s"] = exp.comm_ops_s
    return out


def pass_of(name: str) -> str:
    """fwd | rfwd | bwd | wgrad from a training op's name ("layer3.attention.bwd.attn"); "" if none."""
    return next((p for p in name.split(".") if p in PASSES), "")


def step_part(op: Op) -> str:
    """The breakdown category of one compute op (STEP_PARTS): matmul kernels are GEMM, the fused
    attention kernel splits by pass, the optimizer step and the LM head's element-wise kernels (the
    final norm and the loss over the vocabulary) have their own, as do FSDP2's copy-in / copy-out
    kernels; every other kernel is element-wise."""
    if op.name.startswith("optimizer"):
        return "optimizer"  # the step and gradient clipping
    if "_copy_in" in op.name or op.name.endswith("fsdp_copy_out"):
        return "fsdp_copy"
    if op.kernel in _CUBE or (not op.kernel and op.core == CoreKind.cube):
        return "gemm"
    if op.kernel in _ATTENTION:
        return "attention_bwd" if pass_of(op.name) in ("bwd", "wgrad") else "attention_fwd"
    if op.name.startswith("lm_head."):
        return "loss"
    return "elementwise"


def comm_key(op: Op) -> str:
    """`<family>_<collective>` of a communication op (`exposed_<key>_s`), e.g. "fsdp_allgather"."""
    return f"{family_of(op.comm) or 'p2p'}_{op.coll or op.kind}"


def step_breakdown(trace: Trace, res: SimResult, fabric: Fabric, time_s: float) -> dict[str, float]:
    """Where one iteration's time goes, per die (mean over the trace's dies):

    - `step_<part>_s`: kernel seconds of each compute category (STEP_PARTS; launch included), and
      `step_recompute_s` the part of them spent re-running forwards (activation checkpointing). Their
      sum exceeds `compute_s` where kernels of two streams overlap (DualPipe's pairs);
    - `exposed_<family>_<collective>_s`: exposed time (no compute running) during which a
      collective of that communicator family and type is in flight, e.g. `exposed_fsdp_allgather_s`;
      collectives in flight together count in each, so these may sum above `exposed_comm_s` (with
      pipelining, `pipeline.stage_figures` replaces them by each stage's own);
    - `mfu`: model FLOPs utilisation, the matmul FLOPs of the step's forward and backward passes
      (recompute left out; as the op counter measures them, so causal attention's masked half is not
      counted) over the iteration time `time_s` × the die's dense peak in each kernel's format, per die."""
    dur = res.end - res.start
    world = float(trace.world_size)
    out = {f"step_{p}_s": 0.0 for p in STEP_PARTS} | {"step_recompute_s": 0.0}
    comm: dict[str, list[int]] = {}
    peak_s = 0.0  # the model's matmul work at peak, die-seconds per die
    for i, op in enumerate(trace.ops):
        if op.kind == OpKind.compute:
            share = float(dur[i]) * len(op.ranks) / world
            out[f"step_{step_part(op)}_s"] += share
            if pass_of(op.name) == "rfwd":
                out["step_recompute_s"] += share
            elif op.core != CoreKind.vector:
                peak_s += float(np.mean(op.flops)) * len(op.ranks) / world / fabric.cube_peak(op.dtype)
        elif op.kind in (OpKind.collective, OpKind.p2p):
            comm.setdefault(comm_key(op), []).append(i)
    out["mfu"] = peak_s / time_s if time_s > 0 else 0.0
    for key, ids in sorted(comm.items()):
        mask = np.zeros(len(trace.ops), dtype=bool)
        mask[ids] = True
        out[f"exposed_{key}_s"] = res.exposure(while_ops=mask).exposed_while_s
    return out
