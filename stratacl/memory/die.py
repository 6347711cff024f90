"""One die's memory as a workload drives it: named tensors allocated and freed in order through
a `CachingAllocator`, with the registration mechanism of the library's data path listening to it.

A workload declares what each iteration allocates and frees (`run`), and asks, at a buffer's
communication use, how long registration holds the collective up (`registration_wait_s`).
Iterations that repeat one from the same allocator state replay from a memo: same addresses, no
map events, no allocator work.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from stratacl.memory.allocator import Block, CachingAllocator, OutOfMemoryError
from stratacl.memory.on_alloc import RegistrationOnAllocation
from stratacl.memory.registration_cache import JitRegistrationCache

Op = tuple  # ("alloc", name, nbytes) | ("free", name)
_MEMO_MAX = 256


class DieMemory:
    """Named tensors on one die. Pass the registration objects un-attached: this attaches them."""

    def __init__(self, allocator: CachingAllocator, *, on_alloc: RegistrationOnAllocation | None = None,
                 jit: JitRegistrationCache | None = None, memo_max: int = _MEMO_MAX) -> None:
        self.allocator = allocator
        self.on_alloc = on_alloc.attach(allocator) if on_alloc is not None else None
        self.jit = jit.attach(allocator) if jit is not None else None
        self.tensors: dict[str, Block] = {}
        self._memo: dict[tuple, tuple] = {}
        self.memo_max = memo_max
        self.memo_hits = 0

    def __getitem__(self, name: str) -> Block:
        return self.tensors[name]

    def alloc(self, name: str, nbytes: int, t: float = 0.0) -> Block:
        if name in self.tensors:
            raise ValueError(f"tensor {name!r} is already allocated")
        b = self.allocator.malloc(nbytes, t)
        self.tensors[name] = b
        return b

    def free(self, name: str, t: float = 0.0) -> None:
        self.allocator.free(self.tensors.pop(name), t)

    def registration_wait_s(self, name: str, t: float) -> float:
        """Registration time a communication on tensor `name` waits for at time t: what is left of
        its registration-on-allocation jobs, and/or a JIT registration on a cache miss."""
        b = self.tensors[name]
        wait = 0.0
        if self.on_alloc is not None:
            wait += self.on_alloc.wait_s(b.addr, b.requested, t)
        if self.jit is not None:
            wait += self.jit.lookup(b.addr, b.requested)
        return wait

    def run(self, ops: Sequence[Op], t: float | Sequence[float] = 0.0) -> tuple[int, ...]:
        """Apply `ops` in order (times: one for all, or one per op); return the address of each
        allocation. Tensors an iteration allocates and frees itself are gone afterwards."""
        key_ops = tuple(ops)
        a = self.allocator
        s = a.stats
        sig = a.state_signature()
        hit = self._memo.get((sig, key_ops))
        if hit is not None:
            addrs, peak_alloc, peak_req, n = hit
            s.num_mallocs += n
            s.allocated_bytes_peak = max(s.allocated_bytes_peak, peak_alloc)
            s.requested_bytes_peak = max(s.requested_bytes_peak, peak_req)
            self.memo_hits += 1
            return addrs
        times = [t] * len(key_ops) if isinstance(t, int | float) else list(t)
        if len(times) != len(key_ops):
            raise ValueError(f"{len(times)} times for {len(key_ops)} ops")
        device_calls = s.num_device_alloc + s.num_device_free + s.num_alloc_retries
        addrs, live = [], set()
        balanced = True
        peak_alloc, peak_req = s.allocated_bytes, s.requested_bytes
        for op, ti in zip(key_ops, times, strict=True):
            if op[0] == "alloc":
                addrs.append(self.alloc(op[1], op[2], ti).addr)
                live.add(op[1])
                peak_alloc = max(peak_alloc, s.allocated_bytes)
                peak_req = max(peak_req, s.requested_bytes)
            elif op[0] == "free":
                balanced &= op[1] in live
                live.discard(op[1])
                self.free(op[1], ti)
            else:
                raise ValueError(f"unknown memory op {op!r}")
        addrs_t = tuple(addrs)
        quiet = s.num_device_alloc + s.num_device_free + s.num_alloc_retries == device_calls
        if balanced and not live and quiet and a.state_signature() == sig:
            if len(self._memo) >= self.memo_max:
                self._memo.clear()
            self._memo[(sig, key_ops)] = (addrs_t, peak_alloc, peak_req, len(addrs))
        return addrs_t


def replay_ops(alloc: CachingAllocator, ops: Iterable[tuple]) -> bool:
    """Run ("alloc", name, bytes) / ("free", name) ops through `alloc` in order (no time, no
    registration); False if it runs out of memory. For peak and fragmentation probes."""
    live: dict[str, Block] = {}
    try:
        for op in ops:
            if op[0] == "alloc":
                live[op[1]] = alloc.malloc(int(op[2]))
            else:
                alloc.free(live.pop(op[1]))
    except OutOfMemoryError:
        return False
    return True
