"""Lowering of compute and local-copy ops: a roofline on the die's cores and HBM (the compute hub).

A compute op loads its core type (FLOPs / peak) and HBM (bytes / bandwidth) at once, so alone it
takes max(compute time, memory time); beside communication it slows down when a transfer holds
vector cores or a staging copy takes HBM bandwidth. Per-rank vectors use the slowest rank: an
SPMD op ends when its last rank does. Communication ops are not lowered here (`stratacl.comm`).
"""

from __future__ import annotations

from stratacl.fabric import Fabric, R
from stratacl.phases import Phase
from stratacl.trace import Op


def lower_compute(op: Op, fabric: Fabric) -> list[Phase]:
    flops = max(op.flops)
    hbm = max(op.hbm_bytes)
    core = R["cube"] if op.core == "cube" else R["vec"]
    peak = fabric.cube_peak(op.dtype) if op.core == "cube" else fabric.vector_flops
    loads = []
    if flops > 0:
        loads.append(("all", core, flops / peak))
    if hbm > 0:
        loads.append(("all", R["hbm"], hbm / fabric.hbm_Bps))
    n = len(op.ranks)
    hbm_total = sum(op.per_rank(op.hbm_bytes))
    if not loads:
        return [Phase("compute", delay_s=op.fixed_time_s)] if op.fixed_time_s > 0 else []
    return [Phase("compute", loads=tuple(loads), min_time_s=op.fixed_time_s,
                  hbm_bytes=hbm_total if n else 0.0)]


def lower_memcpy(op: Op, fabric: Fabric) -> list[Phase]:
    """Device-local copy: read + write of nbytes per rank through HBM."""
    nbytes = max(op.nbytes)
    if nbytes <= 0:
        return []
    return [Phase("copy", loads=(("all", R["hbm"], 2 * nbytes / fabric.hbm_Bps),),
                  hbm_bytes=2 * float(sum(op.per_rank(op.nbytes))),
                  copy_bytes=float(sum(op.per_rank(op.nbytes))))]


class ComputeLowering:
    """Lowers compute and memcpy ops, memoised by op shape (layers repeat)."""

    KINDS = ("compute", "memcpy")

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self._cache: dict[tuple, list[Phase]] = {}

    def lower(self, op: Op) -> list[Phase]:
        key = (op.kind, op.ranks, op.nbytes, op.flops, op.hbm_bytes, op.core, op.fixed_time_s, op.dtype)
        hit = self._cache.get(key)
        if hit is None:
            fn = lower_compute if op.kind == "compute" else lower_memcpy
            hit = self._cache[key] = fn(op, self.fabric)
        return hit
