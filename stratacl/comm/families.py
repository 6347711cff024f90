"""Algorithm families: one class per `Algorithm`, chosen from `FAMILIES` by enum.

A library configures a family (`algorithm`); the family names the candidate plans it may run for
a collective (`candidates`: `auto` offers several and the library keeps the fastest on an idle
fabric), and each candidate's family builds its wire plan (`plan`) from algorithms.py or HCCL's
own selection (hierarchical.py). All-to-all-style exchanges run pairwise or one-step full-mesh.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from stratacl.comm import algorithms as alg
from stratacl.comm import hierarchical as hier
from stratacl.comm import nccl
from stratacl.config import Algorithm, LibraryConfig
from stratacl.trace import EXCHANGES

if TYPE_CHECKING:
    from stratacl.comm.library import LibraryModel

RINGS = ("allreduce", "allgather", "reducescatter", "broadcast")  # collectives a ring runs
HALVING = ("allreduce", "allgather", "reducescatter")  # collectives recursive halving-doubling runs
Tiers = np.ndarray  # a communicator's n×n tier-index matrix
Peers = tuple[float, ...]  # an exchange's n×n per-peer bytes (empty: uniform)
Plan = alg.WirePlan


class AlgorithmFamily:
    kind: ClassVar[Algorithm]
    exchanges_run: ClassVar[str] = "pairwise"  # the plan an all-to-all-style exchange runs
    reductions_run: ClassVar[str] = ""  # the plan the other collectives run ("" = this family's)

    def __init__(self, cfg: LibraryConfig) -> None:
        self.cfg = cfg

    def candidates(self, coll: str) -> list[str]:
        """Plans the library may run for `coll` (families by name), fastest first on ties."""
        return [self.exchanges_run] if coll in EXCHANGES else [self.reductions_run or self.kind.value]

    @staticmethod
    def plan(lib: LibraryModel, coll: str, size: float, tidx: Tiers, peer_bytes: Peers) -> Plan:
        """The wire plan of `coll` on the communicator of tier matrix `tidx` (two ranks or more)."""
        n = tidx.shape[0]
        return alg.fullmesh(coll, n, size, tidx, lib.fabric, lib.cfg.plane, peer_bytes)


class Ring(AlgorithmFamily):
    kind = Algorithm.ring

    @staticmethod
    def plan(lib: LibraryModel, coll: str, size: float, tidx: Tiers, peer_bytes: Peers) -> Plan:
        n = tidx.shape[0]
        if coll in RINGS:
            return alg.ring(coll, n, size, tidx, lib.fabric, lib.cfg.plane)
        return alg.pairwise(coll, n, size, tidx, lib.fabric, lib.cfg.plane, peer_bytes)


class Pairwise(AlgorithmFamily):
    kind = Algorithm.pairwise
    reductions_run = "ring"  # pairwise exchange has no reduction

    @staticmethod
    def plan(lib: LibraryModel, coll: str, size: float, tidx: Tiers, peer_bytes: Peers) -> Plan:
        return alg.pairwise(coll, tidx.shape[0], size, tidx, lib.fabric, lib.cfg.plane, peer_bytes)


class Rhd(AlgorithmFamily):
    kind = Algorithm.rhd

    @staticmethod
    def plan(lib: LibraryModel, coll: str, size: float, tidx: Tiers, peer_bytes: Peers) -> Plan:
        n = tidx.shape[0]
        if coll in HALVING and n & (n - 1) == 0:
            return alg.rhd(coll, n, size, tidx, lib.fabric, lib.cfg.plane)
        if coll in RINGS:  # not a power of two: HCCL runs the ring
            return alg.ring(coll, n, size, tidx, lib.fabric, lib.cfg.plane)
        return AlgorithmFamily.plan(lib, coll, size, tidx, peer_bytes)


class Mesh(AlgorithmFamily):
    kind = Algorithm.mesh

    @staticmethod
    def plan(lib: LibraryModel, coll: str, size: float, tidx: Tiers, peer_bytes: Peers) -> Plan:
        n = tidx.shape[0]
        return alg.fullmesh(coll, n, size, tidx, lib.fabric, lib.cfg.plane, peer_bytes,
                            steps_per_exchange=n - 1, algorithm="mesh")


class FullMesh(AlgorithmFamily):
    kind = Algorithm.fullmesh
    exchanges_run = "fullmesh"


class Hccl(AlgorithmFamily):
    """HCCL's own A3 selection (hierarchical.py) for every collective."""

    kind = Algorithm.hccl
    exchanges_run = "hccl"

    @staticmethod
    def plan(lib: LibraryModel, coll: str, size: float, tidx: Tiers, peer_bytes: Peers) -> Plan:
        choice = lib.hccl_choice(coll, size, tidx)
        return hier.hccl_plan(choice, coll, size, tidx, lib.fabric, lib.cfg.plane, peer_bytes)


class Hierarchical(AlgorithmFamily):
    """HCCL's hierarchical ring executor at every size (no small-count / AIV paths); exchanges as
    HCCL selects them."""

    kind = Algorithm.hierarchical
    exchanges_run = "hccl"

    @staticmethod
    def plan(lib: LibraryModel, coll: str, size: float, tidx: Tiers, peer_bytes: Peers) -> Plan:
        if coll not in RINGS:
            return AlgorithmFamily.plan(lib, coll, size, tidx, peer_bytes)
        choice = lib.hccl_choice(coll, size, tidx, rules=False)
        return hier.hccl_plan(choice, coll, size, tidx, lib.fabric, lib.cfg.plane, peer_bytes)


class Nccl(AlgorithmFamily):
    """NCCL's own choice for every collective (comm/nccl.py): rail rings, double binary trees, NVLS
    and NVLS-tree under LL / LL128 / Simple by NCCL's tuning model; exchanges through PXN."""

    kind = Algorithm.nccl
    exchanges_run = "nccl"

    @staticmethod
    def plan(lib: LibraryModel, coll: str, size: float, tidx: Tiers, peer_bytes: Peers) -> Plan:
        return nccl.nccl_plan(lib, coll, size, tidx, peer_bytes)


class Auto(AlgorithmFamily):
    """The fastest of `auto_candidates` (default ring, mesh, full-mesh) on an idle fabric;
    exchanges: full-mesh (if a candidate) or pairwise. Never a plan itself."""

    kind = Algorithm.auto

    def candidates(self, coll: str) -> list[str]:
        named = [str(a) for a in self.cfg.auto_candidates]
        if coll in EXCHANGES:
            return ["fullmesh", "pairwise"] if "fullmesh" in (named or ["fullmesh"]) else ["pairwise"]
        return named or ["ring", "mesh", "fullmesh"]


FAMILIES: dict[Algorithm, type[AlgorithmFamily]] = {
    c.kind: c for c in (Ring, Pairwise, Rhd, Mesh, FullMesh, Hccl, Hierarchical, Nccl, Auto)}
