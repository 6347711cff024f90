"""Just-in-time registration of user buffers, cached by address range.

Modelled on NCCL's user-buffer registration cache (`src/register/register.cc`, `ncclRegister`;
lookup `ncclRegFind`): a buffer is registered over its page-aligned range
[addr & -page, roundup(addr + size, page)) with the page size of the host (`regCache.pageSize =
sysconf(_SC_PAGESIZE)` in NCCL's init.cc); a later buffer hits when one cached registration covers
its whole range, else it is registered anew. HCCL's just-in-time UB registration is costed the
same way: O(peers) per registration, the per-peer mappings serialised on the page-table lock
(REFERENCE §3). So hits and misses follow the allocator's block reuse: a buffer reused at the same
address within its registered size hits; a grown buffer, or one placed at a new address (a new
segment, or another cached block), misses — why MoE dispatch buffers, whose size follows routing,
miss (REFERENCE §3).

A registration is only valid while its memory stays mapped: entries overlapping an `unmap` event
of the allocator are evicted (PyTorch's ProcessGroupNCCL deregisters segments before SEGMENT_FREE,
`cacheAllocatorDeregisterHook`).

`JitMatch.cover` (NCCL) hits when any registration covers the range. The cache then keeps the
maximal registrations only (one inside a larger one is never the one a lookup needs), so entries
are non-nested: sorted by start, their ends are sorted too, and a lookup or an insertion is a
bisection. `JitMatch.exact` hits only on the very range registered before — a cache keyed by
(address, size), as HCCL's JIT path is modelled.

A trace has buffer names, not addresses: `buffer_wait_s` keys the same cache by (buffer, size),
a size change standing for a block placed anew (the trace-level runtime, stratacl/comm/registration.py).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort

from stratacl.config import JitMatch
from stratacl.memory.allocator import MemEvent
from stratacl.memory.mechanism import Registrar, RegistrationCost


class JitRegistrationCache(Registrar):
    """Per-die JIT registration cache. `lookup(addr, size)` at a buffer's communication use
    returns the registration time on the critical path (0 on a hit) and caches the range."""

    pays_at_use = True

    def __init__(self, cost: RegistrationCost, peers: int, key_page_bytes: int = 4096,
                 match: JitMatch = JitMatch.cover) -> None:
        assert key_page_bytes > 0 and not key_page_bytes & (key_page_bytes - 1), "a power-of-two page"
        self.cost = cost
        self.peers = peers
        self.page = key_page_bytes
        self.match = match
        self._begs: list[int] = []  # cover: non-nested registrations, by start
        self._ends: list[int] = []
        self._exact: list[tuple[int, int]] = []  # exact: registered (start, end), sorted
        self._exact_set: set[tuple[int, int]] = set()
        self._max_len = 0
        self._buffers: set[tuple[str, float]] = set()  # buffer_wait_s: registered (buffer, size)
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._begs) + len(self._exact)

    def _range(self, addr: int, size: int) -> tuple[int, int]:
        p = self.page
        return addr & -p, -(-(addr + size) // p) * p

    def contains(self, addr: int, size: int) -> bool:
        if size <= 0:
            return True
        beg, end = self._range(addr, size)
        if self.match == JitMatch.exact:
            return (beg, end) in self._exact_set
        i = bisect_right(self._begs, beg) - 1
        return i >= 0 and self._ends[i] >= end

    def lookup(self, addr: int, size: int) -> float:
        """Registration time (s) a communication on [addr, addr + size) pays now."""
        if size <= 0 or self.contains(addr, size):
            self.hits += 1
            return 0.0
        beg, end = self._range(addr, size)
        if self.match == JitMatch.exact:
            insort(self._exact, (beg, end))
            self._exact_set.add((beg, end))
            self._max_len = max(self._max_len, end - beg)
        else:  # drop the registrations the new one covers, then insert it in order
            lo = bisect_left(self._begs, beg)
            hi = lo
            while hi < len(self._begs) and self._ends[hi] <= end:
                hi += 1
            self._begs[lo:hi] = [beg]
            self._ends[lo:hi] = [end]
        self.misses += 1
        return self.cost.of(end - beg, self.peers)

    def wait_s(self, addr: int, size: int, t: float) -> float:
        """`lookup`: a use registers on its own path, whenever it comes."""
        return self.lookup(addr, size)

    def buffer_wait_s(self, name: str, nbytes: float, peers: int, now: float, mapped_at: float | None) -> float:
        """As `lookup`, for a buffer known by name only (a trace): a new (buffer, size) misses and
        registers `nbytes` with `peers` peers; a repeat hits. When it was mapped does not matter."""
        key = (name, nbytes)
        if nbytes <= 0 or key in self._buffers:
            self.hits += 1
            return 0.0
        self._buffers.add(key)
        self.misses += 1
        return self.cost.of(nbytes, peers)

    def on_event(self, ev: MemEvent) -> None:
        if ev.kind == "unmap":
            self.evict(ev.addr, ev.size)

    def evict(self, addr: int, size: int) -> int:
        """Drop every registration overlapping [addr, addr + size); returns how many."""
        if self.match == JitMatch.exact:
            lo = bisect_left(self._exact, (addr - self._max_len, 0))
            hi = bisect_left(self._exact, (addr + size, 0))
            gone = [r for r in self._exact[lo:hi] if r[1] > addr]
            if gone:
                self._exact[lo:hi] = [r for r in self._exact[lo:hi] if r[1] <= addr]
                self._exact_set.difference_update(gone)
                self.evictions += len(gone)
            return len(gone)
        lo = bisect_right(self._ends, addr)  # first entry ending after addr
        hi = bisect_left(self._begs, addr + size)  # entries starting before the range's end
        n = max(0, hi - lo)
        if n:
            del self._begs[lo:hi]
            del self._ends[lo:hi]
            self.evictions += n
        return n
