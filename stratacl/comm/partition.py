"""Partitioning a transfer's per-peer payloads among the vector cores that move them.

`uniform` gives each peer a fixed core group (HCCL-style: cores split evenly among peers, or peers
dealt round-robin to cores when there are more peers than cores). `even` deals the payload's token
copies evenly over the cores whatever their peer, as CANN's fused MoE kernels split their tokens
over the AIVs (ops-transformer mc2/moe_distribute_combine_v2: each core sends selfSendCnt / aivNum
of them): every core moves 1/c of every peer's bytes and issues 1/c of its window writes. `balanced` (StrataCL §4.3) cuts
each peer's payload into units of a tier-specific size, prices a unit τ(s) = α_t + s / r_t and
assigns units to cores by LPT list scheduling in stripes, with at most `fanout_cap` units of one
peer per stripe; the policy generator refines the units where few fall on each core.
The makespan (max per-core load) is the time the cores need to move the data. The latency of a
core's first unit overlaps the step latency the algorithm already pays, so it is not charged twice.

`even(..., overlap=True)` prices a double-buffered copy loop, as CANN's fused dispatch runs it
(ops-transformer mc2/moe_distribute_dispatch_v2: two UB buffers per queue, and each copy's store
waits, before its own triple is filled, only for the previous copy's store, SyncFunc<MTE3_S>):
a copy's processing (count, load, quantisation: `process_s`) runs while the previous copy's store is
in flight, so the stores stay serial on a core but the processing hides behind them, a two-stage
flow shop: n copies take p + t + (n - 1) max(p, t) rather than n (p + t).
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
    copies: int = 1  # separate windows the payload lands in (MoE LL: one per expert), each a start-up
    flags: int = 0  # completion flags written to this peer after the data, each a start-up of its own
    process_s: float = 0.0  # even(overlap): a copy's own processing, overlapping the previous store
    posted: bool = False  # even: the data stores are not waited for one by one (no start-up each)

    @property
    def windows(self) -> int:
        """Writes this peer receives that each pay a start-up: its data windows and its flags."""
        return self.copies + self.flags


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
            per_core = w.nbytes / k / w.rate_Bps + (math.ceil(w.windows / k) - 1) * w.alpha_s
            loads[c:c + k] = per_core
            c += k
    else:
        for j, w in enumerate(peers):  # more peers than cores: deal peers round-robin
            starts = w.windows - 1 + (1 if j >= cores else 0)
            loads[j % cores] += starts * w.alpha_s + w.nbytes / w.rate_Bps
    return CoreSchedule(tuple(loads))


def even(peers: list[PeerWork], cores: int, overlap: bool = False) -> CoreSchedule:
    """Every core the same share of every peer's bytes and start-ups (its first start-up overlaps
    the step latency, as in `uniform`). With `overlap`, each data copy's processing (`process_s`)
    runs while the previous copy's store is in flight (the module's docstring): a copy costs
    max(store, processing) after the first, which costs both."""
    if not peers:
        return CoreSchedule((0.0,) * cores)
    # posted data stores pay no start-up each: their last completion overlaps the step latency
    paid = [w for w in peers if w.flags or not w.posted]
    first_alpha = min((w.alpha_s for w in paid), default=0.0)
    flags = sum(w.flags * w.alpha_s for w in peers) / cores
    if not overlap:
        move = sum(w.nbytes / w.rate_Bps for w in peers) / cores
        starts = sum(w.copies * w.alpha_s for w in peers if not w.posted) / cores + flags - first_alpha
        return CoreSchedule((move + max(0.0, starts),) * cores)
    sent = [w for w in peers if w.copies > 0]
    stores = [(0.0 if w.posted else w.alpha_s) + w.nbytes / w.copies / w.rate_Bps for w in sent]
    pipelined = sum(w.copies * max(t, w.process_s) for w, t in zip(sent, stores, strict=True)) / cores
    # the first copy's processing has no store before it to hide behind
    head = min((min(t, w.process_s) for w, t in zip(sent, stores, strict=True)), default=0.0)
    return CoreSchedule((max(0.0, pipelined + head + flags - first_alpha),) * cores)


def balanced(peers: list[PeerWork], cores: int, unit_bytes: list[float], fanout_cap: int,
             refine_below: float = 0.0, min_unit: float = 4096.0) -> CoreSchedule:
    """StrataCL's policy: cut each peer's payload into units of its tier's size and place them by
    LPT under a per-stripe fan-out cap (`lpt`). Where the tier units leave fewer than
    `refine_below` units per core, the policy generator halves them (never below `min_unit`
    bytes) while that shortens the makespan: finer units where few fall on each core, as long as
    the extra start-ups pay for the shorter tail."""
    best = lpt(peers, cores, unit_bytes, fanout_cap)
    units = list(unit_bytes)
    count = _units(peers, units)
    while count < refine_below * cores and any(u > min_unit for u in units):
        units = [max(min_unit, u / 2) for u in units]
        if _units(peers, units) == count:
            continue  # units still larger than the payloads: nothing changes yet
        count = _units(peers, units)
        cand = lpt(peers, cores, units, fanout_cap)
        if cand.makespan_s >= best.makespan_s * (1 - 1e-9):
            break
        best = cand
    return best


def _units(peers: list[PeerWork], unit_bytes: list[float]) -> int:
    return sum(max(1, w.windows, math.ceil(w.nbytes / u))
               for w, u in zip(peers, unit_bytes, strict=True) if w.nbytes > 0)


def lpt(peers: list[PeerWork], cores: int, unit_bytes: list[float], fanout_cap: int) -> CoreSchedule:
    """LPT list scheduling in stripes: each stripe hands one unit to each core, largest units
    first, at most `fanout_cap` units of one peer per stripe (REFERENCE §4: a per-stripe fan-out
    cap per peer, so no peer is hammered by all cores at once); within a stripe the largest unit
    goes to the least-loaded core. A unit costs its start-up α unless it is its core's first."""
    queues: list[tuple[float, float, float, int, int]] = []  # (-τ, move, α, units left, peer)
    for j, (w, u) in enumerate(zip(peers, unit_bytes, strict=True)):
        if w.nbytes <= 0:
            continue
        n = max(1, w.windows, math.ceil(w.nbytes / u))
        move = w.nbytes / n / w.rate_Bps
        queues.append((-(move + w.alpha_s), move, w.alpha_s, n, j))
    heapq.heapify(queues)  # peers by their unit cost τ = α + s/r, largest first
    loads = [0.0] * cores
    core_heap = [(0.0, c) for c in range(cores)]
    while queues:
        stripe: list[tuple[float, float]] = []
        later: list[tuple[float, float, float, int, int]] = []
        while queues and len(stripe) < cores:
            tau, move, alpha, left, j = heapq.heappop(queues)
            take = min(left, fanout_cap, cores - len(stripe))
            stripe += [(move, alpha)] * take
            if left > take:
                later.append((tau, move, alpha, left - take, j))
        for q in later:
            heapq.heappush(queues, q)
        for move, alpha in stripe:  # already largest first
            load, c = heapq.heappop(core_heap)
            loads[c] = load + move + (alpha if load > 0 else 0.0)
            heapq.heappush(core_heap, (loads[c], c))
    return CoreSchedule(tuple(loads))
