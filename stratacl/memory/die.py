"""One die's memory as a workload drives it: named tensors allocated and freed in order through
a `CachingAllocator`, with the registration mechanism of the library's data path listening to it.

A workload declares what each iteration allocates and frees (`run`), or asks what a whole
sequence reserves at its peak (`peak`). Iterations that repeat one from the same allocator state
replay from a memo: same addresses, no map events, no allocator work. The `registrar` is the
workload's to ask at a buffer's communication use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stratacl.memory.allocator import (
    Block,
    CachingAllocator,
    MemEvent,
    OutOfMemoryError,
    StateSignature,
)
from stratacl.memory.mechanism import NoRegistration, Registrar

Op = tuple[str, str, float] | tuple[str, str]  # ("alloc", name, nbytes) | ("free", name)
# a run's addresses, peak allocated and requested bytes, and allocations
_Memo = tuple[tuple[int, ...], int, int, int]
_MEMO_MAX = 256


@dataclass(frozen=True)
class MemoryPeak:
    """What a sequence of tensors made the allocator hold at its peaks (bytes)."""

    reserved: float  # reserved at the peak: what the die must hold
    allocated: float  # in tensors at the peak
    fragmentation: float  # reserved peak - allocated peak
    expandable_segments: bool
    retries: int  # allocations that had to release the cache and retry


class DieMemory:
    """Named tensors on one die. Pass the registrar un-attached (None: no registration): this
    attaches it."""

    def __init__(self, allocator: CachingAllocator, registrar: Registrar | None = None, *,
                 memo_max: int = _MEMO_MAX) -> None:
        self.allocator = allocator
        self.registrar = (NoRegistration() if registrar is None else registrar).attach(allocator)
        self.tensors: dict[str, Block] = {}
        self._memo: dict[tuple[StateSignature, tuple[Op, ...]], _Memo] = {}
        self.memo_max = memo_max
        self.memo_hits = 0
        self.maps = 0  # map events so far (a memo hit maps nothing)
        allocator.subscribe(self._count)

    def _count(self, ev: MemEvent) -> None:
        self.maps += ev.kind == "map"

    def __getitem__(self, name: str) -> Block:
        return self.tensors[name]

    def alloc(self, name: str, nbytes: float, t: float = 0.0) -> Block:
        if name in self.tensors:
            raise ValueError(f"tensor {name!r} is already allocated")
        b = self.allocator.malloc(int(nbytes), t)
        self.tensors[name] = b
        return b

    def free(self, name: str, t: float = 0.0) -> None:
        self.allocator.free(self.tensors.pop(name), t)

    def run(self, ops: Sequence[Op], t: float | Sequence[float] = 0.0) -> tuple[int, ...]:
        """Apply `ops` in order (times: one for all, or one per op); return the address of each
        allocation. Tensors an iteration allocates and frees itself are gone afterwards."""
        key_ops = tuple(ops)
        a = self.allocator
        s = a.stats
        sig = a.state_signature()
        hit = self._memo.get((sig, key_ops))
        if hit is not None:
            memo_addrs, memo_alloc, memo_req, n = hit
            s.num_mallocs += n
            s.allocated_bytes_peak = max(s.allocated_bytes_peak, memo_alloc)
            s.requested_bytes_peak = max(s.requested_bytes_peak, memo_req)
            self.memo_hits += 1
            return memo_addrs
        times = [t] * len(key_ops) if isinstance(t, int | float) else list(t)
        if len(times) != len(key_ops):
            raise ValueError(f"{len(times)} times for {len(key_ops)} ops")
        device_calls = s.num_device_alloc + s.num_device_free + s.num_alloc_retries
        addrs: list[int] = []
        live: set[str] = set()
        balanced = True
        peak_alloc, peak_req = s.allocated_bytes, s.requested_bytes
        for op, ti in zip(key_ops, times, strict=True):
            if len(op) == 3 and op[0] == "alloc":
                addrs.append(self.alloc(op[1], op[2], ti).addr)
                live.add(op[1])
                peak_alloc = max(peak_alloc, s.allocated_bytes)
                peak_req = max(peak_req, s.requested_bytes)
            elif len(op) == 2 and op[0] == "free":
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

    def peak(self, ops: Sequence[Op]) -> MemoryPeak | None:
        """Run `ops` from the current state (time 0); the allocator's peaks since it was created,
        or None if the die runs out of memory (after the allocator's own cache release and retry)."""
        try:
            self.run(ops)
        except OutOfMemoryError:
            return None
        s = self.allocator.stats
        return MemoryPeak(float(s.reserved_bytes_peak), float(s.allocated_bytes_peak), float(s.fragmentation_bytes),
                          self.allocator.cfg.expandable_segments, s.num_alloc_retries)
