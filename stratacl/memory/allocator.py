"""One die's device allocator with PyTorch caching-allocator semantics.

Modelled on PyTorch's `c10/cuda/CUDACachingAllocator.cpp` (DeviceCachingAllocator), which
Ascend's `torch_npu/csrc/core/npu/NPUCachingAllocator.cpp` mirrors constant for constant:

- sizes are rounded up to 512 B (`kMinBlockSize`, `round_size`);
- requests <= 1 MiB (`kSmallSize`) use the small pool, packed into 2 MiB segments (`kSmallBuffer`);
  larger ones use the large pool: 1-10 MiB requests (`kMinLargeAlloc`) get a 20 MiB segment
  (`kLargeBuffer`), larger ones a segment of their size rounded up to 2 MiB (`kRoundLarge`)
  (`get_allocation_size`);
- a request takes the smallest cached free block that fits (best fit, `get_free_block`), which is
  split when the remainder is worth keeping (`should_split`: small pool or expandable segments:
  >= 512 B; large pool: request < max_split_size and remainder > 1 MiB); freed blocks merge with
  free neighbours of the same segment (`free_block`, `try_merge_blocks`);
- `max_split_size` (off by default): oversize blocks are never split and serve only requests
  within 20 MiB of their size;
- when the device has no room: free cached oversize blocks, then every cached block that is not
  split (`release_cached_blocks`, i.e. `empty_cache`), retry, else out of memory;
- expandable segments (`expandable_segments:True`): one virtual address range per pool reserved
  at 9/8 of device memory, backed by physical pages mapped on demand at the lowest address that
  fits (`find_expandable_block`, `map_block`), in pages of 2 MiB (small pool) and 20 MiB (large
  pool) ("we use 2MiB pages for our small pool and 20MiB pages for our large pool", Note
  [Expandable Segments]); `empty_cache` unmaps the fully free pages (`unmap_block`).

Single stream (blocks are not tied to streams), no CUDA graphs' private pools, no
`roundup_power2_divisions` and no garbage-collection threshold (all off by default in PyTorch).

Addresses are virtual: segments get VA from a monotone allocator starting at `va_base` (give each
die a disjoint base: shadow virtual addressing, REFERENCE §4.1), so registrations can key by
[start, end) ranges. Freed VA is never reused (a real cudaMalloc may reuse it; registrations are
evicted on unmap either way).

Events: every change of physical backing is a `MemEvent` delivered to subscribers in order —
`map` for a new non-expandable segment (PyTorch's SEGMENT_ALLOC) or pages mapped into an
expandable segment (SEGMENT_MAP), `unmap` for a released segment (SEGMENT_FREE) or unmapped pages
(SEGMENT_UNMAP). These are the trace entries PyTorch's ProcessGroupNCCL allocator hooks register
and deregister segments on (`cacheAllocatorRegisterHook` / `cacheAllocatorDeregisterHook`).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from stratacl.errors import ConfigError, HarnessError

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# c10/cuda/CUDACachingAllocator.cpp (same values in torch_npu's NPUCachingAllocator.cpp)
MIN_BLOCK = 512  # kMinBlockSize: all sizes are rounded to at least 512 B
SMALL_SIZE = 1 * MiB  # kSmallSize: largest "small" allocation
SMALL_BUFFER = 2 * MiB  # kSmallBuffer: small allocations are packed in 2 MiB segments
LARGE_BUFFER = 20 * MiB  # kLargeBuffer: 1-10 MiB allocations get a 20 MiB segment
MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc
ROUND_LARGE = 2 * MiB  # kRoundLarge: larger segments are rounded up to 2 MiB
# ASSUMPTION: VA alignment of non-expandable segments; only affects addresses, not sizes
SEGMENT_VA_ALIGN = 2 * MiB


def round_size(nbytes: int) -> int:
    """Block size of a request (`round_size`, without roundup_power2_divisions)."""
    if nbytes < MIN_BLOCK:
        return MIN_BLOCK
    return MIN_BLOCK * ((nbytes + MIN_BLOCK - 1) // MIN_BLOCK)


def allocation_size(size: int) -> int:
    """Size of the segment a rounded request creates when no cached block fits (`get_allocation_size`)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((size + ROUND_LARGE - 1) // ROUND_LARGE)


class OutOfMemoryError(HarnessError):
    """The die cannot back a request even after releasing every cached block."""


@dataclass(frozen=True)
class AllocatorConfig:
    """One die's allocator. `capacity_bytes` is the HBM the allocator may reserve (device memory
    minus what the runtime and other libraries keep outside it)."""

    capacity_bytes: int
    expandable_segments: bool = False  # PyTorch CUDA default False; torch_npu probes and defaults to True
    max_split_size: int | None = None  # max_split_size_mb (None = unlimited, the default)
    small_page_bytes: int = SMALL_BUFFER  # expandable-segment page, small pool
    large_page_bytes: int = LARGE_BUFFER  # expandable-segment page, large pool
    va_base: int = 1 << 40  # first virtual address of this die (disjoint per die)

    def __post_init__(self) -> None:
        if self.capacity_bytes <= 0:
            raise ConfigError("capacity_bytes", f"must be > 0, got {self.capacity_bytes}",
                              "give the HBM bytes the allocator may reserve")
        for name in ("small_page_bytes", "large_page_bytes"):
            v = getattr(self, name)
            if v <= 0 or v % MIN_BLOCK:
                raise ConfigError(name, f"must be a positive multiple of {MIN_BLOCK}, got {v}",
                                  "use 2 MiB (small pool) / 20 MiB (large pool), PyTorch's pages")
        if self.max_split_size is not None and self.max_split_size <= LARGE_BUFFER:
            # CUDAAllocatorConfig rejects max_split_size_mb <= kLargeBuffer / 1 MiB
            raise ConfigError("max_split_size", f"must be > {LARGE_BUFFER} B, got {self.max_split_size}",
                              "leave it None (unlimited) or give more than 20 MiB")
        if self.va_base < 0 or self.va_base % SEGMENT_VA_ALIGN:
            raise ConfigError("va_base", f"must be a non-negative multiple of 2 MiB, got {self.va_base}",
                              "e.g. (die + 1) << 40")


class MemEvent(NamedTuple):
    """A change of physical backing: `map` (segment allocated / pages mapped) or `unmap`."""

    kind: str  # "map" | "unmap"
    addr: int
    size: int
    t: float
    segment: int  # segment id
    expandable: bool
    small: bool  # small pool


class Segment:
    __slots__ = ("id", "base", "size", "expandable", "small", "page")

    def __init__(self, sid: int, base: int, size: int, expandable: bool, small: bool, page: int) -> None:
        self.id = sid
        self.base = base
        self.size = size  # VA extent (expandable: the whole reservation)
        self.expandable = expandable
        self.small = small
        self.page = page  # mapping granularity (expandable only)


class Block:
    """A contiguous piece of a segment: allocated, free (cached) or, in an expandable segment,
    unmapped address space. `requested` is what the tensor asked for (0 when not allocated)."""

    __slots__ = ("addr", "size", "requested", "allocated", "mapped", "prev", "next", "seg")

    def __init__(self, addr: int, size: int, seg: Segment, mapped: bool = True) -> None:
        self.addr = addr
        self.size = size
        self.requested = 0
        self.allocated = False
        self.mapped = mapped
        self.prev: Block | None = None
        self.next: Block | None = None
        self.seg = seg

    @property
    def end(self) -> int:
        return self.addr + self.size

    def __repr__(self) -> str:
        state = "alloc" if self.allocated else ("free" if self.mapped else "unmapped")
        return f"Block({self.addr:#x}, {self.size}, {state})"


# what a 0-byte request gets (PyTorch returns a null pointer): in no segment of the allocator
NULL_BLOCK = Block(0, 0, Segment(-1, 0, 0, expandable=False, small=False, page=0))
NULL_BLOCK.allocated = True


class _Pool:
    """Cached free blocks ordered by (size, addr) — best fit by bisection — and, for expandable
    segments, unmapped blocks ordered by address."""

    __slots__ = ("small", "keys", "blocks", "unmapped_addrs", "unmapped")

    def __init__(self, small: bool) -> None:
        self.small = small
        self.keys: list[tuple[int, int]] = []
        self.blocks: dict[int, Block] = {}
        self.unmapped_addrs: list[int] = []
        self.unmapped: dict[int, Block] = {}

    def add(self, b: Block) -> None:
        insort(self.keys, (b.size, b.addr))
        self.blocks[b.addr] = b

    def remove(self, b: Block) -> None:
        i = bisect_left(self.keys, (b.size, b.addr))
        del self.keys[i]
        del self.blocks[b.addr]

    def add_unmapped(self, b: Block) -> None:
        insort(self.unmapped_addrs, b.addr)
        self.unmapped[b.addr] = b

    def remove_unmapped(self, b: Block) -> None:
        del self.unmapped_addrs[bisect_left(self.unmapped_addrs, b.addr)]
        del self.unmapped[b.addr]


@dataclass
class AllocatorStats:
    """Counters as `torch.cuda.memory_stats()` names them (aggregate pool, "all")."""

    allocated_bytes: int = 0  # sum of allocated block sizes (rounded, incl. unsplit remainders)
    allocated_bytes_peak: int = 0
    requested_bytes: int = 0  # sum of the sizes tensors asked for
    requested_bytes_peak: int = 0
    reserved_bytes: int = 0  # physical memory held: segments (off) / mapped pages (on)
    reserved_bytes_peak: int = 0
    segments: int = 0  # live segments (an expandable segment counts once)
    num_device_alloc: int = 0  # cudaMalloc calls + page-mapping calls ("map" events)
    num_device_free: int = 0  # cudaFree calls + unmapping calls ("unmap" events)
    num_alloc_retries: int = 0  # mallocs that had to release the cache and retry
    num_ooms: int = 0
    num_mallocs: int = 0

    @property
    def fragmentation_bytes(self) -> int:
        """reserved_bytes.all.peak - allocated_bytes.all.peak: the HBM the die had to provision
        beyond the most its tensors ever held in blocks (cached free blocks, split remainders
        and, with expandable segments, unused parts of mapped pages)."""
        return self.reserved_bytes_peak - self.allocated_bytes_peak


Listener = Callable[[MemEvent], None]
# both pools' cached free blocks (size, addr) and unmapped addresses: see `state_signature`
StateSignature = tuple[tuple[tuple[tuple[int, int], ...], tuple[int, ...]], ...]


class CachingAllocator:
    """One die's caching allocator. `malloc(nbytes, t)` returns a `Block` (address `.addr`,
    rounded `.size`); `free(block, t)` caches it; `empty_cache(t)` returns cached memory.
    `t` only stamps the map/unmap events subscribers receive."""

    def __init__(self, cfg: AllocatorConfig) -> None:
        self.cfg = cfg
        self.stats = AllocatorStats()
        self._pools = (_Pool(small=False), _Pool(small=True))  # indexed by `small`
        self._next_va = cfg.va_base
        self._next_seg = 0
        self._listeners: list[Listener] = []
        self._active: set[Block] = set()
        self._segments: dict[int, Segment] = {}
        # 9/8 of device memory of VA per expandable segment (ExpandableSegment constructor)
        self._es_va = cfg.capacity_bytes + cfg.capacity_bytes // 8

    # ------------------------------------------------------------------ public API

    def subscribe(self, listener: Listener) -> None:
        """Deliver every map/unmap event to `listener`, in order."""
        self._listeners.append(listener)

    def malloc(self, nbytes: int, t: float = 0.0) -> Block:
        if nbytes < 0:
            raise ValueError(f"negative allocation size {nbytes}")
        if nbytes == 0:
            return NULL_BLOCK
        size = round_size(int(nbytes))
        small = size <= SMALL_SIZE
        pool = self._pools[small]
        block = self._get_free_block(pool, size)
        if block is None:
            alloc_size = allocation_size(size)
            block = self._alloc_block(pool, size, alloc_size, t)
            if block is None and self._release_available_cached_blocks(pool, size, t):
                block = self._alloc_block(pool, size, alloc_size, t)
            if block is None:
                self.stats.num_alloc_retries += 1
                self.empty_cache(t)
                block = self._alloc_block(pool, size, alloc_size, t)
            if block is None:
                self.stats.num_ooms += 1
                s = self.stats
                raise OutOfMemoryError(
                    f"die out of memory: tried to allocate {size / MiB:.1f} MiB; "
                    f"{s.reserved_bytes / GiB:.2f} GiB reserved of {self.cfg.capacity_bytes / GiB:.2f} GiB, "
                    f"{s.allocated_bytes / GiB:.2f} GiB allocated "
                    f"(expandable_segments={self.cfg.expandable_segments})")
        if self._should_split(block, size):
            block = self._split(pool, block, size)
        block.allocated = True
        block.requested = int(nbytes)
        self._active.add(block)
        s = self.stats
        s.num_mallocs += 1
        s.allocated_bytes += block.size
        if s.allocated_bytes > s.allocated_bytes_peak:
            s.allocated_bytes_peak = s.allocated_bytes
        s.requested_bytes += block.requested
        if s.requested_bytes > s.requested_bytes_peak:
            s.requested_bytes_peak = s.requested_bytes
        return block

    def free(self, block: Block, t: float = 0.0) -> None:
        if block is NULL_BLOCK:
            return
        if not block.allocated or block not in self._active:
            raise ValueError(f"free of a block that is not allocated: {block!r}")
        self._active.discard(block)
        block.allocated = False
        self.stats.allocated_bytes -= block.size
        self.stats.requested_bytes -= block.requested
        block.requested = 0
        pool = self._pools[block.seg.small]
        self._try_merge(block, block.prev, pool)
        self._try_merge(block, block.next, pool)
        pool.add(block)

    def empty_cache(self, t: float = 0.0) -> None:
        """Release every cached block that is a whole segment and unmap the fully free pages of
        expandable segments (`release_cached_blocks`)."""
        for pool in self._pools:
            to_unmap = []
            for _, addr in list(pool.keys):
                b = pool.blocks[addr]
                if b.seg.expandable:
                    to_unmap.append(b)
                elif b.prev is None and b.next is None:
                    self._release_block(pool, b, t)
            for b in to_unmap:
                self._unmap_block(pool, b, t)
                if not b.mapped and b.prev is None and b.next is None:
                    pool.remove_unmapped(b)  # the whole reservation is unmapped: give the VA back
                    del self._segments[b.seg.id]
                    self.stats.segments -= 1

    # ------------------------------------------------------------------ inspection

    def segment_blocks(self) -> Iterator[list[Block]]:
        """Each live segment's blocks in address order."""
        heads: dict[int, Block] = {}
        for block in self._all_blocks():
            h = block
            while h.prev is not None:
                h = h.prev
            heads[h.seg.id] = h
        for sid in sorted(heads):
            chain: list[Block] = []
            b: Block | None = heads[sid]
            while b is not None:
                chain.append(b)
                b = b.next
            yield chain

    def inactive_split_bytes(self) -> int:
        """Cached bytes in split non-expandable segments: free, yet not releasable by
        `empty_cache` (`inactive_split_bytes` in memory_stats)."""
        return sum(b.size for p in self._pools for b in p.blocks.values()
                   if not b.seg.expandable and (b.prev is not None or b.next is not None))

    def state_signature(self) -> StateSignature:
        """A value equal for equal allocator states when the allocated blocks are the same
        (cached free blocks and unmapped ranges of both pools)."""
        return tuple((tuple(p.keys), tuple(p.unmapped_addrs)) for p in self._pools)

    def cached_bytes(self) -> int:
        return sum(size for p in self._pools for size, _ in p.keys)

    def check_invariants(self) -> None:
        """Raise AssertionError if the block structure is inconsistent (tests)."""
        mapped = allocated = 0
        free_seen: set[Block] = set()
        seen_segments = set()
        for chain in self.segment_blocks():
            seg = chain[0].seg
            seen_segments.add(seg.id)
            assert chain[0].addr == seg.base, "segment head not at its base"
            assert sum(b.size for b in chain) == seg.size, "blocks do not tile the segment"
            for a, b in zip(chain, chain[1:], strict=False):
                assert a.end == b.addr and b.prev is a and a.next is b, "broken block chain"
                assert not (not a.allocated and not b.allocated and a.mapped == b.mapped), \
                    f"unmerged neighbours {a!r} {b!r}"
            for b in chain:
                assert b.seg is seg
                if b.mapped:
                    mapped += b.size
                else:
                    assert seg.expandable and not b.allocated
                    assert (b.addr - seg.base) % seg.page == 0 and b.size % seg.page == 0
                if b.allocated:
                    allocated += b.size
                    assert b in self._active
                elif b.mapped:
                    free_seen.add(b)
        assert seen_segments == set(self._segments), "segment table out of date"
        assert mapped == self.stats.reserved_bytes, f"reserved {self.stats.reserved_bytes} != mapped {mapped}"
        assert allocated == self.stats.allocated_bytes
        assert self.stats.reserved_bytes <= self.cfg.capacity_bytes
        pooled = {b for p in self._pools for b in p.blocks.values()}
        assert pooled == free_seen, "cached pool differs from the free blocks"
        for p in self._pools:
            assert p.keys == sorted((b.size, b.addr) for b in p.blocks.values())
            assert p.unmapped_addrs == sorted(p.unmapped)

    # ------------------------------------------------------------------ internals

    def _all_blocks(self) -> Iterator[Block]:
        yield from self._active
        for p in self._pools:
            yield from p.blocks.values()
            yield from p.unmapped.values()

    def _emit(self, kind: str, addr: int, size: int, t: float, seg: Segment) -> None:
        ev = MemEvent(kind, addr, size, t, seg.id, seg.expandable, seg.small)
        for fn in self._listeners:
            fn(ev)

    def _reserve_va(self, size: int, align: int) -> int:
        addr = -(-self._next_va // align) * align
        self._next_va = addr + size
        return addr

    def _new_segment(self, size: int, expandable: bool, small: bool) -> Segment:
        page = self.cfg.small_page_bytes if small else self.cfg.large_page_bytes
        base = self._reserve_va(size, page if expandable else SEGMENT_VA_ALIGN)
        seg = Segment(self._next_seg, base, size, expandable, small, page)
        self._next_seg += 1
        self._segments[seg.id] = seg
        self.stats.segments += 1
        return seg

    def _get_free_block(self, pool: _Pool, size: int) -> Block | None:
        keys = pool.keys
        i = bisect_left(keys, (size, 0))
        if i == len(keys):
            return None
        b = pool.blocks[keys[i][1]]
        if b.seg.expandable:
            # best fit by the size a block can grow to: prefer holes to the mapped tail
            def grow(x: Block) -> int:
                n = x.next
                return x.size + (n.size if n is not None and not n.mapped else 0)

            j = i + 1
            while j < len(keys) and b.seg.expandable:
                nb = pool.blocks[keys[j][1]]
                if grow(nb) >= grow(b):
                    break
                b, i, j = nb, j, j + 1
        ms = self.cfg.max_split_size
        if ms is not None:
            if size < ms and b.size >= ms:
                return None  # no oversize block for a normal request
            if size >= ms and b.size >= size + LARGE_BUFFER:
                return None  # an oversize block serves requests within 20 MiB of it
        del keys[i]
        del pool.blocks[b.addr]
        return b

    def _should_split(self, b: Block, size: int) -> bool:
        remaining = b.size - size
        if b.seg.small or b.seg.expandable:
            return remaining >= MIN_BLOCK
        ms = self.cfg.max_split_size
        return (ms is None or size < ms) and remaining > SMALL_SIZE

    def _split(self, pool: _Pool, rest: Block, size: int) -> Block:
        b = Block(rest.addr, size, rest.seg)
        b.prev = rest.prev
        if b.prev is not None:
            b.prev.next = b
        b.next = rest
        rest.prev = b
        rest.addr += size
        rest.size -= size
        pool.add(rest)
        return b

    def _try_merge(self, dst: Block, src: Block | None, pool: _Pool) -> int:
        """Absorb free neighbour `src` into `dst` (which is in no pool)."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return 0
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        if src.mapped:
            pool.remove(src)
        else:
            pool.remove_unmapped(src)
        return src.size

    def _alloc_block(self, pool: _Pool, size: int, alloc_size: int, t: float) -> Block | None:
        if self.cfg.expandable_segments:
            return self._try_allocate_expandable_block(pool, size, t)
        if self.stats.reserved_bytes + alloc_size > self.cfg.capacity_bytes:
            return None
        seg = self._new_segment(alloc_size, expandable=False, small=pool.small)
        self._reserve(alloc_size)
        self._emit("map", seg.base, alloc_size, t, seg)
        return Block(seg.base, alloc_size, seg)

    def _reserve(self, nbytes: int) -> None:
        s = self.stats
        s.reserved_bytes += nbytes
        if s.reserved_bytes > s.reserved_bytes_peak:
            s.reserved_bytes_peak = s.reserved_bytes
        s.num_device_alloc += 1

    def _release_block(self, pool: _Pool, b: Block, t: float) -> None:
        """cudaFree a cached block that is a whole non-expandable segment."""
        pool.remove(b)
        del self._segments[b.seg.id]
        self.stats.segments -= 1
        self.stats.reserved_bytes -= b.size
        self.stats.num_device_free += 1
        self._emit("unmap", b.addr, b.size, t, b.seg)

    def _release_available_cached_blocks(self, pool: _Pool, size: int, t: float) -> bool:
        """With max_split_size set: release cached oversize blocks, enough for the request."""
        ms = self.cfg.max_split_size
        if ms is None:
            return False
        want = max(size, ms)
        keys = pool.keys

        def whole(b: Block) -> bool:
            return not b.seg.expandable and b.prev is None and b.next is None

        i = bisect_left(keys, (want, 0))
        if i < len(keys):  # one cached block is large enough: release it
            b = pool.blocks[keys[i][1]]
            if not whole(b):
                return False
            self._release_block(pool, b, t)
            return True
        released = 0  # else release oversize blocks, largest first, until enough
        for s, a in reversed(list(keys)):
            if released >= want or s < ms:
                break
            b = pool.blocks[a]
            if whole(b):
                released += s
                self._release_block(pool, b, t)
        return released >= want

    # --------------------------------------------------------- expandable segments

    def _try_allocate_expandable_block(self, pool: _Pool, size: int, t: float) -> Block | None:
        c: Block | None = self._find_expandable_block(pool, size)
        if c is not None and not c.mapped:
            c = self._map_block(pool, c, min(c.size, size), t)
        while c is not None and c.size < size:  # invariant: free -> unmapped -> ...
            nxt = c.next
            assert nxt is not None and not nxt.mapped
            c = self._map_block(pool, nxt, min(size - c.size, nxt.size), t)
        if c is not None:
            pool.remove(c)
        return c

    def _find_expandable_block(self, pool: _Pool, size: int) -> Block:
        """Lowest-address run of free + unmapped space of at least `size` bytes."""
        for addr in pool.unmapped_addrs:
            c = pool.unmapped[addr]
            if c.prev is not None and not c.prev.allocated:
                c = c.prev
            n = 0
            b: Block | None = c
            while n < size and b is not None and not b.allocated:
                n += b.size
                b = b.next
            if n >= size:
                return c
        page = self.cfg.small_page_bytes if pool.small else self.cfg.large_page_bytes
        va = -(-self._es_va // page) * page
        seg = self._new_segment(va, expandable=True, small=pool.small)
        c = Block(seg.base, va, seg, mapped=False)
        pool.add_unmapped(c)
        return c

    def _map_block(self, pool: _Pool, b: Block, size: int, t: float) -> Block | None:
        """Back the first `size` bytes of unmapped block `b` with whole pages; return the free
        block they became part of (merged with free neighbours), or None if the die is full."""
        seg = b.seg
        page = seg.page
        off = b.addr - seg.base
        nbytes = (-(-(off + size) // page) - off // page) * page
        if self.stats.reserved_bytes + nbytes > self.cfg.capacity_bytes:
            return None
        pool.remove_unmapped(b)
        b.mapped = True
        if nbytes < b.size:
            rest = Block(b.addr + nbytes, b.size - nbytes, seg, mapped=False)
            rest.prev, rest.next = b, b.next
            if rest.next is not None:
                rest.next.prev = rest
            b.next = rest
            b.size = nbytes
            pool.add_unmapped(rest)
        addr = b.addr
        self._try_merge(b, b.prev, pool)
        self._try_merge(b, b.next, pool)
        pool.add(b)
        self._reserve(nbytes)
        self._emit("map", addr, nbytes, t, seg)
        return b

    def _unmap_block(self, pool: _Pool, b: Block, t: float) -> None:
        """Unmap the whole pages inside free block `b` of an expandable segment."""
        seg = b.seg
        page = seg.page
        off = b.addr - seg.base
        first = -(-off // page)
        last = (off + b.size) // page
        if first >= last:
            return
        pool.remove(b)
        start = seg.base + first * page
        nbytes = (last - first) * page
        before = start - b.addr
        after = b.size - before - nbytes
        if before > 0:
            bf = Block(b.addr, before, seg)
            bf.prev, bf.next = b.prev, b
            if bf.prev is not None:
                bf.prev.next = bf
            b.prev = bf
            pool.add(bf)
        if after > 0:
            af = Block(start + nbytes, after, seg)
            af.prev, af.next = b, b.next
            if af.next is not None:
                af.next.prev = af
            b.next = af
            pool.add(af)
        b.addr, b.size, b.mapped = start, nbytes, False
        self._try_merge(b, b.prev, pool)
        self._try_merge(b, b.next, pool)
        pool.add_unmapped(b)
        self.stats.reserved_bytes -= nbytes
        self.stats.num_device_free += 1
        self._emit("unmap", start, nbytes, t, seg)
