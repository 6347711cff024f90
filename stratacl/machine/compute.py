"""Lowering of compute and local-copy ops on the die's AI cores and HBM (the compute hub).

Kernel kinds (docs/architecture.md; Ascend split architecture, a core group = 1 cube core + its vector cores):
- ``cube``: matmul on the AIC only; loads the die's cube capacity with FLOPs / cube peak.
- ``vector``: AIV only (norms, routing, element-wise, quantisation); loads the vector capacity.
- ``mixed``: every block pairs an AIC with its AIVs (fused attention, fused grouped matmul with
  quantisation/activation). Its cube and vector pipelines overlap inside a block, so on all core
  groups it takes t_group = max(cube FLOPs / cube peak, vector FLOPs / vector peak), and it keeps
  whole groups busy for that time: it loads *both* the cube and the vector capacity with t_group.
  A communication kernel holding half the AIVs therefore leaves it half the complete groups and it
  runs at most at half rate, while a cube-only kernel, which loads only the cube capacity, is not
  slowed by held AIVs.

A kernel launches on at most `block_dim` cores (AIC / AIV / groups, as Ascend C counts blockDim)
and at most what its stream's core limit allows (`Trace.stream_cores`). The achieved-throughput
kernel model (stratacl/machine/kernel_model.py, the die's `fabric.die.kernel` facts) prices it on those c
of C cores: its compute part (attainable fraction of the format's peak, tile padding and wave
quantisation over c cores) scales with c, its memory part (its HBM bytes plus tile re-reads, at
the class's attainable HBM fraction) reaches the die's HBM rate with `hbm_saturation_cores`. The
phase loads HBM with its bytes at the die's rate and its cores with what each part keeps busy: the
compute part c/C of them for its time, the memory part the cores that issue its loads, min(c, sat)/C
for its time (on fewer than sat cores it reaches that share of the HBM rate, so the core-seconds it
needs are the same m·sat/C whatever c is) — the larger of the two, since both run in the same
blocks. A minimum time of max(compute part, memory part) + ramp on its cores caps its rate, so it
leaves the rest of the die to kernels of other streams; beside communication it slows when a copy
takes HBM bandwidth or a transfer holds cores it needs: a communication kernel holding h of C cores
(GPU SMs, `cores_shared`) leaves a compute-bound kernel C − h of them (time × C / (C − h)) and a
memory-bound one its full rate while C − h ≥ sat, else (C − h) / sat of it. A launch delay precedes
it. Beside communication's HBM traffic its memory latency grows and it slows by the die's
`comm_hbm_stall` exposure (stratacl/engine/interference.py) even when compute-bound. Per-rank
vectors use the slowest rank: an SPMD op ends when its last rank does.
Communication ops are not lowered here (`stratacl.comm`).

Local copies (`memcpy`: device-to-device) run on the SDMA engines when the die has them — runtime
memcpy tasks are SDMA tasks (HCCL fault guide: "SDMA memory copy task", taskType Memcpy) — so they
load the SDMA pool and HBM (read + write) and hold no AI core; without engines, HBM only.

Host transfers (`memcpy` with `peer` "host" / "pool") move bytes between the die's HBM
and host DRAM: after the small-op latency (`fabric.host`), one fluid phase loads the die's port
on the host plane (rx for h2d, tx for d2h: the same port its collectives use), its HBM once, its
SDMA engines, and the CPU's link (role "cpu": one pseudo-die per CPU, the engine's
`Replay._roles`) with the bytes of all the op's ranks on that CPU — so two dies on one CPU share
its link, and a fetch shares the die's port with the MoE or collective traffic beside it. The same
bytes load the CPU's DRAM (`fabric.host.dram_Bps`, the pseudo-die's "hbm" resource): one capacity
for both directions, so a fetch and a write-back on one CPU share it while each has a link way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stratacl.config import Plane
from stratacl.errors import TraceError
from stratacl.machine.fabric import Fabric, R
from stratacl.machine.kernel_model import kernel_model
from stratacl.machine.phases import Phase
from stratacl.trace import Op
from stratacl.vocab import CopyDirection, CoreKind, HostPeer, OpKind, PhaseCategory

NO_LIMIT = (0, 0)


def core_fraction(op: Op, fabric: Fabric, limit: tuple[int, int] = NO_LIMIT) -> float:
    """Fraction of the die's cores of its kind a kernel runs on: block_dim and its stream's
    (AIC, AIV) limit cap it (NO_LIMIT: the whole die)."""
    aic, aiv = limit
    if op.core == CoreKind.cube:
        total, cap = fabric.cube_cores, aic
    elif op.core == CoreKind.vector:
        total, cap = fabric.vector_cores, aiv
    else:  # mixed: complete core groups (1 AIC + its AIVs) within both limits
        total, cap = fabric.cube_cores, min(aic, int(aiv // fabric.aiv_per_group))
    if limit == NO_LIMIT:
        cap = total
    used = min(total, cap, op.block_dim or total)
    if used < 1:
        raise TraceError(f"{op.label()}: its stream's core limit {limit} leaves no {op.core} core "
                         f"(a mixed kernel needs 1 AIC + {fabric.aiv_per_group:g} AIV per block)")
    return used / total


def rank_sum(op: Op, values: tuple[float, ...]) -> float:
    """float(sum(op.per_rank(values))) without the array: one value per rank added left to right,
    as the builtin sum does over the array (the same additions, so the same result)."""
    if len(values) != 1:
        return float(sum(op.per_rank(values)))
    x = float(values[0])
    total = x
    for _ in range(len(op.ranks) - 1):
        total += x
    return total


def lower_compute(op: Op, fabric: Fabric, limit: tuple[int, int] = NO_LIMIT) -> list[Phase]:
    """A kernel priced by the die's kernel model (stratacl/machine/kernel_model.py) as one fluid phase:
    its cores loaded for its compute part at the share it runs on, HBM loaded with its bytes (re-
    reads included) at the die's rate, and a minimum time of max(compute part, memory part) on the
    cores it gets; preceded by the kernel's launch."""
    flops, vflops, hbm = max(op.flops), max(op.vector_flops), max(op.hbm_bytes)
    if flops <= 0 and vflops <= 0 and hbm <= 0:
        return [Phase(PhaseCategory.compute, delay_s=op.fixed_time_s)] if op.fixed_time_s > 0 else []
    frac = core_fraction(op, fabric, limit)
    km = kernel_model(fabric)
    kt = km.price(op, frac, fabric.cube_peak(op.dtype), fabric.vector_flops, fabric.cube_format(op.dtype))
    loads: list[tuple[str, int, float]] = []
    # core-seconds (at die capacity) its blocks keep busy: the compute part on its cores, the memory
    # part on the cores that saturate HBM (module docstring)
    core_s = max(kt.compute_s * frac, kt.memory_s * min(frac, km.sat_cores / fabric.cube_cores))
    if core_s > 0:
        if op.core in (CoreKind.cube, CoreKind.mixed):
            loads.append(("all", R["cube"], core_s))
        if op.core in (CoreKind.vector, CoreKind.mixed):
            loads.append(("all", R["vec"], core_s))
    if kt.hbm_bytes > 0:
        loads.append(("all", R["hbm"], kt.hbm_bytes / fabric.hbm_Bps))
    min_t = max(op.fixed_time_s, kt.alone_s)
    phase = Phase(PhaseCategory.compute, loads=tuple(loads), min_time_s=min_t,
                  hbm_bytes=rank_sum(op, op.hbm_bytes) + kt.reread_bytes * len(op.ranks),
                  hbm_stall=km.cfg.comm_hbm_stall)
    return [Phase(PhaseCategory.launch, delay_s=kt.launch_s), phase] if kt.launch_s > 0 else [phase]


