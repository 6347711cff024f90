"""Replay of a trace on a fabric with one library model, driven by simpy (docs/architecture.md).

An op starts when its explicit dependencies, the previous op on each of its ranks' streams and, for
a collective, the previous collective on its communicator have ended (engine/order.py: libraries
run one communicator's operations in issue order); for a collective that is also the rendezvous of
its communicator. It then runs its phases in order. Delay phases are simpy timeouts; resource phases are fluid activities whose rates the
FluidSystem recomputes when any activity starts or ends. Each op is one set of events however many
ranks it spans.
"""

from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import simpy

from stratacl.engine.accounting import Exposure, exposure
from stratacl.engine.admission import Admission
from stratacl.engine.fluid import Activity, FluidSystem
from stratacl.engine.order import op_predecessors
from stratacl.engine.utilisation import UtilisationRecorder
from stratacl.errors import TraceError
from stratacl.machine.compute import ComputeLowering
from stratacl.machine.fabric import R
from stratacl.machine.lowering import CommLowering
from stratacl.machine.phases import CATEGORIES, TRAFFIC, Phase
from stratacl.trace import Trace
from stratacl.vocab import HostPeer, OpKind


@dataclass
class SimResult:
    library: str
    makespan_s: float
    start: np.ndarray
    end: np.ndarray
    split: dict[str, np.ndarray]  # seconds per phase category per op
    wire_bytes: np.ndarray
    hbm_bytes: np.ndarray
    copy_bytes: np.ndarray
    core_s: np.ndarray  # vector-core-seconds held by the op (communication kernels)
    wall_s: float = 0.0
    events: int = 0
    solves: int = 0
    work_error: float = 0.0  # max |∫rate − 1| over fluid activities (conservation)
    max_violation: float = 0.0  # worst capacity excess (check mode only)
    kinds: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=object))  # op kind per op
    algorithm: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=object))  # comm ops: chosen
    core_spread: np.ndarray = field(default_factory=lambda: np.empty(0))  # comm ops: core spread (else nan)
    # opt-in (utilisation=True): tidy (time_s, resource, utilisation) and phase intervals per op
    utilisation: pd.DataFrame | None = None
    phases: pd.DataFrame | None = None

    def exposure(self, window: tuple[float, float] | None = None, ops: np.ndarray | None = None,
                 while_ops: np.ndarray | None = None) -> Exposure:
        """Compute / exposed communication / communication split (engine/accounting.py)."""
        return exposure(self.start, self.end, self.kinds, self.split, self.core_s, window, ops, while_ops)

    def op_frame(self, trace: Trace) -> pd.DataFrame:
        """Per-op timeline: start, end, ranks, bytes and the time split by category."""
        df = pd.DataFrame({
            "op": np.arange(len(trace.ops)),
            "name": [op.name for op in trace.ops],
            "kind": [op.kind for op in trace.ops],
            "coll": [op.coll for op in trace.ops],
            "stream": [op.stream for op in trace.ops],
            "n_ranks": [len(op.ranks) for op in trace.ops],
            "start_s": self.start,
            "end_s": self.end,
            "wire_bytes": self.wire_bytes,
            "hbm_bytes": self.hbm_bytes,
            "copy_bytes": self.copy_bytes,
            "vector_core_s": self.core_s,
            "algorithm": self.algorithm,
            "core_spread": self.core_spread,
        })
        for cat in CATEGORIES:
            df[f"{cat}_s"] = self.split[cat]
        df["library"] = self.library
        return df


COMM_MODES = ("as_is", "none", "delays")


def _as_delay(phases: list[Phase]) -> Phase:
    """An op's phases as one merged delay (`Phase.parts`, each part in its category) of their
    standalone times: one event, and the same split as phase-by-phase delays."""
    parts = [part for p in phases for part in (p.parts or ((p.category, p.standalone_s()),))]
    return Phase(phases[0].category, delay_s=sum(sec for _, sec in parts), parts=tuple(parts),
                 wire_bytes=sum(p.wire_bytes for p in phases), hbm_bytes=sum(p.hbm_bytes for p in phases),
                 copy_bytes=sum(p.copy_bytes for p in phases))


