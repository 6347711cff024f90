"""The engine ↔ lowering contract: what `engine/replay.py` needs from whoever turns ops into phases.

Compute and memcpy ops are lowered by `stratacl.machine.compute` (a roofline on the die); collectives and
p2p by a communication library (`stratacl.comm`). The engine sees only these protocols, so a new
library model — or a test double — plugs in without the engine knowing its class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from stratacl.machine.fabric import Fabric
from stratacl.machine.phases import Phase
from stratacl.trace import Op, Trace


@dataclass(frozen=True, slots=True)
class OpInfo:
    """What a library decided for one communication op (returned with the replay as metadata)."""

    algorithm: str = ""  # the algorithm that ran ("" for ops that are not communication)
    core_spread: float = float("nan")  # fastest-to-slowest comm-core completion spread (vector movers)


@dataclass(frozen=True, slots=True)
class Concurrency:
    """At most `limit` of a library's operators in flight on each unit of `dies_per_unit`
    consecutive dies (engine/admission.py)."""

    limit: int
    dies_per_unit: int
    what: str  # the limit as its source states it, e.g. "AI_CPU graphs per card"


class CommRuntime(Protocol):
    """Per-replay state of a library (registrations, caches)."""

    def observe_start(self, op: Op, now: float) -> None:
        """Every op's start (compute ops that allocate buffers drive registration timing)."""

    def lower_with_info(self, op: Op, now: float) -> tuple[list[Phase], OpInfo]:
        """Phases of a collective or p2p op starting at `now`, and the static choices made for it
        (algorithm, core spread; the replay keeps the info of every op it lowers)."""


class CommLowering(Protocol):
    """A communication library as the engine sees it."""

    name: str
    fabric: Fabric

    def runtime(self, trace: Trace) -> CommRuntime: ...

    def core_limits(self, trace: Trace) -> dict[str, tuple[int, int]]:
        """Per-stream (AIC, AIV) limits the replay runs compute kernels with under this library."""
        ...

    def op_concurrency(self) -> Concurrency | None:
        """How many of its operators can run at once per unit of dies (None: no limit)."""
        ...