def lower_memcpy(op: Op, fabric: Fabric) -> list[Phase]:
    """Device-local copy: read + write of nbytes per rank through HBM, on the SDMA engines."""
    nbytes = max(op.nbytes)
    if nbytes <= 0:
        return []
    loads = [("all", R["hbm"], 2 * nbytes / fabric.hbm_Bps)]
    if fabric.sdma_Bps > 0:
        loads.append(("all", R["sdma"], nbytes / fabric.sdma_Bps))
    total = rank_sum(op, op.nbytes)
    return [Phase(PhaseCategory.copy, loads=tuple(loads), hbm_bytes=2 * total, copy_bytes=total)]


def lower_host(op: Op, fabric: Fabric) -> list[Phase]:
    """Host<->device transfer (module doc): latency, then die port + HBM + SDMA + the CPU link."""
    host = fabric.host
    if not host.cpus_per_node:
        raise TraceError(f"{op.label()}: fabric '{fabric.name}' has no host CPUs "
                         "(set fabric.host.cpus_per_node and its link)")
    per_rank = op.per_rank(op.nbytes)
    nbytes = float(per_rank.max())
    if nbytes <= 0:
        return []
    h2d, pool = op.direction == CopyDirection.h2d, op.peer == HostPeer.pool
    if pool:  # striped evenly over every CPU of the pool
        cpu_bytes = float(per_rank.sum()) / len(host.cpus(op.ranks, pool=True))
        lat = host.remote_read_s if h2d else host.remote_write_s
    else:
        cpu_of = np.asarray([host.cpu_of(r) for r in op.ranks])
        cpu_bytes = float(np.bincount(cpu_of - cpu_of.min(), weights=per_rank).max())
        lat = host.read_s if h2d else host.write_s
    way_die, way_cpu = ("rx", "tx") if h2d else ("tx", "rx")
    plane = host.plane
    loads = [("all", R[f"{plane}_{way_die}"], nbytes / fabric.port_Bps[plane]),
             ("cpu", R[f"{plane}_{way_cpu}"], cpu_bytes / host.link_Bps),
             ("all", R["hbm"], nbytes / fabric.hbm_Bps)]
    if host.dram_Bps > 0:  # the CPU's DRAM: reads and writes share it
        loads.append(("cpu", R["hbm"], cpu_bytes / host.dram_Bps))
    if pool:
        loads += _remote_pool_loads(fabric, op.ranks, nbytes, plane, way_die)
    if fabric.sdma_Bps > 0:
        loads.append(("all", R["sdma"], nbytes / fabric.sdma_Bps))
    total = float(per_rank.sum())
    phase = Phase(PhaseCategory.wire, loads=tuple(loads), wire_bytes=total, hbm_bytes=total)
    return [Phase(PhaseCategory.wire, delay_s=lat), phase] if lat > 0 else [phase]


