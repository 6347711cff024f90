"""Compute slowed by the HBM traffic of communication beside it (loaded memory latency).

A compute kernel alone overlaps its memory accesses with its compute (the kernel model's
max(compute part, memory part)). When communication on the same die — transfers, staging copies,
SDMA memcpy tasks — takes a fraction u of the die's HBM bandwidth, the kernel's loads queue behind
that traffic: their latency grows as the queueing delay of a shared server, ∝ u / (1 − u), long
before the bandwidth saturates (Eklov et al., "Bandwidth Bandit", ISPASS 2012; on Ascend, MatMul and
FA "are prone to MTE bound" and compete for memory bandwidth with communication run in parallel:
MindStudio "Computing and Communication Bandwidth Contention"; on GPUs, Agrawal et al. 2024,
arXiv 2412.14335, attribute most of the lost overlap to the kernels sharing caches and HBM). The
die's `fabric.die.kernel.comm_hbm_stall` κ is the part of that added latency a kernel's pipeline
does not hide, so while the traffic runs the kernel progresses at most at

    rate ≤ 1 / (1 + κ · u / (1 − u)),     u = Σ traffic HBM coefficient × its rate on the die

(u capped at U_MAX, where the fluid sharing of HBM itself, which already slows a memory-bound
kernel, takes over). u is taken from the max-min allocation without the stall (the bandwidth the
traffic gets); the allocation is then redone with the caps, so the traffic may use what the slowed
kernel no longer draws. κ = 0 is the ideal overlap (no effect). A kernel spanning several dies
runs at the cap of its most loaded one (an SPMD op ends with its slowest rank). Work per solve is
per overlap atom of the component, as the solver's (stratacl/engine/fluid.py): independent of ranks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stratacl.engine.fluid import Activity

U_MAX = 0.95  # beyond it the kernel is memory-bound on what is left: the fluid HBM share rules


def latency_growth(u: float) -> float:
    """Queueing delay growth u / (1 − u) of a server at utilisation u (capped at U_MAX)."""
    u = min(max(u, 0.0), U_MAX)
    return u / (1.0 - u)


def stall_cap(kappa: float, u: float) -> float:
    """Most rate a kernel with exposure κ reaches beside traffic taking u of HBM."""
    return 1.0 / (1.0 + kappa * latency_growth(u))


def involved(comp: Iterable[Activity]) -> bool:
    """Does the component hold both a stall-sensitive kernel and HBM traffic?"""
    stall = traffic = False
    for a in comp:
        stall = stall or a.stall > 0
        traffic = traffic or bool(a.tr)
        if stall and traffic:
            return True
    return False


def stall_caps(comp: Iterable[Activity], atoms: list[frozenset[int]]) -> dict[Activity, float]:
    """Rate caps of the component's sensitive kernels from the traffic's current rates (`a.f`);
    empty when none is below the rate its kernel already has (nothing to redo)."""
    acts = list(comp)
    by_rs: dict[int, float] = {}  # traffic HBM share per rankset
    for a in acts:
        for k, c in a.tr:
            by_rs[k] = by_rs.get(k, 0.0) + c * a.f
    worst: dict[int, float] = {}  # per rankset: the traffic share of its most loaded atom
    for atom in atoms:
        u = 0.0
        for k in atom:
            u += by_rs.get(k, 0.0)
        if u > 0:
            for k in atom:
                if worst.get(k, 0.0) < u:
                    worst[k] = u
    caps: dict[Activity, float] = {}
    binds = False
    for a in acts:
        if a.stall > 0:
            u = max([worst.get(k, 0.0) for k in a.rs_ids])
            if u > 0:
                cap = caps[a] = stall_cap(a.stall, u)
                binds = binds or cap < a.f
    return caps if binds else {}
