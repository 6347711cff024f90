"""The communicators a workload creates on one die, as it declares them to the library.

A communicator holds library memory (HCCL: two buffers of its buffer size, REFERENCE §3) whatever
traffic it carries; the library model decides how much (`LibraryModel.communicator_buffer_bytes`).
The workload says which communicators a rank is in, the buffer size its framework asks for (or
none: the library's process-wide default, HCCL_BUFFSIZE), and, for a communicator that carries the
fused MoE dispatch/combine, the shape its windows must hold.
"""

from __future__ import annotations

from dataclasses import dataclass

from stratacl.errors import ConfigError


@dataclass(frozen=True)
class MoeWindows:
    """What a fused MoE dispatch/combine on a communicator must be able to hold at worst:
    `max_tokens` tokens sent per rank (the operator's maxBs), `top_k` experts per token,
    `local_experts` routed experts per rank, `shared_experts` per token, `hidden` size."""

    max_tokens: int
    hidden: int
    top_k: int
    local_experts: int
    shared_experts: int = 0

    def __post_init__(self) -> None:
        for name in ("max_tokens", "hidden", "top_k", "local_experts"):
            if getattr(self, name) < 1:
                raise ConfigError(f"moe_windows.{name}", f"must be >= 1, got {getattr(self, name)}")
        if self.shared_experts < 0:
            raise ConfigError("moe_windows.shared_experts", f"must be >= 0, got {self.shared_experts}")


@dataclass(frozen=True)
class Communicator:
    """One communicator a rank belongs to: `name` (world, ep, dp, tp, pd, ...), its size, the
    buffer size (MiB) the framework configures for it (None: the process-wide default), and the
    MoE windows it must hold if the fused dispatch/combine runs on it."""

    name: str
    ranks: int
    buffer_MiB: float | None = None
    moe: MoeWindows | None = None

    def __post_init__(self) -> None:
        if self.ranks < 1:
            raise ConfigError(f"communicator.{self.name}", f"needs >= 1 rank, got {self.ranks}")
        if self.buffer_MiB is not None and self.buffer_MiB < 0:
            raise ConfigError(f"communicator.{self.name}", f"buffer size {self.buffer_MiB} MiB < 0")
