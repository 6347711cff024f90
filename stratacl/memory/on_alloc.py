"""Registration-on-allocation (StrataCL §4.1, REFERENCE §4): registration driven by the
allocator's physical-memory events instead of by communication.

Each map (a new segment, or pages mapped into an expandable segment) starts an asynchronous
registration job — phase 1: export the handle, broadcast metadata, every peer maps the range —
that runs on the library's registration worker(s) in the order the jobs arrive and costs
`RegistrationCost.of(bytes, peers)`. At first communication use (phase 2) a buffer waits only for
what is left of the jobs covering it; if that is more than registering the buffer itself would
take, the barrier fallback registers it synchronously instead (worst case = JIT). Each unmap
deregisters its range (asynchronous, nothing on the critical path).

Two drivers, one queue: the allocator (`attach`: map/unmap events keyed by address range) and a
trace replay, which knows buffers by name (`buffer_wait_s`, stratacl/comm/registration.py).

So the remaps and their slack emerge from the allocator: weights, KV cache and warm-up map memory
long before the first collective (≥ 2.6 s gap measured, REFERENCE §4); in steady state a batch
only maps when it needs more memory than any batch before it (expandable segments grow), and its
slack is the time from that allocation to the buffer's first use.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from typing import NamedTuple

from stratacl.memory.allocator import MemEvent
from stratacl.memory.mechanism import Registrar, RegistrationCost


class RegistrationJob(NamedTuple):
    key: int | str  # the mapped range's address (allocator) or the buffer's name (trace)
    size: float  # bytes mapped
    t_map: float  # when the memory was mapped
    start: float  # when a worker started registering it
    done: float  # when every peer had mapped it


class RegistrationOnAllocation(Registrar):
    """Per-die registration-on-allocation state: the worker queue, registered ranges (or buffers)
    and when each becomes ready. `peers`: the peers an allocator-mapped range is registered with."""

    def __init__(self, cost: RegistrationCost, peers: int, workers: int = 1) -> None:
        self.cost = cost
        self.peers = peers
        self._workers = [0.0] * workers  # heap of the times the workers become free
        # registered, mapped ranges: non-overlapping, sorted by start, with their ready time
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._ready: list[float] = []
        self._buffers: dict[str, tuple[float, float]] = {}  # name -> (bytes mapped, ready time)
        self.jobs: list[RegistrationJob] = []
        self.fallbacks = 0  # uses that registered synchronously (barrier fallback)

    # ------------------------------------------------------------------ the mechanism
    def _register(self, key: int | str, nbytes: float, t_map: float, peers: int) -> float:
        """Queue the registration of memory mapped at `t_map` on the first free worker; its done time."""
        start = max(t_map, heapq.heappop(self._workers))
        done = start + self.cost.of(nbytes, peers)
        heapq.heappush(self._workers, done)
        self.jobs.append(RegistrationJob(key, nbytes, t_map, start, done))
        return done

    def _wait(self, ready: float, nbytes: float, t: float, peers: int) -> float:
        """What a use at `t` of `nbytes` registered by `ready` waits: the rest of the job, or a
        synchronous registration of the buffer if that is shorter (barrier fallback)."""
        wait = ready - t
        if wait <= 0:
            return 0.0
        fallback = self.cost.of(nbytes, peers)
        if fallback < wait:
            self.fallbacks += 1
            return fallback
        return wait

    # ------------------------------------------------------------------ allocator-driven (addresses)
    def on_event(self, ev: MemEvent) -> None:
        if ev.kind == "map":
            done = self._register(ev.addr, ev.size, ev.t, self.peers)
            i = bisect_right(self._starts, ev.addr)
            if (i > 0 and self._ends[i - 1] > ev.addr) or (i < len(self._starts) and self._starts[i] < ev.addr + ev.size):
                raise AssertionError(f"map event over a mapped range at {ev.addr:#x}")
            self._starts.insert(i, ev.addr)
            self._ends.insert(i, ev.addr + ev.size)
            self._ready.insert(i, done)
        elif ev.kind == "unmap":
            self._remove(ev.addr, ev.addr + ev.size)

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

    def wait_s(self, addr: int, size: int, t: float) -> float:
        """Registration time a communication using [addr, addr + size) at time t waits for."""
        return self._wait(self.ready_at(addr, size), size, t, self.peers)

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

    # ------------------------------------------------------------------ trace-driven (buffer names)
    def buffer_wait_s(self, name: str, nbytes: float, peers: int, now: float, mapped_at: float | None) -> float:
        """As `wait_s`, for a buffer known by name. Needing more than it has mapped since
        `mapped_at` means the allocator mapped the growth then (a segment growing in place), which
        queues a job; a buffer never mapped during the trace was ready before it."""
        mapped, ready = self._buffers.get(name, (0.0, float("-inf")))
        if mapped_at is not None and nbytes > mapped:
            done = self._register(name, nbytes - mapped, mapped_at, peers)
            ready = max(ready, done)
            self._buffers[name] = (nbytes, ready)
        return self._wait(ready, nbytes, now, peers)