class Replay:
    """`comm` picks how communication ops run: `as_is`; `none` (each ends at once, no operator slot:
    the compute critical path with the library's core limits kept); `delays` (each phase a plain
    delay of its standalone time in its category: no port, HBM or core sharing with anything).
    The last two are the counterfactuals of engine/counterfactual.py."""

    def __init__(self, trace: Trace, library: CommLowering, check: bool = False,
                 record_utilisation: bool = False, comm: str = "as_is") -> None:
        if comm not in COMM_MODES:
            raise ValueError(f"comm={comm!r}: one of {COMM_MODES}")
        self.comm = comm
        self.trace = trace
        self.library = library
        self.fabric = library.fabric
        self.check = check
        self.record_utilisation = record_utilisation
        if trace.world_size > self.fabric.world:
            raise TraceError(f"trace needs {trace.world_size} ranks but fabric '{self.fabric.name}' "
                             f"has {self.fabric.world} dies")

    def run(self) -> SimResult:
        # The replay makes no reference cycles per event (the fluid system drops each activity's
        # callback before calling it), so the cyclic collector only re-scans the trace and the
        # caches, over and over: it is paused while the replay runs (≈ 10 % of its time).
        paused = gc.isenabled()
        gc.disable()
        try:
            return self._run()
        finally:
            if paused:
                gc.enable()

    def _run(self) -> SimResult:
        t0 = time.perf_counter()
        trace = self.trace
        n = len(trace.ops)
        preds = op_predecessors(trace)
        self._waiting = [len(p) for p in preds]
        self._succ: list[list[int]] = [[] for _ in range(n)]
        for i, p in enumerate(preds):
            for j in p:
                self._succ[j].append(i)
        self.env = simpy.Environment()
        self.fluid = FluidSystem(self.env, check=self.check)
        self.runtime = self.library.runtime(trace)
        self.compute = ComputeLowering(self.fabric, self.library.core_limits(trace))
        # the library's bound on its operators in flight (a test double may not state one)
        conc = getattr(self.library, "op_concurrency", lambda: None)()
        self._admission = Admission(conc, trace.world_size) if conc is not None else None
        self._ready_at: dict[int, float] = {}  # comm ops that waited for an admission slot
        self._rec = self.fluid.recorder = self._recorder() if self.record_utilisation else None
        # per-op results as lists while running (numpy item updates cost more), arrays at the end
        self._start = [math.nan] * n
        self._end = [math.nan] * n
        self._split = {c: [0.0] * n for c in CATEGORIES}
        self._wire = [0.0] * n
        self._hbm = [0.0] * n
        self._copy = [0.0] * n
        self._core_s = [0.0] * n
        self._algo = [""] * n  # the library's choices per comm op, kept at lowering
        self._spread = [math.nan] * n
        self._vec = R["vec"]
        self._hbm_kind = R["hbm"]
        self._work_err = 0.0
        self._events = 0
        self._role_cache: list[dict[str, int] | None] = [None] * n
        self._by_tuple: dict[tuple[int, ...], int] = {}
        self._node_cache: dict[tuple[int, ...], tuple[int, ...]] = {}
        # collect first: an op with no phases ends at once and may release later roots
        for i in [i for i in range(n) if self._waiting[i] == 0]:
            self._ready_op(i)
        self.env.run()
        end = np.asarray(self._end, dtype=float)
        if np.isnan(end).any():
            stuck = int(np.flatnonzero(np.isnan(end))[0])
            raise TraceError(f"{trace.ops[stuck].label()} never finished (deadlock)")
        result = SimResult(
            library=self.library.name, makespan_s=float(end.max(initial=0.0)),
            start=np.asarray(self._start, dtype=float), end=end,
            split={c: np.asarray(v, dtype=float) for c, v in self._split.items()},
            wire_bytes=np.asarray(self._wire, dtype=float), hbm_bytes=np.asarray(self._hbm, dtype=float),
            copy_bytes=np.asarray(self._copy, dtype=float), core_s=np.asarray(self._core_s, dtype=float),
            wall_s=time.perf_counter() - t0,
            events=self._events, solves=self.fluid.solves, work_error=self._work_err,
            max_violation=self.fluid.max_violation, kinds=np.array([op.kind for op in trace.ops], dtype=object))
        result.algorithm = np.array(self._algo, dtype=object)
        result.core_spread = np.asarray(self._spread, dtype=float)
        if self._rec is not None:
            self._rec.finish(result.makespan_s)
            result.utilisation, result.phases = self._rec.frame(), self._rec.phase_frame()
        return result

    def _recorder(self) -> UtilisationRecorder:
        dies = sorted({r for op in self.trace.ops for r in op.ranks})
        nodes = self.trace.world_size // self.fabric.dies_per_node + 1
        extra = nodes + 1 + nodes * self.fabric.host.cpus_per_node  # node and CPU pseudo-dies
        return UtilisationRecorder(self.fluid, self.trace.world_size + extra, np.asarray(dies, dtype=np.int64))

    # ------------------------------------------------------------------ op lifecycle
    def _ready_op(self, i: int) -> None:
        """Dependencies met: start, unless the library has no free operator slot on its dies yet."""
        adm = self._admission
        op = self.trace.ops[i]
        if self.comm == "none" and op.kind not in ComputeLowering.KINDS:
            self._start[i] = self.env.now
            self._finish_op(i)
            return
        if adm is not None and op.kind not in ComputeLowering.KINDS and not adm.admit(i, op.ranks):
            self._ready_at[i] = self.env.now
            return
        self._start_op(i)

    def _start_op(self, i: int) -> None:
        op = self.trace.ops[i]
        now = self.env.now
        ready = self._ready_at.pop(i, now)
        self._start[i] = ready
        if now > ready:  # waited for an AI CPU / AIV slot: the operator's launch is late by that much
            self._split["launch"][i] += now - ready
            if self._rec is not None:  # phase index -1: the wait before the op's own phases
                self._rec.phase(i, -1, Phase("launch", now - ready), ready, now)
        self.runtime.observe_start(op, now)
        if op.kind in ComputeLowering.KINDS:
            phases = self.compute.lower(op)
        else:
            phases, info = self.runtime.lower_with_info(op, now)
            self._algo[i], self._spread[i] = info.algorithm, info.core_spread
            if self.comm == "delays":  # one merged delay: each phase's time on an idle fabric, bytes kept
                phases = [_as_delay(phases)] if phases else []
        wire = hbm = copy = 0.0
        for p in phases:
            wire += p.wire_bytes
            hbm += p.hbm_bytes
            copy += p.copy_bytes
        self._wire[i], self._hbm[i], self._copy[i] = wire, hbm, copy
        self._run_phase(i, phases, 0)

    def _run_phase(self, i: int, phases: list[Phase], k: int) -> None:
        if k == len(phases):
            self._finish_op(i)
            return
        self._events += 1
        ph = phases[k]
        t0 = self.env.now
        if not ph.loads and not ph.holds:  # ph.is_delay
            ev = self.env.timeout(ph.delay_s)
            ev.callbacks.append(lambda _e: self._phase_done(i, phases, k, t0, None))
            return
        # nothing to do (e.g. a zero-cost launch that only holds cores): standalone_s() <= 0
        if ph.min_time_s <= 0 and all(s <= 0 for _, _, s in ph.loads):
            self._phase_done(i, phases, k, t0, None)
            return
        roles = self._roles(i)
        entries = [(roles[role], r, s) for role, r, s in ph.loads]
        holds = [(roles[role], r, h) for role, r, h in ph.holds]
        box: list[Activity] = []
        act = self.fluid.start(entries, holds, ph.min_time_s,
                               lambda: self._phase_done(i, phases, k, t0, box[0]),
                               stall=ph.hbm_stall, traffic=self._hbm_kind if ph.category in TRAFFIC else -1)
        box.append(act)

    def _phase_done(self, i: int, phases: list[Phase], k: int, t0: float, act: Activity | None) -> None:
        ph = phases[k]
        dt = self.env.now - t0
        if ph.parts:  # a merged delay: exact parts, each in its category
            for cat, sec in ph.parts:
                self._split[cat][i] += sec
        else:
            self._split[ph.category][i] += dt
        if ph.holds:
            vec = self._vec
            for _, r, h in ph.holds:
                if r == vec:
                    self._core_s[i] += h * dt * self.fabric.vector_cores
        if self._rec is not None:
            self._rec.phase(i, k, ph, t0, self.env.now)
        if act is not None:  # conservation, net of the float clock's resolution at this time
            clock = 8 * math.ulp(self.env.now) / act.T
            self._work_err = max(self._work_err, abs(act.work - 1.0) - clock)
        self._run_phase(i, phases, k + 1)

    def _roles(self, i: int) -> dict[str, int]:
        """Rankset ids of an op's roles (all / src / dst), interned once per distinct rank tuple."""
        roles = self._role_cache[i]
        if roles is None:
            op = self.trace.ops[i]
            roles = self._role_cache[i] = {"all": self._intern(op.ranks)}
            if op.kind == OpKind.p2p:
                roles["src"] = self._intern(op.src)
                roles["dst"] = self._intern(op.dst)
            if op.peer:  # a host transfer: the CPUs' links (stratacl/machine/compute.py lower_host)
                roles["cpu"] = self._intern(self._cpus(op.ranks, op.peer == HostPeer.pool))
            if self.fabric.switch is not None and self.fabric.switch.blocking:  # one pseudo-die per node
                roles["sw"] = self._intern(self._nodes(op.ranks))
                if op.kind == OpKind.p2p:
                    roles["sw_src"] = self._intern(self._nodes(op.src))
                    roles["sw_dst"] = self._intern(self._nodes(op.dst))
        return roles

    def _nodes(self, ranks: tuple[int, ...]) -> tuple[int, ...]:
        """Pseudo-dies (after the trace's ranks) standing for the nodes' switch port groups."""
        hit = self._node_cache.get(ranks)
        if hit is None:
            dpn, base = self.fabric.dies_per_node, self.trace.world_size
            hit = self._node_cache[ranks] = tuple(sorted({base + r // dpn for r in ranks}))
        return hit

    def _cpus(self, ranks: tuple[int, ...], pool: bool) -> tuple[int, ...]:
        """Pseudo-dies standing for host CPUs: after the trace's ranks and the node pseudo-dies."""
        base = self.trace.world_size + -(-self.trace.world_size // self.fabric.dies_per_node) + 1
        return tuple(base + c for c in self.fabric.host.cpus(ranks, pool))

    def _intern(self, ranks: tuple[int, ...]) -> int:
        hit = self._by_tuple.get(ranks)  # equal tuples (ops of one group) share the lookup
        if hit is None:
            hit = self._by_tuple[ranks] = self.fluid.rankset(tuple(sorted(set(ranks))))
        return hit

    def _finish_op(self, i: int) -> None:
        self._end[i] = self.env.now
        if self._admission is not None:
            for j in self._admission.release(i):
                self._start_op(j)
        for j in self._succ[i]:
            self._waiting[j] -= 1
            if self._waiting[j] == 0:
                self._ready_op(j)


def simulate(trace: Trace, library: CommLowering, check: bool = False, utilisation: bool = False,
             comm: str = "as_is") -> SimResult:
    return Replay(trace, library, check=check, record_utilisation=utilisation, comm=comm).run()
