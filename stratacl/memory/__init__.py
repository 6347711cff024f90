"""Per-die device memory: a caching allocator with PyTorch semantics and the registration
mechanisms its events drive (registration-on-allocation, JIT registration caches)."""

from stratacl.memory.allocator import (
    AllocatorConfig,
    AllocatorStats,
    Block,
    CachingAllocator,
    GiB,
    KiB,
    MemEvent,
    MiB,
    OutOfMemoryError,
    allocation_size,
    round_size,
)
from stratacl.memory.die import DieMemory, MemoryPeak
from stratacl.memory.on_alloc import RegistrationJob, RegistrationOnAllocation
from stratacl.memory.registration_cache import JitRegistrationCache, RegistrationCost

__all__ = [
    "GiB", "KiB", "MiB", "AllocatorConfig", "AllocatorStats", "Block", "CachingAllocator", "DieMemory",
    "JitRegistrationCache", "MemEvent", "MemoryPeak", "OutOfMemoryError", "RegistrationCost", "RegistrationJob",
    "RegistrationOnAllocation", "allocation_size", "round_size",
]
