"""Per-die device memory: a caching allocator with PyTorch semantics and the registration
mechanisms its events drive (one `Registrar` protocol: registration-on-allocation, JIT
registration caches, none)."""

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
from stratacl.memory.mechanism import NoRegistration, Registrar, RegistrationCost
from stratacl.memory.on_alloc import RegistrationJob, RegistrationOnAllocation
from stratacl.memory.registration_cache import JitRegistrationCache

__all__ = [
    "GiB", "KiB", "MiB", "AllocatorConfig", "AllocatorStats", "Block", "CachingAllocator", "DieMemory",
    "JitRegistrationCache", "MemEvent", "MemoryPeak", "NoRegistration", "OutOfMemoryError", "Registrar",
    "RegistrationCost", "RegistrationJob", "RegistrationOnAllocation", "allocation_size", "round_size",
]
