"""What a mechanism may know of the library pricing it: the fabric, the plane, the comm kernel's
core facts and the facts HCCL's selection reads — never the `LibraryModel` itself.

`LibraryModel` builds one `CommContext` from its config; movers, algorithm families, MoE HT paths
and NCCL's choice price through it. The count exchanges of the HT paths price whole operators: they
get a `PricesOps` (the library's `op_phases`) beside the context.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from stratacl.comm import algorithms as alg
from stratacl.comm import hierarchical as hier
from stratacl.comm import partition
from stratacl.config import Partitioning, Plane
from stratacl.machine.fabric import Fabric, R, Tier
from stratacl.machine.phases import Phase

# Balanced partitioning cuts each peer's payload into units of a tier-specific size
# (`unit_KiB`). A tier a library leaves unsized gets its finest configured unit; a library with
# no units at all (validation allows it with the SDMA mover, where units only shape the reported
# core spread) gets DEFAULT_UNIT_KiB. ASSUMPTION: the die/node unit of conf/library/stratacl.yaml.
DEFAULT_UNIT_KiB = 256.0
NODE_FORWARD = "node_forward"  # the plan a node-forwarding MoE HT path reports (comm/ep.py)
# plans whose flows to all peers run at once (the switch model paces them by the slowest flow)
CONCURRENT = ("fullmesh", "hccl:mesh", "hccl:direct_fullmesh", "direct_fullmesh", "mesh_aiv", NODE_FORWARD)


class PricesOps(Protocol):
    """Prices a plain collective as the library runs it (for the HT paths' count exchanges)."""

    def op_phases(self, coll: str, size: float, group: tuple[int, ...], cores: int | None = None) -> list[Phase]: ...


@dataclass(frozen=True)
class HcclFacts:
    """What HCCL's algorithm selection reads of the rest of the library: AIV expansion, whether
    user buffers are used in place, and the CCL buffer its thresholds are sized by."""

    aiv: bool
    zerocopy: bool
    ccl_bytes: float

    def choice(self, coll: str, size: float, tidx: np.ndarray, configured: Mapping[str, str],
               rules: bool = True) -> hier.HcclChoice:
        """HCCL's selection on A3 for this op on a communicator (tier matrix): server split from
        the tiers, AIV rules in AIV expansion mode, HCCL_ALGO's level-1 override per operator
        (`configured`). `rules=False`: the hierarchical ring executor at any size."""
        n = tidx.shape[0]
        split = hier.split_servers(tidx)
        servers, paired = (split[0], split[1]) if split else ([list(range(n))], False)
        op = {"alltoallv": "alltoall", "dispatch": "alltoall", "combine": "alltoall"}.get(coll, coll)
        return hier.select(coll, size, n, len(servers), len(servers[0]), paired, aiv=self.aiv,
                           zerocopy=self.zerocopy, configured=configured.get(op, "auto"),
                           ccl_bytes=self.ccl_bytes, rules=rules)


@dataclass(frozen=True)
class CommContext:
    """The fabric facts and the comm kernel's core facts a mechanism prices with."""

    fabric: Fabric
    plane: Plane
    launch_us: float  # fixed per-operator launch overhead
    comm_cores: int  # vector cores a comm kernel holds
    partitioning: Partitioning  # how the cores share the per-peer payloads (partition.py)
    unit_KiB: Mapping[str, float]  # balanced: transfer unit per tier
    fanout_cap: int  # balanced: cores one peer may use
    refine_units_below: float  # balanced: halve the units while fewer than this many per core
    min_unit_KiB: float  # balanced: the finest unit
    hccl: HcclFacts
    copy_overlaps_store: bool = False  # even: a copy's processing hides behind the previous store
    posted_flag_writes: bool = False  # one-step exchanges: completion flags pay no start-up each

    def tier(self, index: int) -> Tier:
        return self.fabric.tier(index, self.plane)

    def kernel_cores(self, cores: int | None) -> int:
        """Vector cores a comm kernel holds: `comm_cores`, or fewer under a stream limit `cores`."""
        return self.comm_cores if cores is None else min(cores, self.comm_cores)

    def core_holds(self, cores: float, frac: float = 1.0) -> tuple[tuple[str, int, float], ...]:
        """Vector cores a comm kernel holds (on GPUs the same SMs also run matmuls)."""
        fab = self.fabric
        held = cores / fab.vector_cores * frac
        kinds = ("vec", "cube") if fab.cores_shared else ("vec",)
        return tuple(("all", R[k], held) for k in kinds) if held > 0 else ()

    def core_schedule(self, plan: alg.WirePlan, cores: int | None = None) -> partition.CoreSchedule:
        """How the comm cores of the busiest die share its per-peer payloads."""
        fab = self.fabric
        peers = []
        units = []
        copies = plan.peer_copies or (1,) * len(plan.peer_work)
        # a one-step exchange ends with a completion flag written to every peer: one more small
        # write, with its own start-up, on the core serving that peer (many-peer synchronisation),
        # unless the flags are posted back to back and waited for once
        flag = 1 if plan.algorithm in CONCURRENT and not self.posted_flag_writes else 0
        overlap = self.copy_overlaps_store and self.partitioning == Partitioning.even
        finest = min(self.unit_KiB.values(), default=DEFAULT_UNIT_KiB)
        for (nbytes, t), c in zip(plan.peer_work, copies, strict=True):
            tier = self.tier(t)
            move = min(fab.core_move_Bps, tier.beta_Bps)
            process = plan.copy_s_per_byte * nbytes / c if overlap and c > 0 else 0.0
            # a token copy's own processing on its core (plan.copy_s_per_byte) slows the core's rate,
            # or (overlap) runs while the previous copy's store is in flight
            rate = move if overlap else 1.0 / (1.0 / move + plan.copy_s_per_byte)
            peers.append(partition.PeerWork(nbytes, tier.alpha_s, rate, c, flag, process, plan.stores_posted))
            units.append(self.unit_KiB.get(tier.name, finest) * 1024)
        ncores = self.kernel_cores(cores)
        if self.partitioning == Partitioning.balanced:
            return partition.balanced(peers, ncores, units, self.fanout_cap,
                                      self.refine_units_below, self.min_unit_KiB * 1024)
        if self.partitioning == Partitioning.even:
            return partition.even(peers, ncores, overlap)
        return partition.uniform(peers, ncores)

    def transfer_windows(self, plan: alg.WirePlan) -> int:
        """Separate remote writes the busiest die issues for a plan: one per peer window (MoE LL:
        per expert hit) plus a completion flag per peer of a one-step exchange. The core schedule
        prices each with a start-up; an SDMA lowering needs one descriptor (chain) per window."""
        copies = plan.peer_copies or (1,) * len(plan.peer_work)
        flag = 1 if plan.algorithm in CONCURRENT else 0
        return int(sum(copies)) + flag * len(plan.peer_work)
