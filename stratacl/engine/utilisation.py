"""Opt-in recorder of resource utilisation and phase intervals during a replay.

`simulate(trace, lib, utilisation=True)` attaches a `UtilisationRecorder` to the fluid system. It
keeps, per die and resource kind (`stratacl.machine.fabric.RESOURCES`: ports per plane and direction, HBM
bandwidth, vector and cube cores, SDMA engines), the fraction of capacity in use: Σ consumption ×
rate of the active activities plus the fraction *held* (cores held by a communication kernel are
busy whatever its rate). Rates only change when the fluid system re-solves, so the state is a step
function; it is sampled once per distinct event time (many changes share a timestamp).

The aggregate per kind is the mean over the dies the trace uses of min(1, die utilisation): the
clip only matters for oversubscribed holds, which the engine time-shares. Units are the engine's:
a port's capacity is the rate its load was priced at (bytes / tier β), so for one transfer
∫ utilisation dt × dies × β = bytes moved.

`phases` records every phase interval (op, phase index, category, start, end, the engine it drives),
which the Chrome-trace writer draws as nested slices and DMA / comm-core lanes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from stratacl.machine.fabric import RESOURCES, R
from stratacl.machine.phases import Phase
from stratacl.vocab import PhaseCategory

if TYPE_CHECKING:
    from stratacl.engine.fluid import Activity, FluidSystem

PHASE_COLUMNS = ("op", "phase", "category", "start_s", "end_s", "engine")


class UtilisationRecorder:
    def __init__(self, fluid: FluidSystem, world: int, dies: np.ndarray) -> None:
        self.fluid = fluid
        self.use = np.zeros((len(RESOURCES), world))
        self.dies = np.asarray(dies, dtype=np.int64)
        self._idx: dict[int, np.ndarray] = {}  # rankset id -> die index array
        self._t = 0.0  # time from which the current state holds
        self.times: list[float] = []
        self.samples: list[np.ndarray] = []
        self.phase_rows: list[tuple[int, int, str, float, float, str]] = []  # PHASE_COLUMNS

    # ------------------------------------------------------------------ fluid hooks
    def started(self, act: Activity, now: float) -> None:
        """Holds apply from the start, whatever the rate; loads follow in `rates`."""
        self._advance(now)
        for k, t, h in act.holds:
            self.use[t, self._ranks(k)] += h

    def finished(self, act: Activity, now: float) -> None:
        self._advance(now)
        for k, t, c in act.entries:
            self.use[t, self._ranks(k)] -= c * act.f
        for k, t, h in act.holds:
            self.use[t, self._ranks(k)] -= h

    def rates(self, old: list[tuple[Activity, float]], now: float) -> None:
        self._advance(now)
        for a, f in old:
            df = a.f - f
            if df != 0.0:
                for k, t, c in a.entries:
                    self.use[t, self._ranks(k)] += c * df

    # ------------------------------------------------------------------ replay hook
    def phase(self, op: int, index: int, ph: Phase, t0: float, t1: float) -> None:
        engine = ""
        if any(r == R["sdma"] for _, r, _ in ph.loads):
            engine = "sdma"
        elif ph.category != PhaseCategory.compute and any(r == R["vec"] for _, r, _ in ph.holds):
            engine = "cores"  # a communication kernel occupying vector cores
        if ph.parts:  # a merged delay: one interval per part
            for cat, sec in ph.parts:
                self.phase_rows.append((op, index, cat, t0, min(t1, t0 + sec), engine))
                t0 += sec
            return
        self.phase_rows.append((op, index, ph.category, t0, t1, engine))

    # ------------------------------------------------------------------ results
    def finish(self, end: float) -> None:
        self._advance(end)
        self._advance(np.inf)  # closing sample at `end` (all activities are over: zeros)

    def frame(self) -> pd.DataFrame:
        """Tidy (time_s, resource, utilisation): the value holds from time_s to the resource's next
        row; a row only where the value changes."""
        if not self.times:
            return pd.DataFrame({"time_s": [], "resource": [], "utilisation": []})
        t = np.asarray(self.times)
        v = np.vstack(self.samples)  # samples × kinds
        frames = []
        for j, name in enumerate(RESOURCES):
            col = v[:, j]
            keep = np.ones(len(col), dtype=bool)
            keep[1:] = np.abs(np.diff(col)) > 1e-12
            frames.append(pd.DataFrame({"time_s": t[keep], "resource": name, "utilisation": col[keep]}))
        out = pd.concat(frames, ignore_index=True)
        out["resource"] = pd.Categorical(out["resource"], categories=list(RESOURCES))
        return out.sort_values(["resource", "time_s"], kind="stable", ignore_index=True)

    def phase_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.phase_rows, columns=list(PHASE_COLUMNS))

    # ------------------------------------------------------------------ internals
    def _ranks(self, k: int) -> np.ndarray:
        idx = self._idx.get(k)
        if idx is None:
            idx = self._idx[k] = np.asarray(self.fluid.rs_ranks[k], dtype=np.int64)
        return idx

    def _advance(self, now: float) -> None:
        """Before the first change at a new time: record the state that held since the last one."""
        if now == self._t:
            return
        self.times.append(self._t)
        if len(self.dies):
            self.samples.append(np.clip(self.use[:, self.dies], 0.0, 1.0).mean(axis=1))
        else:
            self.samples.append(np.zeros(len(RESOURCES)))
        self._t = now


def integral(frame: pd.DataFrame, resource: str, end: float | None = None) -> float:
    """∫ utilisation dt of one resource (step function) up to `end` (default: its last row)."""
    sub = frame[frame["resource"] == resource].sort_values("time_s")
    if sub.empty:
        return 0.0
    t = sub["time_s"].to_numpy()
    u = sub["utilisation"].to_numpy()
    stop = np.append(t[1:], t[-1] if end is None else max(end, t[-1]))
    return float(np.sum(u * (stop - t)))
