"""Peak HBM per die: sharded fp32 state, unsharded FSDP buffers, activations, library buffers."""

from __future__ import annotations

from stratacl.errors import ConfigError

from .blocks import ModelPlan
from .checkpointing import AcMode, kept_bytes
from .layout import Layout
from .schedule import Knobs


def local_params(plan: ModelPlan, layout: Layout) -> int:
    return sum(layout.shard_params(u) for u in plan.units)


def memory_breakdown(plan: ModelPlan, layout: Layout, knobs: Knobs, library_bytes: float,
                     overhead_bytes: float = 0.0) -> dict[str, float]:
    """Bytes per die by kind, at the backward peak (where activations are largest)."""
    local = local_params(plan, layout)
    gathered = max(u.params + u.expert_params for u in plan.units)
    # each unit keeps what its checkpointing keeps (a checkpointed block its input besides); one
    # checkpointed block's recomputed activations live while its backward runs
    acs = [knobs.unit_ac(plan.units, i) for i in range(len(plan.units))]
    boundary = plan.boundary_bytes / (sum(1 for u in plan.units if u.decoder) or 1)
    acts = sum(kept_bytes(u, ac) + (boundary if ac != AcMode.none else 0.0) for u, ac in zip(plan.units, acs, strict=True))
    acts += max((u.saved_bytes - kept_bytes(u, ac) for u, ac in zip(plan.units, acs, strict=True) if ac != AcMode.none),
                default=0.0)
    return {
        "params": local * knobs.master_bytes,
        "grads": local * knobs.grad_bytes,
        "optimizer": local * knobs.state_bytes,
        # prefetch + 1 gathered units in flight and one unit's unsharded gradient
        "fsdp_buffers": gathered * ((knobs.prefetch + 1) * knobs.act_bytes + knobs.grad_bytes),
        "activations": acts,
        "library": library_bytes,
        "overhead": overhead_bytes,
    }


def check_fits(breakdown: dict[str, float], hbm_bytes: float, library: str, ac: AcMode,
               allocator_failed: bool = False) -> None:
    """A ConfigError when the tensors do not fit, or (`allocator_failed`) when the allocator's
    replay ran out although their sums fit (its rounding and fragmentation on top)."""
    total = sum(breakdown.values())
    if total <= hbm_bytes and not allocator_failed:
        return
    parts = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in breakdown.items())
    if total <= hbm_bytes:
        parts += "; the allocator's rounding and fragmentation on top run out"
    fix = "raise workload.fsdp/ep (more shards), lower workload.global_batch or seq_len"
    if ac != AcMode.full:
        fix = "set workload.ac=full (activation checkpointing of every block), or " + fix
    raise ConfigError("workload", f"layout needs {total / 1e9:.1f} GB per die with library '{library}' "
                      f"but a die has {hbm_bytes / 1e9:.1f} GB ({parts} GB)", fix)
