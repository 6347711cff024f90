"""When user buffers get registered for remote access, and what that costs on the critical path.

- `staged`, `pool`: nothing at run time (comm buffers / the pool are registered at init).
- `jit_register`: the first collective on a (buffer, size) registers it: a fixed cost plus one
  serialised mapping per peer (O(peers), REFERENCE §3); cached afterwards. A buffer whose size
  changes (MoE dispatch) misses the cache. A buffer declared REGISTERED (the workload's
  allocator model found its range in the address-range cache, stratacl/memory) costs nothing.
- `on_alloc`: registration starts when the allocator maps memory for the buffer (the start of the
  latest op that (re)allocates it) and runs asynchronously; the first use waits only for what is
  left of it (barrier fallback; worst case = JIT). Buffers allocated before the trace are ready;
  a buffer reused within its mapped size costs nothing; growth registers the new mapping.
"""

from __future__ import annotations

from stratacl.config import DataPath, LibraryConfig
from stratacl.trace import REGISTERED


class RegistrationState:
    def __init__(self, cfg: LibraryConfig, buffers: dict[str, tuple[int, ...]]) -> None:
        self.cfg = cfg
        self.buffers = buffers  # name -> allocating op ids (-1: before the trace)
        self._jit_cache: set[tuple[str, float]] = set()
        self._mapped: dict[str, float] = {}  # on_alloc: bytes already registered per buffer
        self._alloc_time: dict[int, float] = {}
        self._alloc_ops = {op for ops in buffers.values() for op in ops if op >= 0}

    def cost_s(self, peers: int) -> float:
        return (self.cfg.register_base_us + self.cfg.register_per_peer_us * peers) * 1e-6

    def note_start(self, op_id: int, now: float) -> None:
        """Record when allocating ops start (registration-on-allocation begins then)."""
        if op_id in self._alloc_ops:
            self._alloc_time[op_id] = now

    def exposed_cost_s(self, buffer: str, nbytes: float, peers: int, now: float) -> float:
        """Registration time a collective on `buffer` waits for at its start."""
        path = self.cfg.data_path
        if not buffer or peers <= 0 or path in (DataPath.staged, DataPath.pool):
            return 0.0
        if path == DataPath.jit_register:
            if self.buffers.get(buffer) == (REGISTERED,):
                return 0.0
            key = (buffer, nbytes)
            if key in self._jit_cache:
                return 0.0
            self._jit_cache.add(key)
            return self.cost_s(peers)
        # on_alloc
        started = [self._alloc_time[o] for o in self.buffers.get(buffer, ()) if o in self._alloc_time]
        if not started:
            return 0.0  # mapped (and registered) before the trace: warm-up, weights, KV cache
        if nbytes <= self._mapped.get(buffer, 0.0):
            return 0.0  # the existing mapping covers it
        self._mapped[buffer] = nbytes
        ready = max(started) + self.cost_s(peers)
        return max(0.0, ready - now)
