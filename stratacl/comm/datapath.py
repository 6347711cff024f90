"""How user data reaches the wire: one class per `DataPath`, chosen from `DATA_PATHS` by enum.

- `staged`: user data is copied into / out of the communicator's buffers (`comm_buffers` of
  `comm_buffer_MiB` MiB each, HCCL_BUFFSIZE) in rounds of the buffer size; no user buffer is
  registered.
- `jit_register`: user buffers are registered at first use (cached); zero-copy.
- `on_alloc`: user buffers are registered when the allocator maps them; zero-copy.
- `pool`: a pre-registered pool (`pool_GB`) holds the user buffers; no copy, no registration, but
  PyTorch's expandable segments must be off (REFERENCE §3).

A zero-copy path still stages what its library stages anyway (`stage_anyway`, e.g. NCCL's
reducescatter). Everything a data path decides is a method or class attribute here; the rest of
the library asks its `DataPathModel` instead of comparing `data_path`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

from stratacl.comm.buffers import MiB, buffer_sizes_MiB
from stratacl.config import DataPath, LibraryConfig, RegistrationMechanism
from stratacl.memory import (
    JitRegistrationCache,
    NoRegistration,
    Registrar,
    RegistrationCost,
    RegistrationOnAllocation,
)
from stratacl.memory.communicators import Communicator

DEFAULT_CCL_MiB = 200.0  # HCCL_BUFFSIZE default (REFERENCE §3; conf/library/hccl.yaml comm_buffer_MiB)


def staging_bytes(coll: str, size: float, n: int) -> tuple[float, float]:
    """Bytes a staged library copies in (user → comm buffer) and out, per rank, for an nccl-tests
    size S on n ranks: an allgather contributes its S/n share, a reducescatter keeps S/n; every
    other collective moves all of S each way."""
    return (size / n if coll == "allgather" else size), (size / n if coll == "reducescatter" else size)


class DataPathModel:
    """A zero-copy data path (the base): user buffers are used in place."""

    kind: ClassVar[DataPath]
    registration: ClassVar[RegistrationMechanism] = RegistrationMechanism.none
    stages: ClassVar[bool] = False  # copies every collective's user data through comm buffers
    forces_expandable_segments_off: ClassVar[bool] = False
    # whether remapping a user buffer changes the cost (registration at map time)
    cost_depends_on_mapping: ClassVar[bool] = False

    def __init__(self, cfg: LibraryConfig) -> None:
        self.cfg = cfg

    def comm_memory_bytes(self, communicators: int) -> float:
        """HBM per rank of the comm buffers of `communicators` default-size communicators."""
        return 0.0

    def communicator_buffer_bytes(self, comms: Sequence[Communicator]) -> float:
        """HBM per rank of the comm buffers of the communicators it is in (comm/buffers.py)."""
        return 0.0

    def pool_bytes(self) -> float:
        """HBM of a pre-registered pool outside the allocator."""
        return 0.0

    def ccl_bytes(self) -> float:
        """The CCL buffer HCCL's algorithm selection sizes its thresholds by: a zero-copy
        communicator still has HCCL's default one."""
        return DEFAULT_CCL_MiB * MiB

    def staging(self, coll: str, size: float, n: int) -> tuple[int, float, float]:
        """(rounds of the algorithm's synchronised steps, bytes copied in, bytes copied out) per
        rank for one collective of nccl-tests size `size` on `n` ranks."""
        frac = self.cfg.stage_anyway.get(coll, 0.0) if n > 1 else 0.0
        if frac <= 0:
            return 1, 0.0, 0.0
        cin, cout = staging_bytes(coll, size, n)
        return 1, frac * cin, frac * cout

    def p2p_copy_fraction(self) -> float:
        """Fraction of a send/recv's payload copied through a buffer on each end."""
        return self.cfg.stage_anyway.get("p2p", 0.0)

    def registrar(self, cost: RegistrationCost, peers: int) -> Registrar:
        """A fresh, un-attached registration mechanism of one die: `peers` are those the memory
        the allocator maps is registered with (a trace passes its own per collective)."""
        return NoRegistration()


class Staged(DataPathModel):
    kind = DataPath.staged
    stages = True

    def comm_memory_bytes(self, communicators: int) -> float:
        return communicators * self.cfg.comm_buffers * self.cfg.comm_buffer_MiB * MiB

    def communicator_buffer_bytes(self, comms: Sequence[Communicator]) -> float:
        """`comm_buffers` buffers per communicator, each of the size the framework configures or of
        HCCL_BUFFSIZE raised to fit the fused MoE windows."""
        if self.cfg.comm_buffers == 0:
            return 0.0
        sizes = buffer_sizes_MiB(comms, self.cfg.comm_buffer_MiB)
        return float(sum(sizes.values()) * self.cfg.comm_buffers * MiB)

    def ccl_bytes(self) -> float:
        return self.cfg.comm_buffer_MiB * MiB

    def staging(self, coll: str, size: float, n: int) -> tuple[int, float, float]:
        """Everything is copied; unpipelined, a payload larger than the buffer runs in rounds of
        the buffer size, each re-running the algorithm's steps (pipelined chunks overlap instead)."""
        if n < 2:
            return 1, 0.0, 0.0
        cin, cout = staging_bytes(coll, size, n)
        rounds = 1
        if self.cfg.pipeline_chunks == 1:
            rounds = max(1, math.ceil(max(cin, cout) / (self.cfg.comm_buffer_MiB * MiB)))
        return rounds, cin, cout

    def p2p_copy_fraction(self) -> float:
        return 1.0


class JitRegister(DataPathModel):
    kind = DataPath.jit_register
    registration = RegistrationMechanism.jit

    def registrar(self, cost: RegistrationCost, peers: int) -> Registrar:
        return JitRegistrationCache(cost, peers, match=self.cfg.jit_cache_match)


class OnAlloc(DataPathModel):
    kind = DataPath.on_alloc
    registration = RegistrationMechanism.on_alloc
    cost_depends_on_mapping = True  # a remap just before use can leave registration exposed

    def registrar(self, cost: RegistrationCost, peers: int) -> Registrar:
        return RegistrationOnAllocation(cost, peers)


class Pool(DataPathModel):
    kind = DataPath.pool
    forces_expandable_segments_off = True

    def pool_bytes(self) -> float:
        return self.cfg.pool_GB * 1e9


DATA_PATHS: dict[DataPath, type[DataPathModel]] = {c.kind: c for c in (Staged, JitRegister, OnAlloc, Pool)}


def data_path_model(cfg: LibraryConfig) -> DataPathModel:
    return DATA_PATHS[cfg.data_path](cfg)
