"""What a workload receives from the CLI and hands back (the run ↔ workloads contract).

A workload builds traces and asks the context to replay them once per library (`replay_all`); it
returns tidy rows and per-library metrics (names carry units). The core never imports workloads:
`run.py` looks a workload up by name (module `workloads.<name>`, function `run(ctx)`). Workloads
never import `stratacl.engine` or `stratacl.comm`: what they may ask a library is `Library` below.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pandas as pd

from stratacl.comm.library import LibraryModel
from stratacl.config import RegistrationMechanism
from stratacl.directions import CF_TERMS
from stratacl.engine.accounting import Exposure
from stratacl.engine.counterfactual import NoCommMemo, Span, Split, end_of, split
from stratacl.engine.replay import SimResult, simulate
from stratacl.machine.fabric import Fabric
from stratacl.memory import DieMemory
from stratacl.memory.communicators import Communicator
from stratacl.progress import Progress
from stratacl.run_traces import TraceRecorder
from stratacl.trace import Trace

__all__ = ["Exposure", "Library", "Span", "Split", "end_of", "RegistrationMechanism", "RunContext", "WorkloadResult", "Workload"]


class Library(Protocol):
    """The library facts a workload may use (the model lives in `stratacl.comm`)."""

    name: str
    fabric: Fabric

    def held_memory_bytes(self, communicators: int = 1, context: str = "inference") -> float:
        """HBM per rank the library keeps outside the allocator for `communicators` default-size
        communicators: comm buffers and the registered pool."""

    def communicator_buffer_bytes(self, comms: Sequence[Communicator]) -> float:
        """HBM per rank of the buffers of the communicators it is in (sized as deployments do)."""

    @property
    def pool_bytes(self) -> float:
        """HBM of the library's pre-registered pool, outside the allocator."""

    @property
    def forces_expandable_segments_off(self) -> bool:
        """Whether the library needs the device allocator's expandable segments off."""

    @property
    def user_buffer_registration(self) -> RegistrationMechanism:
        """How user buffers get registered for remote access: jit, on_alloc or none."""

    def die_memory(self, capacity_bytes: float, peers: int, *, expandable_segments: bool = True,
                   va_base: int = 1 << 40) -> DieMemory:
        """One die's allocator as the library leaves it, with its registration mechanism
        (`DieMemory.registrar`, stratacl/memory/mechanism.py) attached for `peers` peers."""

    @property
    def cost_depends_on_mapping(self) -> bool:
        """Whether remapping a user buffer changes the library's cost (registration-on-allocation)."""

    def step_graph_launch_s(self, host_syncs: int) -> float:
        """Graph launch of a step the deployment captures: the die's launch when the step holds no
        host-synchronising operator; 0 when it holds `host_syncs` > 0 (it then runs eagerly)."""



@dataclass
class RunContext:
    cfg: Any  # the typed RunConfig (workload-specific section in cfg.workload)
    fabric: Fabric
    libraries: dict[str, LibraryModel]
    baseline: str
    seed: int
    progress: Progress = field(default_factory=lambda: Progress("run", enabled=False))
    recorder: TraceRecorder | None = None  # output.trace: every replayed trace saved (run_traces.py)
    no_comm: NoCommMemo = field(default_factory=NoCommMemo)  # counterfactual compute paths, shared by libraries

    def simulate(self, trace: Trace, library: str) -> SimResult:
        """Replay `trace` with one selected library (every workload replay comes through here)."""
        res = simulate(trace, self.libraries[library])
        if self.recorder is not None:
            self.recorder.record(trace, library, res)
        return res

    @property
    def counterfactual_enabled(self) -> bool:
        """`output.counterfactual` (on unless a run turns it off)."""
        return bool(getattr(getattr(self.cfg, "output", None), "counterfactual", True))

    def counterfactual(self, trace: Trace, library: str, res: SimResult | float, span: Span | None = None) -> Split:
        """`res` (this library's replay of `trace`, or the time it measured over `span`) split by
        counterfactual replays: the compute path, exposed communication by category and contention
        (stratacl/engine/counterfactual.py) over `span` (default: the whole replay). Two more replays, not recorded; with
        `output.counterfactual=false` none, and every term is nan (the report then shows no split)."""
        if not self.counterfactual_enabled:
            return Split(math.nan, dict.fromkeys(CF_TERMS, math.nan))
        return split(trace, self.libraries[library], res, span or end_of(None), self.no_comm)

    def without_hbm_stall(self) -> RunContext:
        """The same run on a fabric whose kernels feel no loaded-memory latency from the traffic
        beside them (`fabric.die.kernel.comm_hbm_stall` = 0, stratacl/engine/interference.py): the
        counterfactual that separates that stall from the sharing of HBM bandwidth and cores.
        Its replays are not recorded (output.trace keeps the run's own)."""
        cfg = copy.deepcopy(self.fabric.cfg)
        cfg.die.kernel.comm_hbm_stall = 0.0
        fabric = Fabric(cfg)
        libs = {name: LibraryModel(name, lib.cfg, fabric) for name, lib in self.libraries.items()}
        return RunContext(self.cfg, fabric, libs, self.baseline, self.seed)

    def replay_all(self, trace: Trace, progress: bool = False) -> dict[str, SimResult]:
        """Replay the same trace once per selected library, in the run's order (advancing the
        current progress phase by one per library with `progress`)."""
        out = {}
        for lib in self.libraries:
            out[lib] = self.simulate(trace, lib)
            if progress:
                self.progress(1)
        return out


@dataclass
class WorkloadResult:
    rows: pd.DataFrame  # tidy, one row per request / iteration / size × library; has "library"
    metrics: dict[str, dict[str, float]]  # library -> metric (unit in the name) -> value
    timelines: dict[str, tuple[Trace, SimResult]] = field(default_factory=dict)  # library -> replay
    timeline_label: str = ""  # what `timelines` show (timeline.json says it); "" = described from the trace
    # the whole run as intervals (library, track, name, start_s, end_s, args…): run_timeline.json
    run_timeline: pd.DataFrame | None = None
    run_timeline_label: str = ""
    notes: list[str] = field(default_factory=list)
    table: pd.DataFrame | None = None  # side-by-side view printed at the end of a run
    extra_rows: dict[str, pd.DataFrame] = field(default_factory=dict)  # name -> <name>.parquet


class Workload(Protocol):
    def __call__(self, ctx: RunContext) -> WorkloadResult: ...
