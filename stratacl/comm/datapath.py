"""How user data reaches the wire: one class per `DataPath`, registered in `DATA_PATHS` by name.

- `staged`: user data is copied into / out of the communicator's buffers (`comm_buffers` of
  `comm_buffer_MiB` MiB each, HCCL_BUFFSIZE) in rounds of the buffer size; no user buffer is
  registered.
- `jit_register`: user buffers are registered at first use (cached); zero-copy.
- `on_alloc`: user buffers are registered when the allocator maps them; zero-copy.
- `pool`: a pre-registered pool (`pool_GB`) holds the user buffers; no copy, no registration, but
  PyTorch's expandable segments must be off (REFERENCE §3).

A zero-copy path still stages what its library stages anyway (`stage_anyway`, e.g. NCCL's
reducescatter). Everything a data path decides is a method or class attribute here, the staging
copies included (`staging`); the rest of the library asks its `DataPathModel` instead of
comparing `data_path`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from stratacl.comm.buffers import buffer_sizes_MiB
from stratacl.comm.mechanism import Mechanism
from stratacl.comm.registry import Registry
from stratacl.config import DataPath, JitMatch, RegistrationMechanism
from stratacl.memory import (
    JitRegistrationCache,
    NoRegistration,
    Registrar,
    RegistrationCost,
    RegistrationOnAllocation,
)
from stratacl.memory.allocator import MiB
from stratacl.memory.communicators import Communicator

DEFAULT_CCL_MiB = 200.0  # HCCL_BUFFSIZE default (REFERENCE §3; conf/library/hccl.yaml comm_buffer_MiB)


def staging_bytes(coll: str, size: float, n: int) -> tuple[float, float]:
    """Bytes a staged library copies in (user → comm buffer) and out, per rank, for an nccl-tests
    size S on n ranks: an allgather contributes its S/n share, a reducescatter keeps S/n; every
    other collective moves all of S each way."""
    return (size / n if coll == "allgather" else size), (size / n if coll == "reducescatter" else size)


@dataclass(frozen=True)
class Staging:
    """The staging copies of one operator per rank: rounds of the algorithm's synchronised steps,
    bytes copied in (user → comm buffer) and out, and the part of each exposed before / after the
    transfer (the rest overlaps it)."""

    rounds: int = 1
    copy_in: float = 0.0
    copy_out: float = 0.0
    fill_in: float = 0.0
    fill_out: float = 0.0


NO_STAGING = Staging()


class DataPathModel(Mechanism):
    """A zero-copy data path (the base): user buffers are used in place."""

    @dataclass(frozen=True)
    class Config:
        stage_anyway: Mapping[str, float]  # copies a zero-copy path still does, per collective
        pipeline_chunks: int  # >1: copies overlap the transfer in that many chunks per buffer
        comm_buffer_MiB: float  # one comm buffer (pipeline slots are cut from it)
        copy_GBps: float  # device-to-device copy rate (0 = HBM-bound)

    registration: ClassVar[RegistrationMechanism] = RegistrationMechanism.none
    stages: ClassVar[bool] = False  # copies every collective's user data through comm buffers
    forces_expandable_segments_off: ClassVar[bool] = False
    # whether remapping a user buffer changes the cost (registration at map time)
    cost_depends_on_mapping: ClassVar[bool] = False

    def __init__(self, config: DataPathModel.Config) -> None:
        self.config = config

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

    def staging(self, coll: str, size: float, n: int, kernel_cores: int) -> Staging:
        """The staging copies per rank of one collective of nccl-tests size `size` on `n` ranks,
        run by a comm kernel of `kernel_cores` cores (one pipeline channel each)."""
        frac = self.config.stage_anyway.get(coll, 0.0) if n > 1 else 0.0
        if frac <= 0:
            return NO_STAGING
        cin, cout = staging_bytes(coll, size, n)
        return self._filled(1, frac * cin, frac * cout, kernel_cores)

    def sync_s(self, step_latency_s: float, rounds: int) -> float:
        """The latency of a plan stage's synchronised steps, re-run in each staging round."""
        return step_latency_s * rounds

    def p2p_staging(self, nbytes: float, kernel_cores: int) -> Staging:
        """The copies of a send/recv of `nbytes`: the same bytes through a buffer on each end."""
        copy = self.p2p_copy_fraction() * nbytes
        return self._filled(1, copy, copy, kernel_cores)

    def p2p_copy_fraction(self) -> float:
        """Fraction of a send/recv's payload copied through a buffer on each end."""
        return self.config.stage_anyway.get("p2p", 0.0)

    def copy_min_s(self, nbytes: float) -> float:
        """The least time a copy of `nbytes` takes at the configured copy rate (0: HBM-bound)."""
        rate = self.config.copy_GBps
        return nbytes / (rate * 1e9) if rate > 0 else 0.0

    def _filled(self, rounds: int, cin: float, cout: float, kernel_cores: int) -> Staging:
        return Staging(rounds, cin, cout, self._fill(cin, kernel_cores), self._fill(cout, kernel_cores))

    def _fill(self, nbytes: float, kernel_cores: int) -> float:
        """The copy exposed before (or after) a staged transfer of `nbytes` per rank. Unpipelined: all
        of it. Pipelined in `pipeline_chunks` slots per channel buffer (NCCL_STEPS slots of
        NCCL_BUFFSIZE / NCCL_STEPS each, every channel on its own SM): the first slot of each channel,
        i.e. one chunk of a small payload, never more than `channels x buffer / chunks`."""
        chunks = self.config.pipeline_chunks
        if nbytes <= 0 or chunks == 1:
            return max(nbytes, 0.0)
        slots = kernel_cores * self.config.comm_buffer_MiB * MiB / chunks
        return min(nbytes / chunks, slots)

    def registrar(self, cost: RegistrationCost, peers: int) -> Registrar:
        """A fresh, un-attached registration mechanism of one die: `peers` are those the memory
        the allocator maps is registered with (a trace passes its own per collective)."""
        return NoRegistration()


