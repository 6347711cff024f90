"""Algorithm families: one class per `Algorithm`, registered in `FAMILIES` by name.

A library configures a family (`algorithm`); the family names the candidate plans it may run for
a collective (`candidates`: `auto` offers several and the library keeps the fastest on an idle
fabric), and each candidate's family builds its wire plan (`plan`) from algorithms.py or HCCL's
own selection (hierarchical.py). All-to-all-style exchanges run pairwise or one-step full-mesh.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from stratacl.comm import algorithms as alg
from stratacl.comm import hierarchical as hier
from stratacl.comm import nccl
from stratacl.comm.context import CommContext
from stratacl.comm.mechanism import Mechanism
from stratacl.comm.registry import Registry
from stratacl.config import Algorithm
from stratacl.trace import EXCHANGES

RINGS = ("allreduce", "allgather", "reducescatter", "broadcast")  # collectives a ring runs
HALVING = ("allreduce", "allgather", "reducescatter")  # collectives recursive halving-doubling runs
Tiers = np.ndarray  # a communicator's n×n tier-index matrix
Peers = tuple[float, ...]  # an exchange's n×n per-peer bytes (empty: uniform)
Plan = alg.WirePlan


class AlgorithmFamily(Mechanism):
    """The base plan: a one-step full mesh."""

    exchanges_run: ClassVar[str] = "pairwise"  # the plan an all-to-all-style exchange runs
    reductions_run: ClassVar[str] = ""  # the plan the other collectives run ("" = this family's)

    def __init__(self, config: Any) -> None:
        self.config = config

    def candidates(self, coll: str) -> list[str]:
        """Plans the library may run for `coll` (families by name), fastest first on ties."""
        return [self.exchanges_run] if coll in EXCHANGES else [self.reductions_run or str(self.kind)]

    def plan(self, ctx: CommContext, coll: str, size: float, tidx: Tiers, peer_bytes: Peers) -> Plan:
        """The wire plan of `coll` on the communicator of tier matrix `tidx` (two ranks or more)."""
        n = tidx.shape[0]
        return alg.fullmesh(coll, n, size, tidx, ctx.fabric, ctx.plane, peer_bytes)


FAMILIES: Registry[type[AlgorithmFamily]] = Registry("algorithm")


@FAMILIES.register(Algorithm.fullmesh)
class FullMesh(AlgorithmFamily):
    exchanges_run = "fullmesh"


@FAMILIES.register(Algorithm.fullmesh_sio)
class FullMeshSio(AlgorithmFamily):
    """The full mesh with the package peers sharing the UB work over SIO (algorithms.fullmesh_sio)
    where every member's package peer is in the group; the plain full mesh otherwise."""

    exchanges_run = "fullmesh"

    def plan(self, ctx: CommContext, coll: str, size: float, tidx: Tiers, peer_bytes: Peers) -> Plan:
        relayed = None if peer_bytes else alg.fullmesh_sio(coll, tidx.shape[0], size, tidx, ctx.fabric, ctx.plane)
        return relayed or super().plan(ctx, coll, size, tidx, peer_bytes)


@FAMILIES.register(Algorithm.ring)
class Ring(AlgorithmFamily):
    def plan(self, ctx: CommContext, coll: str, size: float, tidx: Tiers, peer_bytes: Peers) -> Plan:
        n = tidx.shape[0]
        if coll in RINGS:
            return alg.ring(coll, n, size, tidx, ctx.fabric, ctx.plane)
        return alg.pairwise(coll, n, size, tidx, ctx.fabric, ctx.plane, peer_bytes)


@FAMILIES.register(Algorithm.pairwise)
class Pairwise(AlgorithmFamily):
    reductions_run = "ring"  # pairwise exchange has no reduction

    def plan(self, ctx: CommContext, coll: str, size: float, tidx: Tiers, peer_bytes: Peers) -> Plan:
        return alg.pairwise(coll, tidx.shape[0], size, tidx, ctx.fabric, ctx.plane, peer_bytes)


