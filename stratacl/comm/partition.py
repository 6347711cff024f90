"""Partitioning a transfer's per-peer payloads among the vector cores that move them.

`uniform` gives each peer a fixed core group (HCCL-style: cores split evenly among peers, or peers
dealt round-robin to cores when there are more peers than cores). `balanced` (StrataCL §4.3) cuts
each peer's payload into units of a tier-specific size, prices a unit τ(s) = α_t + s / r_t and
assigns units to cores by LPT list scheduling, with at most `fanout_cap` cores serving one peer.
The makespan (max per-core load) is the time the cores need to move the data. The latency of a
core's first unit overlaps the step latency the algorithm already pays, so it is not charged twice.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class PeerWork:
    nbytes: float
    alpha_s: float  # per-unit start-up cost on this tier
    rate_Bps: float  # bytes/s one core moves to this peer


@dataclass(frozen=True, slots=True)
class CoreSchedule:
    loads_s: tuple[float, ...]  # busy time per core

    @property
    def makespan_s(self) -> float:
        return max(self.loads_s, default=0.0)

    @property
    def spread(self) -> float:
        """(slowest − fastest) / slowest over cores that have work."""
        busy = [x for x in self.loads_s if x > 0]
        if not busy:
            return 0.0
        return (max(busy) - min(busy)) / max(busy)


def uniform(peers: list[PeerWork], cores: int) -> CoreSchedule:
    loads = np.zeros(cores)
    p = len(peers)
    if p == 0:
        return CoreSchedule(tuple(loads))
    if cores >= p:
        # each peer owns floor(cores/p) cores, the first cores % p peers one more
        base, extra = divmod(cores, p)
        c = 0
        for j, w in enumerate(peers):
            k = base + (1 if j < extra else 0)
            per_core = w.nbytes / k / w.rate_Bps
            loads[c:c + k] = per_core
            c += k
    else:
        for j, w in enumerate(peers):  # more peers than cores: deal peers round-robin
            loads[j % cores] += (w.alpha_s if j >= cores else 0.0) + w.nbytes / w.rate_Bps
    return CoreSchedule(tuple(loads))


def balanced(peers: list[PeerWork], cores: int, unit_bytes: list[float], fanout_cap: int) -> CoreSchedule:
    """LPT over units (largest first, each to the least-loaded core allowed for its peer)."""
    units: list[tuple[float, float, int, int]] = []  # (transfer time, start-up α, index, peer)
    for j, (w, u) in enumerate(zip(peers, unit_bytes, strict=True)):
        if w.nbytes <= 0:
            continue
        n = max(1, math.ceil(w.nbytes / u))
        size = w.nbytes / n
        units += [(size / w.rate_Bps, w.alpha_s, i, j) for i in range(n)]
    # largest first; equal units interleaved across peers so each peer spreads before it is capped
    units.sort(key=lambda x: (-(x[0] + x[1]), x[2], x[3]))
    heap = [(0.0, c) for c in range(cores)]
    loads = [0.0] * cores
    used: dict[int, set[int]] = {}
    for move, alpha, _, j in units:
        allowed = used.setdefault(j, set())
        if len(allowed) < fanout_cap:
            load, c = heapq.heappop(heap)
            while loads[c] != load:  # stale heap entry
                load, c = heapq.heappop(heap)
            allowed.add(c)
        else:  # peer at its fan-out cap: least-loaded of its own cores
            c = min(allowed, key=lambda k: loads[k])
        loads[c] += move + (alpha if loads[c] > 0 else 0.0)
        heapq.heappush(heap, (loads[c], c))
    return CoreSchedule(tuple(loads))
