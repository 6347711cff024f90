"""What moves the bytes: one class per `Mover`, chosen from `MOVERS` by enum after the expansion
mode resolves it (`stratacl.config.resolved_mover`: HCCL's AI_CPU mode = SDMA with the AI CPU
trigger, AIV = vector cores).

- `vector_cores`: the comm kernel holds `comm_cores` vector cores (on GPUs SMs: NCCL's channels,
  one CTA each; DeepEP's `num_sms`) while it moves data — the transfer, which cannot finish before
  the cores' makespan under the library's partitioning (partition.py), and in-kernel staging
  copies on the same cores; its synchronised steps before the transfer are a delay that holds none
  (a simplification for speed). Compute kernels beside it run on the rest (stratacl/compute.py).
- `sdma`: DMA engines move the data; cores are held only while a device trigger writes
  descriptors (sdma.py); an AI CPU / host trigger holds none. Staging copies are SDMA memcpy tasks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

from stratacl.comm import algorithms as alg
from stratacl.comm import sdma
from stratacl.config import TIER_ORDER, Mover, Trigger
from stratacl.fabric import R
from stratacl.phases import Phase, delay

if TYPE_CHECKING:
    from stratacl.comm.library import LibraryModel

Loads = list[tuple[str, int, float]]
Holds = tuple[tuple[str, int, float], ...]


class MoverModel(ABC):
    kind: ClassVar[Mover]

    def __init__(self, lib: LibraryModel, trigger: Trigger) -> None:
        self.lib = lib
        self.trigger = trigger

    @abstractmethod
    def copy_resources(self, nbytes: float, cores: int | None) -> tuple[Holds, Holds]:
        """(extra loads, holds) of a staging copy of `nbytes` besides its HBM traffic."""

    @abstractmethod
    def transfer(self, plan: alg.WirePlan, loads: Loads, cores: int | None, phases: list[Phase],
                 sync_s: float, agent_running: bool) -> tuple[Holds, float]:
        """Append what precedes the wire phase (start-up, the algorithm's synchronised steps
        `sync_s`) to `phases` and the mover's own loads to `loads`; return the wire phase's holds
        and the least time it takes."""


class VectorCores(MoverModel):
    kind = Mover.vector_cores

    def copy_resources(self, nbytes: float, cores: int | None) -> tuple[Holds, Holds]:
        return (), self.lib.core_holds(self.lib.kernel_cores(cores))

    def transfer(self, plan: alg.WirePlan, loads: Loads, cores: int | None, phases: list[Phase],
                 sync_s: float, agent_running: bool) -> tuple[Holds, float]:
        lib = self.lib
        # the synchronised steps stay a pure delay: holding the cores through them too (the kernel
        # spins on its peers' flags) would cost every such op one more fluid activity and solve
        # (+26 % solves, +46 % wall on benchmarks/bench_engine.py --library nccl)
        phases += delay("sync", sync_s)
        return lib.core_holds(lib.kernel_cores(cores)), lib.core_schedule(plan, cores).makespan_s


class Sdma(MoverModel):
    kind = Mover.sdma

    def copy_resources(self, nbytes: float, cores: int | None) -> tuple[Holds, Holds]:
        return (("all", R["sdma"], nbytes / self.lib.fabric.sdma_Bps),), ()

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
        lib, fab, cfg = self.lib, self.lib.fabric, self.lib.cfg
        loads.append(("all", R["sdma"], max(plan.send_bytes, plan.recv_bytes) / fab.sdma_Bps))
        trig = self.trigger.value
        units = {t: cfg.unit_KiB[name] * 1024 for t, name in enumerate(TIER_ORDER) if name in cfg.unit_KiB}
        sub = sdma.submission(plan, fab, trig, min(cfg.sdma_submit_cores, lib.kernel_cores(cores)), units)
        start = (0.0 if agent_running else fab.sdma_launch_s[trig]) + sub.first_s + fab.sdma_startup_s
        during = min(sub.rest_s, fab.sdma_startup_s)  # the agents go on writing while engines start
        rest = sub.rest_s - during
        if self.trigger == Trigger.device:
            phases += delay("sync", sync_s)
            if start > 0:  # (a zero-length activity would have nothing to integrate)
                frac = (sub.first_s + during) / start
                phases.append(Phase("launch", holds=lib.core_holds(sub.agents, frac), min_time_s=start))
            if rest <= 0:
                return (), 0.0
            wire_s = max(s for _, _, s in loads)
            return lib.core_holds(sub.agents, min(1.0, rest / wire_s) if wire_s > 0 else 1.0), rest
        phases += delay("launch", start) + delay("sync", sync_s)
        rest -= min(rest, sync_s)
        return (), max(rest, 0.0)


MOVERS: dict[Mover, type[MoverModel]] = {c.kind: c for c in (VectorCores, Sdma)}
