"""A communication library as a point in the design space (DESIGN.md §3), lowered to phases.

`LibraryModel` holds the static choices (data path, algorithm, mover, …) and prices an op's
communication as a sequence of phases; `LibraryRuntime` carries per-run state (which user buffers
are registered) so the same trace can be replayed once per library.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from stratacl.comm import algorithms as alg
from stratacl.compute import lower_compute, lower_memcpy
from stratacl.config import Algorithm, DataPath, LibraryConfig, Mover
from stratacl.fabric import Fabric, R
from stratacl.phases import Phase, delay
from stratacl.trace import Op, Trace

# per-rank bytes into / out of the user buffers, as a fraction of the nccl-tests size S and group n
_IN_OUT = {
    "allreduce": (lambda s, n: s, lambda s, n: s),
    "allgather": (lambda s, n: s / n, lambda s, n: s),
    "reducescatter": (lambda s, n: s, lambda s, n: s / n),
    "alltoall": (lambda s, n: s, lambda s, n: s),
    "alltoallv": (lambda s, n: s, lambda s, n: s),
    "broadcast": (lambda s, n: s, lambda s, n: s),
    "dispatch": (lambda s, n: s, lambda s, n: s),
    "combine": (lambda s, n: s, lambda s, n: s),
}


def staging_bytes(coll: str, size: float, n: int) -> tuple[float, float]:
    """Bytes a staged library copies in (user → comm buffer) and out, per rank."""
    fin, fout = _IN_OUT[coll]
    return fin(size, n), fout(size, n)


class LibraryModel:
    def __init__(self, name: str, cfg: LibraryConfig, fabric: Fabric) -> None:
        self.name = name
        self.cfg = cfg
        self.fabric = fabric

    # ------------------------------------------------------------------ static properties
    def comm_memory_bytes(self, communicators: int = 1) -> float:
        """HBM of staging buffers per rank for `communicators` communicators."""
        if self.cfg.data_path == DataPath.staged:
            return communicators * self.cfg.comm_buffers * self.cfg.comm_buffer_MB * 1e6
        return 0.0

    def held_memory_bytes(self, communicators: int = 1, context: str = "inference") -> float:
        """All HBM per rank the library keeps from the workload: comm buffers, the registered
        pool, and allocator fragmentation when it forces expandable segments off (REFERENCE §3).
        `context` is "inference" or "training" (fragmentation differs)."""
        frag = self.cfg.fragmentation_GB.get(context, 0.0) if self.cfg.data_path == DataPath.pool else 0.0
        pool = self.cfg.pool_GB if self.cfg.data_path == DataPath.pool else 0.0
        return self.comm_memory_bytes(communicators) + (pool + frag) * 1e9

    def choose_algorithm(self, coll: str, size: float, n: int) -> str:
        a = self.cfg.algorithm
        if coll in ("alltoall", "alltoallv", "dispatch", "combine"):
            return "fullmesh" if a in (Algorithm.fullmesh, Algorithm.auto) else "pairwise"
        if a == Algorithm.pairwise:
            return "ring"
        return a.value

    # ------------------------------------------------------------------ pricing
    def wire_plan(self, coll: str, size: float, group: tuple[int, ...],
                  peer_bytes: tuple[float, ...] = ()) -> alg.WirePlan:
        n = len(group)
        tidx = self.fabric.group_tiers(group)
        return self._plan(coll, size, n, tidx.tobytes(), peer_bytes, self.choose_algorithm(coll, size, n))

    @lru_cache(maxsize=65536)  # noqa: B019 - one model per run
    def _plan(self, coll: str, size: float, n: int, tkey: bytes, peer_bytes: tuple[float, ...],
              algorithm: str) -> alg.WirePlan:
        tidx = np.frombuffer(tkey, dtype=np.int64).reshape(n, n)
        plane = self.cfg.plane
        if n == 1:
            return alg.WirePlan(algorithm, 0, 0.0)
        if algorithm == "ring" and coll in ("allreduce", "allgather", "reducescatter", "broadcast"):
            return alg.ring(coll, n, size, tidx, self.fabric, plane)
        if algorithm in ("ring", "pairwise"):
            return alg.pairwise(coll, n, size, tidx, self.fabric, plane, peer_bytes)
        if algorithm == "mesh":
            return alg.fullmesh(coll, n, size, tidx, self.fabric, plane, peer_bytes,
                                steps_per_exchange=n - 1, algorithm="mesh")
        return alg.fullmesh(coll, n, size, tidx, self.fabric, plane, peer_bytes)

    def collective_phases(self, coll: str, size: float, group: tuple[int, ...],
                          peer_bytes: tuple[float, ...] = ()) -> list[Phase]:
        """Phases of one collective on one communicator (all groups of a family run alike)."""
        n = len(group)
        plan = self.wire_plan(coll, size, group, peer_bytes)
        cfg = self.cfg
        phases: list[Phase] = []
        phases += delay("launch", cfg.launch_us * 1e-6)
        rounds = 1
        cin = cout = 0.0
        if cfg.data_path == DataPath.staged and n > 1:
            cin, cout = staging_bytes(coll, size, n)
            buf = cfg.comm_buffer_MB * 1e6
            rounds = max(1, math.ceil(max(cin, cout) / buf))
            phases.append(self._copy_phase(cin, n))
        phases += delay("sync", plan.latency_s * rounds)
        if plan.wire_s > 0:
            phases.append(self._wire_phase(plan, n))
        if cout > 0:
            phases.append(self._copy_phase(cout, n))
        return phases

    def _copy_phase(self, nbytes: float, n: int) -> Phase:
        """Device-to-device copy between a user buffer and a comm buffer (read + write HBM)."""
        fab = self.fabric
        min_t = nbytes / (self.cfg.copy_GBps * 1e9) if self.cfg.copy_GBps > 0 else 0.0
        return Phase("copy", loads=(("all", R["hbm"], 2 * nbytes / fab.hbm_Bps),), min_time_s=min_t,
                     hbm_bytes=2 * nbytes * n, copy_bytes=nbytes * n)

    def _wire_phase(self, plan: alg.WirePlan, n: int) -> Phase:
        fab = self.fabric
        loads: list[tuple[str, int, float]] = []
        for p, s in plan.tx_s.items():
            loads.append(("all", R[f"{p}_tx"], s))
        for p, s in plan.rx_s.items():
            loads.append(("all", R[f"{p}_rx"], s))
        # senders read, receivers write, reductions read two operands and write one
        hbm = plan.send_bytes + plan.recv_bytes + 2 * plan.reduce_bytes
        loads.append(("all", R["hbm"], hbm / fab.hbm_Bps))
        holds: tuple[tuple[str, int, float], ...] = ()
        min_t = 0.0
        if self.cfg.mover == Mover.vector_cores:
            cores = self.cfg.comm_cores
            holds = (("all", R["vec"], cores / fab.vector_cores),)
            min_t = max(plan.send_bytes, plan.recv_bytes) / (cores * fab.core_move_Bps)
        else:
            loads.append(("all", R["sdma"], max(plan.send_bytes, plan.recv_bytes) / fab.sdma_Bps))
        return Phase("wire", loads=tuple(loads), holds=holds, min_time_s=min_t,
                     wire_bytes=plan.group_wire_bytes, hbm_bytes=hbm * n)

    def runtime(self, trace: Trace) -> LibraryRuntime:
        return LibraryRuntime(self, trace)


class LibraryRuntime:
    """Per-replay state: lowers ops to phases, memoising the static part by op shape."""

    def __init__(self, model: LibraryModel, trace: Trace) -> None:
        self.model = model
        self.trace = trace
        self.fabric = model.fabric
        self._cache: dict[tuple, list[Phase]] = {}

    def lower(self, op: Op, now: float) -> list[Phase]:
        key = (op.kind, op.coll, op.comm, op.ranks, op.nbytes, op.peer_bytes, op.flops,
               op.hbm_bytes, op.core, op.fixed_time_s, op.src, op.dst)
        phases = self._cache.get(key)
        if phases is None:
            phases = self._cache[key] = self._lower_static(op)
        return phases

    def _lower_static(self, op: Op) -> list[Phase]:
        if op.kind == "compute":
            return lower_compute(op, self.fabric)
        if op.kind == "memcpy":
            return lower_memcpy(op, self.fabric)
        if op.kind == "p2p":
            return self._lower_p2p(op)
        return self._lower_collective(op)

    def _lower_collective(self, op: Op) -> list[Phase]:
        groups = self.trace.op_groups(op)
        size = max(op.nbytes)
        # groups of a family usually share a shape; price each distinct shape, keep the slowest
        best: list[Phase] | None = None
        best_t = -1.0
        seen: set[bytes] = set()
        for g in groups:
            key = self.fabric.group_tiers(g).tobytes()
            if key in seen:
                continue
            seen.add(key)
            phases = self.model.collective_phases(op.coll, size, g, op.peer_bytes)
            t = sum(p.standalone_s() for p in phases)
            if t > best_t:
                best, best_t = phases, t
        assert best is not None
        scale = len(groups)
        # accounting fields count bytes over the whole op (all groups)
        return [_scale_accounting(p, scale) for p in best]

    def _lower_p2p(self, op: Op) -> list[Phase]:
        fab = self.fabric
        plane = self.model.cfg.plane
        tiers = fab.tier_index(np.asarray(op.src), np.asarray(op.dst))
        sizes = np.asarray(op.nbytes, dtype=float)
        sizes = np.full(len(op.src), sizes[0]) if sizes.size == 1 else sizes
        worst_t, worst_s, alpha = None, -1.0, 0.0
        for t, s in zip(tiers, sizes, strict=True):
            tier = fab.tier(int(t), plane)
            alpha = max(alpha, tier.alpha_s)
            if s / tier.beta_Bps > worst_s:
                worst_t, worst_s = tier, s / tier.beta_Bps
        assert worst_t is not None
        nbytes = float(sizes.max())
        total = float(sizes.sum())
        loads = (("src", R[f"{worst_t.plane}_tx"], worst_s), ("dst", R[f"{worst_t.plane}_rx"], worst_s),
                 ("src", R["hbm"], nbytes / fab.hbm_Bps), ("dst", R["hbm"], nbytes / fab.hbm_Bps))
        holds: tuple = ()
        min_t = 0.0
        if self.model.cfg.mover == Mover.vector_cores:
            cores = self.model.cfg.comm_cores
            holds = (("src", R["vec"], cores / fab.vector_cores),)
            min_t = nbytes / (cores * fab.core_move_Bps)
        else:
            loads += (("src", R["sdma"], nbytes / fab.sdma_Bps),)
        return delay("sync", alpha) + [Phase("wire", loads=loads, holds=holds, min_time_s=min_t,
                                             wire_bytes=total, hbm_bytes=2 * total)]


def _scale_accounting(p: Phase, groups: int) -> Phase:
    if groups == 1:
        return p
    return Phase(p.category, p.delay_s, p.loads, p.holds, p.min_time_s, p.wire_bytes * groups,
                 p.hbm_bytes * groups, p.copy_bytes * groups)
