"""What moves the bytes: one class per `Mover`, registered in `MOVERS` by name, chosen after the expansion
mode resolves it (`stratacl.config.resolved_mover`: HCCL's AI_CPU mode = SDMA with the AI CPU
trigger, AIV = vector cores).

- `vector_cores`: the comm kernel holds `comm_cores` vector cores (on GPUs SMs: NCCL's channels,
  one CTA each; DeepEP's `num_sms`) while it moves data — the transfer, which cannot finish before
  the cores' makespan under the library's partitioning (partition.py), and in-kernel staging
  copies on the same cores; its synchronised steps before the transfer are a delay that holds none
  (a simplification for speed). Compute kernels beside it run on the rest (stratacl/machine/compute.py).
- `sdma`: DMA engines move the data; cores are held only while a device trigger writes
  descriptors (sdma.py); an AI CPU / host trigger holds none. Staging copies are SDMA memcpy tasks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stratacl.comm import algorithms as alg
from stratacl.comm import sdma
from stratacl.comm.context import CommContext
from stratacl.comm.mechanism import Mechanism
from stratacl.comm.registry import Registry
from stratacl.config import TIER_ORDER, Mover, OneSided, Trigger
from stratacl.machine.fabric import R
from stratacl.machine.phases import Phase, delay

Loads = list[tuple[str, int, float]]
Holds = tuple[tuple[str, int, float], ...]


class MoverModel(Mechanism, ABC):
    def __init__(self, ctx: CommContext, trigger: Trigger, config: Any) -> None:
        self.ctx = ctx
        self.trigger = trigger
        self.config = config

    @abstractmethod
    def copy_resources(self, nbytes: float, cores: int | None) -> tuple[Holds, Holds]:
        """(extra loads, holds) of a staging copy of `nbytes` besides its HBM traffic."""

    @abstractmethod
    def transfer(self, plan: alg.WirePlan, loads: Loads, cores: int | None, phases: list[Phase],
                 sync_s: float, agent_running: bool) -> tuple[Holds, float]:
        """Append what precedes the wire phase (start-up, the algorithm's synchronised steps
        `sync_s`) to `phases` and the mover's own loads to `loads`; return the wire phase's holds
        and the least time it takes."""


MOVERS: Registry[type[MoverModel]] = Registry("mover")


@MOVERS.register(Mover.vector_cores)
class VectorCores(MoverModel):
    def copy_resources(self, nbytes: float, cores: int | None) -> tuple[Holds, Holds]:
        return (), self.ctx.core_holds(self.ctx.kernel_cores(cores))

    def transfer(self, plan: alg.WirePlan, loads: Loads, cores: int | None, phases: list[Phase],
                 sync_s: float, agent_running: bool) -> tuple[Holds, float]:
        ctx = self.ctx
        # the synchronised steps stay a pure delay: holding the cores through them too (the kernel
        # spins on its peers' flags) would cost every such op one more fluid activity and solve
        phases += delay("sync", sync_s)
        return ctx.core_holds(ctx.kernel_cores(cores)), ctx.core_schedule(plan, cores).makespan_s


@MOVERS.register(Mover.sdma)
class Sdma(MoverModel):
    @dataclass(frozen=True)
    class Config:
        sdma_submit_cores: int  # device trigger: vector cores that write the descriptors
        unit_KiB: Mapping[str, float]  # descriptor size per tier
        p2p_op: OneSided  # a point-to-point transfer puts or gets; collectives always put

    config: Sdma.Config

    def copy_resources(self, nbytes: float, cores: int | None) -> tuple[Holds, Holds]:
        return (("all", R["sdma"], nbytes / self.ctx.fabric.sdma_Bps),), ()

    def transfer(self, plan: alg.WirePlan, loads: Loads, cores: int | None, phases: list[Phase],
                 sync_s: float, agent_running: bool) -> tuple[Holds, float]:
        """The SDMA start (trigger launch, every agent's first descriptor, engine start-up) and the
        algorithm's synchronised steps; the wire phase then holds the writing cores while the
        remaining descriptors are written (the transfer cannot end before them).

        Device trigger (StrataCL §4.4): a step's readiness flags come first, then the vector cores
        write that step's descriptors, holding the cores while they write — fully until their first
        doorbells, then (a fluid average) over the engine start-up and the transfer. AI CPU / host
        triggers (HCCL's AI_CPU expansion) queue the tasks ahead: writing overlaps the steps, and
        holds no AI core. `agent_running`: a later stage of a hierarchical plan, whose submitting
        agent is already launched.
        """
        ctx, fab, own = self.ctx, self.ctx.fabric, self.config
        loads.append(("all", R["sdma"], max(plan.send_bytes, plan.recv_bytes) / fab.sdma_Bps))
        trig = self.trigger.value
        units = {t: own.unit_KiB[name] * 1024 for t, name in enumerate(TIER_ORDER) if name in own.unit_KiB}
        sub = sdma.submission(plan, fab, trig, min(own.sdma_submit_cores, ctx.kernel_cores(cores)), units)
        start = (0.0 if agent_running else fab.sdma_launch_s[trig]) + sub.first_s + fab.sdma_startup_s
        during = min(sub.rest_s, fab.sdma_startup_s)  # the agents go on writing while engines start
        rest = sub.rest_s - during
        # the engines cannot beat their queues' in-flight windows (sdma.window_s)
        window = sdma.window_s(plan, fab, own.p2p_op.value if plan.algorithm == "p2p" else OneSided.put.value, units, sub.agents)
        if self.trigger == Trigger.device:
            phases += delay("sync", sync_s)
            if start > 0:  # (a zero-length activity would have nothing to integrate)
                frac = (sub.first_s + during) / start
                phases.append(Phase("launch", holds=ctx.core_holds(sub.agents, frac), min_time_s=start))
            if rest <= 0:
                return (), window
            wire_s = max(s for _, _, s in loads)
            return ctx.core_holds(sub.agents, min(1.0, rest / wire_s) if wire_s > 0 else 1.0), max(rest, window)
        phases += delay("launch", start) + delay("sync", sync_s)
        rest = max(rest - min(rest, sync_s), 0.0)
        if self.trigger == Trigger.host and rest > 0:
            # one host submission path per die: concurrent host-issued operators share it
            loads.append(("all", R["submit"], rest))
        return (), max(rest, window)

