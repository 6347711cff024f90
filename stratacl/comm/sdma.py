"""SDMA descriptor submission: how long an agent writes descriptors before and while engines move data.

An SDMA transfer is a list of descriptors, one per remote-slice transfer unit (StrataCL §4.4: the
operator is a set of ⟨peer, src, dst, bytes, …⟩ transfers; a descriptor moves at most the engine's
maximum length), plus one completion descriptor per synchronised step or peer (a tail descriptor
writing the peer's flag, or a notify task). An *agent* writes them one after another:
- ``device`` trigger: `agents` vector cores of the die write them in parallel and ring the
  doorbell, holding those cores while they write (StrataCL §4.4);
- ``aicpu``: the AI CPU writes task descriptors the scheduler runs (HCCL AI_CPU expansion mode),
  no AI core held; ``host``: the host runtime does.
The engines start after every agent's first descriptor and an engine start-up; the remaining
descriptors are written while earlier ones move data, so the transfer cannot end before the last
one is written. Per-descriptor write times, the engine start-up and the maximum descriptor length
are fabric knobs (conf/fabric, mostly ASSUMPTIONS: not public).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stratacl.comm.algorithms import WirePlan
from stratacl.machine.fabric import Fabric


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


def descriptors(plan: WirePlan, fabric: Fabric, unit_bytes: dict[int, float] | None = None) -> int:
    """Descriptors the busiest die writes: per peer max(⌈bytes / unit⌉, windows) (unit = the library's transfer unit
    for that tier, at most the engine's maximum descriptor length) + one completion per step or peer."""
    cap = fabric.sdma_descriptor_bytes
    data = 0
    copies = plan.peer_copies or (1,) * len(plan.peer_work)
    for (nbytes, tier), windows in zip(plan.peer_work, copies, strict=True):
        unit = min(cap, (unit_bytes or {}).get(tier, cap))
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