DATA_PATHS: Registry[type[DataPathModel]] = Registry("data_path")


@DATA_PATHS.register(DataPath.staged)
class Staged(DataPathModel):
    @dataclass(frozen=True)
    class Config(DataPathModel.Config):
        comm_buffers: int  # buffers per communicator (in + out)

    stages = True
    config: Staged.Config

    def comm_memory_bytes(self, communicators: int) -> float:
        return communicators * self.config.comm_buffers * self.config.comm_buffer_MiB * MiB

    def communicator_buffer_bytes(self, comms: Sequence[Communicator]) -> float:
        """`comm_buffers` buffers per communicator, each of the size the framework configures or of
        HCCL_BUFFSIZE raised to fit the fused MoE windows."""
        if self.config.comm_buffers == 0:
            return 0.0
        sizes = buffer_sizes_MiB(comms, self.config.comm_buffer_MiB)
        return float(sum(sizes.values()) * self.config.comm_buffers * MiB)

    def ccl_bytes(self) -> float:
        return self.config.comm_buffer_MiB * MiB

    def staging(self, coll: str, size: float, n: int, kernel_cores: int) -> Staging:
        """Everything is copied; unpipelined, a payload larger than the buffer runs in rounds of
        the buffer size, each re-running the algorithm's steps (pipelined chunks overlap instead)."""
        if n < 2:
            return NO_STAGING
        cin, cout = staging_bytes(coll, size, n)
        rounds = 1
        if self.config.pipeline_chunks == 1:
            rounds = max(1, math.ceil(max(cin, cout) / (self.config.comm_buffer_MiB * MiB)))
        return self._filled(rounds, cin, cout, kernel_cores)

    def p2p_copy_fraction(self) -> float:
        return 1.0


@DATA_PATHS.register(DataPath.jit_register)
class JitRegister(DataPathModel):
    @dataclass(frozen=True)
    class Config(DataPathModel.Config):
        jit_cache_match: JitMatch  # how the registration cache matches buffers

    registration = RegistrationMechanism.jit
    config: JitRegister.Config

    def registrar(self, cost: RegistrationCost, peers: int) -> Registrar:
        return JitRegistrationCache(cost, peers, match=self.config.jit_cache_match)


@DATA_PATHS.register(DataPath.on_alloc)
class OnAlloc(DataPathModel):
    registration = RegistrationMechanism.on_alloc
    cost_depends_on_mapping = True  # a remap just before use can leave registration exposed

    def registrar(self, cost: RegistrationCost, peers: int) -> Registrar:
        return RegistrationOnAllocation(cost, peers)


@DATA_PATHS.register(DataPath.pool)
class Pool(DataPathModel):
    @dataclass(frozen=True)
    class Config(DataPathModel.Config):
        pool_GB: float  # the pre-registered pool

    forces_expandable_segments_off = True
    config: Pool.Config

    def pool_bytes(self) -> float:
        return self.config.pool_GB * 1e9
