"""SDMA descriptor submission: how long an agent writes descriptors before and while engines move data.

An SDMA transfer is a list of descriptors, one per remote-slice transfer unit (StrataCL §4.4: the
operator is a set of ⟨peer, src, dst, bytes, …⟩ transfers; a descriptor moves at most the engine's
maximum length), plus one completion descriptor per synchronised step or peer (a tail descriptor
writing the peer's flag, or a notify task). An *agent* writes them one after another:
- ``device`` trigger: `agents` vector cores of the die write them in parallel and ring the
  doorbell, holding those cores while they write (StrataCL §4.4);
- ``aicpu``: the AI CPU writes task descriptors the scheduler runs (HCCL AI_CPU expansion mode),
  no AI core held; ``host``: the host runtime does, through one submission path per die that
  concurrent host-issued operators share (resource ``submit``).
The engines start after every agent's first descriptor and an engine start-up; the remaining
descriptors are written while earlier ones move data, so the transfer cannot end before the last
one is written. Per-descriptor write times, the engine start-up and the maximum descriptor length
are fabric knobs (conf/fabric, mostly ASSUMPTIONS: not public).

A queue may keep only so many transfers of a peer outstanding on a tier (`Tier.put_in_flight` /
`get_in_flight`; a get is not posted: it ends when its data has come back): a capped queue moves
windows of K transfers, each window waiting the tier's round trip for its completions, so the
transfers of a window cost (round trip + bytes / β) / K each instead of bytes / β (`window_s`).
Each submitting agent rings its own queue (ASSUMPTION), so a device trigger's `agents` vector cores
spread a peer's transfers over that many queues; an AI CPU or host trigger has one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stratacl.comm.algorithms import WirePlan
from stratacl.machine.fabric import Fabric, Tier


@dataclass(frozen=True, slots=True)
class Submission:
    descriptors: int  # data descriptors + completion descriptors of the busiest die
    agents: int  # writers working in parallel (cores for the device trigger, else 1)
    first_s: float  # until every agent has written its first descriptor and rung the doorbell
    total_s: float  # until the last descriptor is written

    @property
    def rest_s(self) -> float:
        """Writing that overlaps the transfer."""
        return self.total_s - self.first_s


def _unit(fabric: Fabric, tier: int, unit_bytes: dict[int, float] | None) -> float:
    return min(fabric.sdma_descriptor_bytes, (unit_bytes or {}).get(tier, fabric.sdma_descriptor_bytes))


def descriptors(plan: WirePlan, fabric: Fabric, unit_bytes: dict[int, float] | None = None) -> int:
    """Descriptors the busiest die writes: per peer max(⌈bytes / unit⌉, windows) (unit = the library's transfer unit
    for that tier, at most the engine's maximum descriptor length) + one completion per step or peer."""
    data = 0
    copies = plan.peer_copies or (1,) * len(plan.peer_work)
    for (nbytes, tier), windows in zip(plan.peer_work, copies, strict=True):
        unit = _unit(fabric, tier, unit_bytes)
        # a peer's payload landing in separate windows (MoE LL: one per expert hit) needs at least
        # one descriptor per window (CommContext.transfer_windows)
        data += max(1, windows, math.ceil(nbytes / unit))
    completions = max(plan.steps, len(plan.peer_work))
    return data + completions


def submission(plan: WirePlan, fabric: Fabric, trigger: str, agents: int,
               unit_bytes: dict[int, float] | None = None) -> Submission:
    n = descriptors(plan, fabric, unit_bytes)
    agents = max(1, min(agents, n)) if trigger == "device" else 1
    per = fabric.sdma_descriptor_s[trigger]
    per_agent = math.ceil(n / agents)
    return Submission(n, agents, per, per_agent * per)


def in_flight(tier: Tier, op: str) -> int:
    """Transfers of `op` (put | get) one queue keeps outstanding on `tier`; 0 = unbounded."""
    return tier.get_in_flight if op == "get" else tier.put_in_flight


def window_s(plan: WirePlan, fabric: Fabric, op: str, unit_bytes: dict[int, float] | None = None,
             queues: int = 1) -> float:
    """Least time the engines take when each peer's queue is capped (0 when no peer's tier caps
    `op`): per peer, n transfers of bytes / n each, n·(round trip + bytes / n / β) / K; peers run on
    their own queues at once. `queues`: the queues a peer's transfers spread over (one per
    submitting agent: ASSUMPTION, each agent rings its own engine queue), at most n."""
    worst = 0.0
    for nbytes, t in plan.peer_work:
        tier = fabric.tier(t)
        k = in_flight(tier, op)
        if k <= 0 or nbytes <= 0:
            continue
        n = max(1, math.ceil(nbytes / _unit(fabric, t, unit_bytes)))
        worst = max(worst, n * (tier.round_trip_s + nbytes / n / tier.beta_Bps) / (k * min(queues, n)))
    return worst
