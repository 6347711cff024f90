"""When user buffers get registered for remote access during a trace replay, and what that costs on
the critical path: the allocator-side mechanisms (stratacl/memory) driven by buffer name, since a
trace has buffers and the ops that allocate them, not addresses. `RegistrationState` tells the
data path's `Registrar` when the latest op (re)allocating a buffer started; the registrar decides
the wait. A buffer declared REGISTERED (the workload's allocator model found it registered) costs
nothing whatever the mechanism.

- `staged`, `pool` (`NoRegistration`): nothing at run time (comm buffers / the pool are registered at init).
- `jit_register`: the first collective on a (buffer, size) registers it (`JitRegistrationCache`):
  cached afterwards; a buffer whose size changes (MoE dispatch) misses.
- `on_alloc` (`RegistrationOnAllocation`): the allocator maps memory for the buffer at the start of
  the latest op that (re)allocates it; a use needing more than the buffer has mapped queues the
  growth's registration job then, on the die's registration worker, and waits only for what is left
  of it (barrier fallback: never more than a synchronous registration). Buffers allocated before the
  trace are ready. Jobs queue in the order uses discover them — the map order, unless a buffer
  mapped earlier is first used after one mapped later.
"""

from __future__ import annotations

from stratacl.memory import Registrar
from stratacl.trace import REGISTERED


class RegistrationState:
    """One replay's registration state: the library's registrar, driven by buffer name."""

    def __init__(self, registrar: Registrar, buffers: dict[str, tuple[int, ...]]) -> None:
        """`registrar`: the data path's mechanism (`DataPathModel.registrar`, the same the
        allocator side attaches), here driven by buffer name."""
        self.registrar = registrar
        self.buffers = buffers  # name -> allocating op ids (-1: before the trace)
        self._alloc_time: dict[int, float] = {}
        self._alloc_ops = {op for ops in buffers.values() for op in ops if op >= 0}

    def note_start(self, op_id: int, now: float) -> None:
        """Record when allocating ops start (registration-on-allocation begins then)."""
        if op_id in self._alloc_ops:
            self._alloc_time[op_id] = now

    def exposed_cost_s(self, buffer: str, nbytes: float, peers: int, now: float) -> float:
        """Registration time a collective on `buffer` waits for at its start. A buffer declared
        REGISTERED (the workload's allocator model found it registered) waits for nothing."""
        if not buffer or peers <= 0 or self.buffers.get(buffer) == (REGISTERED,):
            return 0.0
        started = [self._alloc_time[o] for o in self.buffers.get(buffer, ()) if o in self._alloc_time]
        return self.registrar.buffer_wait_s(buffer, nbytes, peers, now, max(started) if started else None)