@FAMILIES.register(Algorithm.rhd)
class Rhd(AlgorithmFamily):
    def plan(self, ctx: CommContext, coll: str, size: float, tidx: Tiers, peer_bytes: Peers) -> Plan:
        n = tidx.shape[0]
        if coll in HALVING and n & (n - 1) == 0:
            return alg.rhd(coll, n, size, tidx, ctx.fabric, ctx.plane)
        if coll in RINGS:  # not a power of two: HCCL runs the ring
            return alg.ring(coll, n, size, tidx, ctx.fabric, ctx.plane)
        return super().plan(ctx, coll, size, tidx, peer_bytes)


@FAMILIES.register(Algorithm.mesh)
class Mesh(AlgorithmFamily):
    def plan(self, ctx: CommContext, coll: str, size: float, tidx: Tiers, peer_bytes: Peers) -> Plan:
        n = tidx.shape[0]
        return alg.fullmesh(coll, n, size, tidx, ctx.fabric, ctx.plane, peer_bytes,
                            steps_per_exchange=n - 1, algorithm="mesh")


@dataclass(frozen=True)
class HcclAlgoConfig:
    hccl_algo: Mapping[str, str]  # HCCL_ALGO's level-1 per operator


@FAMILIES.register(Algorithm.hccl)
class Hccl(AlgorithmFamily):
    """HCCL's own A3 selection (hierarchical.py) for every collective."""

    Config = HcclAlgoConfig
    exchanges_run = "hccl"
    config: HcclAlgoConfig

    def plan(self, ctx: CommContext, coll: str, size: float, tidx: Tiers, peer_bytes: Peers) -> Plan:
        choice = ctx.hccl.choice(coll, size, tidx, self.config.hccl_algo)
        return hier.hccl_plan(choice, coll, size, tidx, ctx.fabric, ctx.plane, peer_bytes)


@FAMILIES.register(Algorithm.hierarchical)
class Hierarchical(AlgorithmFamily):
    """HCCL's hierarchical ring executor at every size (no small-count / AIV paths); exchanges as
    HCCL selects them."""

    Config = HcclAlgoConfig
    exchanges_run = "hccl"
    config: HcclAlgoConfig

    def plan(self, ctx: CommContext, coll: str, size: float, tidx: Tiers, peer_bytes: Peers) -> Plan:
        if coll not in RINGS:
            return super().plan(ctx, coll, size, tidx, peer_bytes)
        choice = ctx.hccl.choice(coll, size, tidx, self.config.hccl_algo, rules=False)
        return hier.hccl_plan(choice, coll, size, tidx, ctx.fabric, ctx.plane, peer_bytes)


@FAMILIES.register(Algorithm.nccl)
class Nccl(AlgorithmFamily):
    """NCCL's own choice for every collective (comm/nccl.py): rail rings, double binary trees, NVLS
    and NVLS-tree under LL / LL128 / Simple by NCCL's tuning model; exchanges through PXN."""

    Config = nccl.NcclKnobs
    exchanges_run = "nccl"
    config: nccl.NcclKnobs

    def plan(self, ctx: CommContext, coll: str, size: float, tidx: Tiers, peer_bytes: Peers) -> Plan:
        return nccl.nccl_plan(ctx, self.config, coll, size, tidx, peer_bytes)


@FAMILIES.register(Algorithm.auto)
class Auto(AlgorithmFamily):
    """The fastest of `auto_candidates` (default ring, mesh, full-mesh) on an idle fabric;
    exchanges: full-mesh (if a candidate) or pairwise. Never a plan itself."""

    @dataclass(frozen=True)
    class Config:
        auto_candidates: tuple[str, ...]

    config: Auto.Config

    def candidates(self, coll: str) -> list[str]:
        named = [str(a) for a in self.config.auto_candidates]
        if coll in EXCHANGES:
            return ["fullmesh", "pairwise"] if "fullmesh" in (named or ["fullmesh"]) else ["pairwise"]
        return named or ["ring", "mesh", "fullmesh"]
