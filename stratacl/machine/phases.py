"""Phases: what a lowered op asks of the fabric, in order (the library/compute → engine contract).

A phase is either a pure delay (latency, synchronisation, launch) or a fluid activity: resource
loads in seconds at a die's full capacity, fractions of resources held for its duration, and a
minimum time (a rate cap, e.g. the cores it may use). Loads and holds apply to every die of a role:
``all`` (the op's ranks), ``src`` / ``dst`` (p2p ends). The HBM loads of ``wire`` and ``copy``
phases are traffic a compute phase with ``hbm_stall`` > 0 slows beside (`TRAFFIC`).
"""

from __future__ import annotations

from dataclasses import dataclass

from stratacl.vocab import PhaseCategory

CATEGORIES = tuple(c.value for c in PhaseCategory)
# categories whose HBM loads are communication traffic (transfers, staging copies, DMA copies)
TRAFFIC = (PhaseCategory.wire.value, PhaseCategory.copy.value)


@dataclass(frozen=True, slots=True)
class Phase:
    category: str  # one of CATEGORIES: where the op's time goes
    delay_s: float = 0.0  # pure latency, no resources (only when loads/holds are empty)
    loads: tuple[tuple[str, int, float], ...] = ()  # (role, resource index, seconds at capacity)
    holds: tuple[tuple[str, int, float], ...] = ()  # (role, resource index, fraction held)
    min_time_s: float = 0.0
    wire_bytes: float = 0.0  # bytes this phase puts on the network, summed over all ranks
    hbm_bytes: float = 0.0  # HBM bytes read+written, summed over all ranks
    copy_bytes: float = 0.0  # bytes copied into/out of staging buffers, summed over all ranks
    parts: tuple[tuple[str, float], ...] = ()  # a merged delay: (category, seconds) in order
    # compute: exposure to the HBM traffic of communication beside it (stratacl/engine/interference.py)
    hbm_stall: float = 0.0

    @property
    def is_delay(self) -> bool:
        return not self.loads and not self.holds

    def standalone_s(self) -> float:
        """Duration on an idle fabric."""
        if self.is_delay:
            return self.delay_s
        return max([self.min_time_s] + [s for _, _, s in self.loads])


def delay(category: str, seconds: float) -> list[Phase]:
    """A latency phase, or nothing when it is zero (zero-length phases cost events)."""
    return [Phase(category, delay_s=seconds)] if seconds > 0 else []


def merge_delays(phases: list[Phase]) -> list[Phase]:
    """Fuse consecutive pure delays into one (one simpy event instead of several); the merged
    phase keeps each part's category and length for the time split and the timeline."""
    out: list[Phase] = []
    for p in phases:
        if out and p.is_delay and out[-1].is_delay:
            prev = out[-1]
            parts = (prev.parts or ((prev.category, prev.delay_s),)) + (p.parts or ((p.category, p.delay_s),))
            out[-1] = Phase(prev.category, prev.delay_s + p.delay_s, parts=parts)
        else:
            out.append(p)
    return out
