"""Registration-on-allocation (StrataCL §4.1, REFERENCE §4): registration driven by the
allocator's physical-memory events instead of by communication.

Each `map` event (a new segment, or pages mapped into an expandable segment) starts an
asynchronous registration job — phase 1: export the handle, broadcast metadata, every peer maps
the range — that runs on the library's registration worker(s) in event order and costs
`RegistrationCost.of(bytes, peers)`. At first communication use (phase 2) a buffer waits only for
what is left of the jobs covering it; if that is more than registering the buffer itself would
take, the barrier fallback registers it synchronously instead (worst case = JIT). Each `unmap`
deregisters its range (asynchronous, nothing on the critical path).

So the remaps and their slack emerge from the allocator: weights, KV cache and warm-up map memory
long before the first collective (≥ 2.6 s gap measured, REFERENCE §4); in steady state a batch
only maps when it needs more memory than any batch before it (expandable segments grow), and its
slack is the time from that allocation to the buffer's first use.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from typing import NamedTuple

from stratacl.errors import ConfigError
from stratacl.memory.allocator import CachingAllocator, MemEvent
from stratacl.memory.registration_cache import RegistrationCost


class RegistrationJob(NamedTuple):
    addr: int
    size: int
    t_map: float  # when the allocator mapped the memory
    start: float  # when a worker started registering it
    done: float  # when every peer had mapped it


class RegistrationOnAllocation:
    """Per-die registration-on-allocation state: registered ranges and when each becomes ready."""

    def __init__(self, cost: RegistrationCost, peers: int, workers: int = 1) -> None:
        if peers < 0:
            raise ConfigError("peers", f"must be >= 0, got {peers}", "the peers a rank maps")
        if workers < 1:
            raise ConfigError("workers", f"must be >= 1, got {workers}", "registration threads per die")
        self.cost = cost
        self.peers = peers
        self._workers = [0.0] * workers  # heap of the times the workers become free
        # registered, mapped ranges: non-overlapping, sorted by start, with their ready time
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._ready: list[float] = []
        self.jobs: list[RegistrationJob] = []
        self.deregistrations = 0
        self.uses = 0  # wait_s calls
        self.waits = 0  # uses that found their range not ready yet
        self.wait_s_total = 0.0
        self.fallbacks = 0  # uses that registered synchronously (barrier fallback)

    def attach(self, allocator: CachingAllocator) -> RegistrationOnAllocation:
        allocator.subscribe(self.on_event)
        return self

    def on_event(self, ev: MemEvent) -> None:
        if ev.kind == "map":
            free_at = heapq.heappop(self._workers)
            start = max(ev.t, free_at)
            done = start + self.cost.of(ev.size, self.peers)
            heapq.heappush(self._workers, done)
            self.jobs.append(RegistrationJob(ev.addr, ev.size, ev.t, start, done))
            i = bisect_right(self._starts, ev.addr)
            if (i > 0 and self._ends[i - 1] > ev.addr) or (i < len(self._starts) and self._starts[i] < ev.addr + ev.size):
                raise AssertionError(f"map event over a mapped range at {ev.addr:#x}")
            self._starts.insert(i, ev.addr)
            self._ends.insert(i, ev.addr + ev.size)
            self._ready.insert(i, done)
        elif ev.kind == "unmap":
            self._remove(ev.addr, ev.addr + ev.size)
            self.deregistrations += 1

    def ready_at(self, addr: int, size: int) -> float:
        """When [addr, addr + size) is registered with every peer. KeyError if the allocator has
        not mapped all of it (a buffer the allocator did not hand out)."""
        if size <= 0:
            return float("-inf")
        end = addr + size
        i = bisect_right(self._starts, addr) - 1
        if i < 0 or self._ends[i] <= addr:
            raise KeyError(f"[{addr:#x}, {end:#x}) is not mapped memory")
        ready, pos = self._ready[i], self._ends[i]
        while pos < end:
            i += 1
            if i == len(self._starts) or self._starts[i] != pos:
                raise KeyError(f"[{addr:#x}, {end:#x}) is not entirely mapped memory")
            ready = max(ready, self._ready[i])
            pos = self._ends[i]
        return ready

    def is_ready(self, addr: int, size: int, t: float) -> bool:
        return self.ready_at(addr, size) <= t

    def wait_s(self, addr: int, size: int, t: float) -> float:
        """Registration time a communication using [addr, addr + size) at time t waits for."""
        self.uses += 1
        wait = self.ready_at(addr, size) - t
        if wait <= 0:
            return 0.0
        self.waits += 1
        fallback = self.cost.of(size, self.peers)
        if fallback < wait:
            self.fallbacks += 1
            wait = fallback
        self.wait_s_total += wait
        return wait

    def jobs_since(self, t: float) -> list[RegistrationJob]:
        """Registrations started by memory mapped at or after t (the remaps of steady state)."""
        return [j for j in self.jobs if j.t_map >= t]

    def _remove(self, lo: int, hi: int) -> None:
        i = bisect_right(self._ends, lo)  # first range ending after lo
        keep_s, keep_e, keep_r = [], [], []
        j = i
        while j < len(self._starts) and self._starts[j] < hi:
            s, e, r = self._starts[j], self._ends[j], self._ready[j]
            if s < lo:
                keep_s.append(s)
                keep_e.append(lo)
                keep_r.append(r)
            if e > hi:
                keep_s.append(hi)
                keep_e.append(e)
                keep_r.append(r)
            j += 1
        self._starts[i:j] = keep_s
        self._ends[i:j] = keep_e
        self._ready[i:j] = keep_r
