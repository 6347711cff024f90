"""When user buffers get registered for remote access during a trace replay, and what that costs on
the critical path: the allocator-side mechanisms (stratacl/memory) driven by buffer name, since a
trace has buffers and the ops that allocate them, not addresses.

- `staged`, `pool`: nothing at run time (comm buffers / the pool are registered at init).
- `jit_register`: the first collective on a (buffer, size) registers it (`JitRegistrationCache`):
  cached afterwards; a buffer whose size changes (MoE dispatch) misses. A buffer declared
  REGISTERED (the workload's allocator model found its range in the address-range cache) costs nothing.
- `on_alloc` (`RegistrationOnAllocation`): the allocator maps memory for the buffer at the start of
  the latest op that (re)allocates it; a use needing more than the buffer has mapped queues the
  growth's registration job then, on the die's registration worker, and waits only for what is left
  of it (barrier fallback: never more than a synchronous registration). Buffers allocated before the
  trace are ready. Jobs queue in the order uses discover them — the map order, unless a buffer
  mapped earlier is first used after one mapped later.
"""

from __future__ import annotations

from stratacl.comm.datapath import Listeners
from stratacl.trace import REGISTERED


class RegistrationState:
    """One replay's registration state: the library's mechanism, keyed by buffer name."""

    def __init__(self, listeners: Listeners, buffers: dict[str, tuple[int, ...]]) -> None:
        """`listeners`: the data path's mechanism objects (`DataPathModel.allocator_listeners`,
        the same the allocator side attaches), here driven by buffer name."""
        self.buffers = buffers  # name -> allocating op ids (-1: before the trace)
        self.jit = listeners.get("jit")
        self.on_alloc = listeners.get("on_alloc")
        self._alloc_time: dict[int, float] = {}
        self._alloc_ops = {op for ops in buffers.values() for op in ops if op >= 0}

    def note_start(self, op_id: int, now: float) -> None:
        """Record when allocating ops start (registration-on-allocation begins then)."""
        if op_id in self._alloc_ops:
            self._alloc_time[op_id] = now

    def exposed_cost_s(self, buffer: str, nbytes: float, peers: int, now: float) -> float:
        """Registration time a collective on `buffer` waits for at its start."""
        if not buffer or peers <= 0:
            return 0.0
        if self.jit is not None:
            if self.buffers.get(buffer) == (REGISTERED,):
                return 0.0
            return self.jit.lookup_buffer(buffer, nbytes, peers)
        if self.on_alloc is None:
            return 0.0
        started = [self._alloc_time[o] for o in self.buffers.get(buffer, ()) if o in self._alloc_time]
        if started:  # else mapped (and registered) before the trace: warm-up, weights, KV cache
            self.on_alloc.map_buffer(buffer, nbytes, max(started), peers)
        return self.on_alloc.buffer_wait_s(buffer, nbytes, now, peers)