def _remote_pool_loads(fabric: Fabric, ranks: tuple[int, ...], nbytes: float, plane: Plane,
                       way: str) -> list[tuple[str, int, float]]:
    """The part of a die's pool bytes striped onto other nodes' CPUs, on the die's port of the
    plane between nodes when the host link does not reach them (a GPU host's PCIe: another node's
    DRAM comes through the NIC, GPUDirect RDMA); none where the host plane spans the nodes
    (CloudMatrix384's EMS pool over UB)."""
    host = fabric.host
    remote = 1.0 - host.cpus_per_node / len(host.cpus(ranks, pool=True))
    if remote <= 0:
        return []
    far = fabric.tier(2).plane  # the tier between nodes (no supernode tier: scale-out)
    if far == plane:
        return []
    return [("all", R[f"{far}_{way}"], remote * nbytes / fabric.port_Bps[far])]


@dataclass(frozen=True, slots=True)
class OpShape:
    """Every field a compute or memcpy op's phases depend on, with its stream's core limit: ops of
    one shape lower alike (a model's layers repeat)."""

    kind: str
    ranks: tuple[int, ...]
    nbytes: tuple[float, ...]
    flops: tuple[float, ...]
    hbm_bytes: tuple[float, ...]
    core: str
    fixed_time_s: float
    vector_flops: tuple[float, ...]
    block_dim: int
    limit: tuple[int, int]
    dtype: str
    kernel: str
    gemms: tuple[tuple[int, int, int, int], ...]
    peer: str
    direction: str

    @classmethod
    def of(cls, op: Op, limit: tuple[int, int]) -> OpShape:
        return cls(op.kind, op.ranks, op.nbytes, op.flops, op.hbm_bytes, op.core, op.fixed_time_s,
                   op.vector_flops, op.block_dim, limit, op.dtype, op.kernel, op.gemms, op.peer, op.direction)


class ComputeLowering:
    """Lowers compute and memcpy ops, memoised by `OpShape`. `stream_cores` are the per-stream
    core limits the replay runs with (the trace's, unless the library drops them)."""

    KINDS = (OpKind.compute, OpKind.memcpy)

    def __init__(self, fabric: Fabric, stream_cores: dict[str, tuple[int, int]] | None = None) -> None:
        self.fabric = fabric
        self.stream_cores = stream_cores or {}
        self._cache: dict[OpShape, list[Phase]] = {}

    def lower(self, op: Op) -> list[Phase]:
        limit = self.stream_cores.get(op.stream, NO_LIMIT)
        key = OpShape.of(op, limit)
        hit = self._cache.get(key)
        if hit is None:
            if op.kind == OpKind.compute:
                hit = lower_compute(op, self.fabric, limit)
            elif op.peer:
                hit = lower_host(op, self.fabric)
            else:
                hit = lower_memcpy(op, self.fabric)
            hit = self._cache[key] = hit
        return hit
