"""The one protocol of a die's user-buffer registration mechanism, and what registering costs.

A `Registrar` (one per die and library, from `DataPathModel.registrar`) is driven three ways:

- by the device allocator: `attach` subscribes it to the map / unmap events (`on_event`);
- by a workload's memory model, which knows buffers by address (serving's dispatch / combine
  receive buffers, workloads/llm_infer/memory.py): `wait_s` at a buffer's communication use;
- by a trace replay, which knows buffers by name and when the ops that (re)allocate them started
  (stratacl/comm/registration.py): `buffer_wait_s` at a collective's start.

Callers never ask which mechanism they hold: a new one is a subclass implementing these.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Self

from stratacl.memory.allocator import CachingAllocator, MemEvent, MiB


@dataclass(frozen=True)
class RegistrationCost:
    """What registering `nbytes` with `peers` peers costs, in µs as the library config states it:
    (base_us + peers * (per_peer_us + per_page_us * pages)) * 1e-6 s, pages = ceil(nbytes / page_bytes).
    base: export the handle and broadcast metadata; per peer: import and map (O(peers),
    REFERENCE §3); per page: page-table entries each peer writes (0 unless known). The one
    registration cost of the harness: every mechanism and the trace replay use it."""

    base_us: float
    per_peer_us: float
    per_page_us: float = 0.0
    page_bytes: int = 2 * MiB  # ASSUMPTION: huge-page mapping granularity (2 MiB)

    def of(self, nbytes: float, peers: int) -> float:
        """Seconds to register `nbytes` with `peers` peers (0 for nothing or nobody)."""
        if peers <= 0 or nbytes <= 0:
            return 0.0
        pages = -(-nbytes // self.page_bytes)
        return (self.base_us + peers * (self.per_peer_us + self.per_page_us * pages)) * 1e-6


class Registrar(ABC):
    """One die's registration mechanism for one library."""

    # Whether a use can pay a registration the allocator's events did not start (a JIT cache
    # registers at use): a memory model must then show it every use, even of memory an iteration
    # left untouched; otherwise what a use waits follows from the map events alone.
    pays_at_use: ClassVar[bool] = False

    def attach(self, allocator: CachingAllocator) -> Self:
        """Listen to `allocator`'s map / unmap events from now on."""
        allocator.subscribe(self.on_event)
        return self

    @abstractmethod
    def on_event(self, ev: MemEvent) -> None:
        """One map / unmap event of the attached allocator."""

    @abstractmethod
    def wait_s(self, addr: int, size: int, t: float) -> float:
        """Registration time a communication using [addr, addr + size) of the attached
        allocator's memory at time `t` waits for."""

    @abstractmethod
    def buffer_wait_s(self, name: str, nbytes: float, peers: int, now: float, mapped_at: float | None) -> float:
        """Registration time a collective with `peers` peers on `nbytes` of the trace buffer
        `name` waits for at its start `now`. `mapped_at`: when the latest op that (re)allocates
        the buffer started, None if it was allocated before the trace."""


class NoRegistration(Registrar):
    """Staged copies or a pre-registered pool: no user buffer is registered, no use waits."""

    def on_event(self, ev: MemEvent) -> None:
        return None

    def wait_s(self, addr: int, size: int, t: float) -> float:
        return 0.0

    def buffer_wait_s(self, name: str, nbytes: float, peers: int, now: float, mapped_at: float | None) -> float:
        return 0.0
