"""Chrome / Perfetto trace (JSON) of simulated timelines.

Layout, per library and shown rank (one Chrome *process* each):
- one thread lane per trace stream (compute, comm, …) with every op as a slice; a communication
  op's phases (register / launch / copy / sync / wire) are nested child slices when the replay
  recorded them (`simulate(..., utilisation=True)`), else its time split is in the slice's args;
- engine lanes: "SDMA engines" (phases whose bytes the DMA engines move) and "comm cores"
  (phases holding vector cores for a communication kernel), several lanes when they overlap;
- flow arrows ("s"/"f" pairs, one id per pair) chain the slices of one collective across its
  shown ranks, and point from sender to receiver for p2p ops.
With a utilisation series, a per-library "fabric utilisation" process carries counter tracks
(ports, HBM, cores, SDMA; mean over the dies in use). Everything shares one event budget so the
file stays openable: op slices come first, then flows, phases, engine lanes and counters.

What the file holds is said in it: `otherData.timeline_of` (the workload's `timeline_label`, e.g.
"one decode iteration … not the run", or a generic one naming the trace) and `otherData.traces`
(per library: the trace's meta, ops, ranks, shown ranks, simulated span), and a first process
"timeline of: …" whose one slice spans the replay, so the Perfetto UI shows it on opening.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stratacl.engine.replay import SimResult
from stratacl.machine.fabric import PORTS
from stratacl.machine.phases import CATEGORIES
from stratacl.trace import Op, Trace
from stratacl.vocab import OpKind

MAX_EVENTS = 200_000  # keep files openable in the Perfetto UI
RANK_PID = 1_000_000  # pid = library index × RANK_PID + rank
COUNTER_PID = RANK_PID - 1  # per-library utilisation process (above any rank id)
ENGINE_TID = {"sdma": 10_000, "cores": 20_000}  # + lane index; stream lanes are 0, 1, …
ENGINE_NAME = {"sdma": "SDMA engines", "cores": "comm cores (vector)"}
ABOUT_PID = RANK_PID - 2  # the "timeline of: …" process, sorted first
COUNTER_GROUPS = {"ports": PORTS, "hbm": ("hbm",),
                  "cores": ("vec", "cube"), "sdma": ("sdma",)}


@dataclass
class _Budget:
    left: int
    dropped: int = 0

    def take(self, n: int = 1) -> bool:
        if self.left < n:
            self.dropped += n
            return False
        self.left -= n
        return True


def describe(runs: dict[str, tuple[Trace, SimResult]]) -> str:
    """What a timeline of these replays shows when the workload does not say (`timeline_label`)."""
    trace = next(iter(runs.values()))[0]
    meta = ", ".join(f"{k}={v}" for k, v in trace.meta.items() if isinstance(v, str | int | float | bool))
    return (f"one trace replayed once per library ({len(trace.ops)} ops on {trace.world_size} ranks"
            f"{'; ' + meta if meta else ''}), as the workload chose it for its timeline")


def chrome_trace(runs: dict[str, tuple[Trace, SimResult]], max_ranks: int,
                 max_events: int = MAX_EVENTS, label: str = "") -> dict[str, Any]:
    budget = _Budget(max_events)
    label = label or describe(runs)
    span = max(float(res.makespan_s) for _, res in runs.values())
    meta: list[dict[str, Any]] = [  # first: what this file is
        {"ph": "M", "name": "process_name", "pid": ABOUT_PID, "args": {"name": f"timeline of: {label}"}},
        {"ph": "M", "name": "process_sort_index", "pid": ABOUT_PID, "args": {"sort_index": -2}}]
    if budget.take():
        meta.append({"ph": "X", "name": label, "cat": "about", "pid": ABOUT_PID, "tid": 0, "ts": 0.0,
                     "dur": _dur(0.0, span)})
    slices: list[dict[str, Any]] = []
    details: list[list[dict[str, Any]]] = []  # per library: flows, phases, engines, counters (lower priority)
    shown_by_lib = {}
    next_id = [0]
    for li, (lib, (trace, res)) in enumerate(runs.items()):
        shown = shown_by_lib[lib] = _shown_ranks(trace, max_ranks)
        streams: dict[str, int] = {}
        shown_set = set(shown)
        for op in trace.ops:
            ranks = [r for r in op.ranks if r in shown_set]
            tid = streams.setdefault(op.stream, len(streams))
            for r in ranks:
                if budget.take():
                    slices.append(_op_slice(op, res, li * RANK_PID + r, tid))
        for r in shown:
            pid = li * RANK_PID + r
            meta += [{"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"{lib} · rank {r}"}},
                     {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}}]
            meta += _thread_names(pid, {name: f"stream {name}" for name in streams}, streams)
    for li, (lib, (trace, res)) in enumerate(runs.items()):
        details.append(_details(li, lib, trace, res, shown_by_lib[lib], budget, meta, next_id))
    events = meta + slices + [e for d in details for e in d]
    other: dict[str, Any] = {"timeline_of": label, "traces": {
        lib: {"meta": json.loads(json.dumps(trace.meta, default=str)), "ops": len(trace.ops),
              "ranks": trace.world_size, "shown_ranks": shown_by_lib[lib], "span_s": float(res.makespan_s)}
        for lib, (trace, res) in runs.items()}}
    if budget.dropped:
        other.update(dropped_events=budget.dropped, max_events=max_events)
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": other}


def _op_slice(op: Op, res: SimResult, pid: int, tid: int) -> dict[str, Any]:
    start, end = float(res.start[op.id]), float(res.end[op.id])
    args: dict[str, object] = {"op": op.id, "kind": op.kind, "ranks": len(op.ranks),
                               "wire_bytes": float(res.wire_bytes[op.id]), "copy_bytes": float(res.copy_bytes[op.id])}
    if op.coll:
        args.update(coll=op.coll, comm=op.comm)
    for cat in CATEGORIES:
        v = float(res.split[cat][op.id])
        if v > 0:
            args[f"{cat}_us"] = round(v * 1e6, 3)
    return {"ph": "X", "name": op.name or op.kind, "cat": op.kind, "pid": pid, "tid": tid, "ts": _us(start),
            "dur": _dur(start, end), "args": args}


def _us(t: float) -> float:
    """Seconds -> µs rounded to whole ns, so children computed the same way nest exactly."""
    return round(t * 1e9) / 1e3


def _dur(t0: float, t1: float) -> float:
    return max(0.0, round(round(t1 * 1e9) - round(t0 * 1e9)) / 1e3)


def _details(li: int, lib: str, trace: Trace, res: SimResult, shown: list[int], budget: _Budget,
             meta: list[dict[str, Any]], next_id: list[int]) -> list[dict[str, Any]]:
    shown_set = set(shown)
    tids: dict[str, int] = {}
    for op in trace.ops:
        tids.setdefault(op.stream, len(tids))
    out = _flows(li, trace, res, shown_set, tids, budget, next_id)
    if res.phases is not None and len(res.phases):
        out += _phase_slices(li, trace, res.phases, shown_set, tids, budget)
        lanes, engine_events = _engine_slices(li, trace, res.phases, shown_set, budget)
        out += engine_events
        for (r, engine), n in lanes.items():
            names = {f"{engine}#{k}": ENGINE_NAME[engine] + (f" #{k + 1}" if k else "") for k in range(n)}
            ids = {f"{engine}#{k}": ENGINE_TID[engine] + k for k in range(n)}
            meta += _thread_names(li * RANK_PID + r, names, ids)
    if res.utilisation is not None and len(res.utilisation):
        pid = li * RANK_PID + COUNTER_PID
        meta += [{"ph": "M", "name": "process_name", "pid": pid,
                  "args": {"name": f"{lib} · fabric utilisation (mean over dies)"}},
                 {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": li * RANK_PID - 1}}]
        out += _counters(pid, res.utilisation, budget)
    return out


def _flows(li: int, trace: Trace, res: SimResult, shown: set[int], tids: dict[str, int],
           budget: _Budget, next_id: list[int]) -> list[dict[str, Any]]:
    """Arrows binding one op's slices on different ranks (`next_id`: file-wide id counter)."""
    out: list[dict[str, Any]] = []
    for op in trace.ops:
        if op.kind == OpKind.collective:
            ranks = sorted(r for r in set(op.ranks) if r in shown)
            pairs = list(zip(ranks, ranks[1:], strict=False))
        elif op.kind == OpKind.p2p:
            pairs = [(s, d) for s, d in zip(op.src, op.dst, strict=True) if s in shown and d in shown]
        else:
            continue
        if not pairs or not budget.take(2 * len(pairs)):
            continue
        mid = _us((float(res.start[op.id]) + float(res.end[op.id])) / 2)  # inside every member's slice
        tid = tids[op.stream]
        name = op.coll or op.kind
        for a, b in pairs:
            fid = next_id[0] = next_id[0] + 1
            out.append({"ph": "s", "id": fid, "name": name, "cat": "flow", "pid": li * RANK_PID + a,
                        "tid": tid, "ts": mid})
            out.append({"ph": "f", "bp": "e", "id": fid, "name": name, "cat": "flow",
                        "pid": li * RANK_PID + b, "tid": tid, "ts": mid})
    return out


def _phase_slices(li: int, trace: Trace, phases: pd.DataFrame, shown: set[int], tids: dict[str, int],
                  budget: _Budget) -> list[dict[str, Any]]:
    """Phases of communication ops as children of the op's slice (clamped into it)."""
    out: list[dict[str, Any]] = []
    ops = trace.ops
    for op_id, cat, t0, t1 in zip(phases["op"], phases["category"], phases["start_s"], phases["end_s"],
                                  strict=True):
        op = ops[int(op_id)]
        if op.kind == OpKind.compute:
            continue  # one compute phase = the op itself
        ranks = [r for r in op.ranks if r in shown]
        if not ranks or not budget.take(len(ranks)):
            continue
        ts, dur = _us(t0), _dur(t0, t1)
        for r in ranks:
            out.append({"ph": "X", "name": cat, "cat": "phase", "pid": li * RANK_PID + r,
                        "tid": tids[op.stream], "ts": ts, "dur": dur, "args": {"op": int(op_id)}})
    return out


def _engine_slices(li: int, trace: Trace, phases: pd.DataFrame, shown: set[int],
                   budget: _Budget) -> tuple[dict[tuple[int, str], int], list[dict[str, Any]]]:
    """Phases driving DMA engines or comm cores, on per-rank engine lanes; overlapping intervals on
    one rank go to extra lanes (greedy by start time) so slices never partially overlap."""
    eng = phases[phases["engine"] != ""].sort_values(["start_s", "op"], kind="stable")
    lane_end: dict[tuple[int, str], list[float]] = defaultdict(list)
    out: list[dict[str, Any]] = []
    for op_id, cat, t0, t1, engine in zip(eng["op"], eng["category"], eng["start_s"], eng["end_s"],
                                          eng["engine"], strict=True):
        op = trace.ops[int(op_id)]
        members = op.src if op.kind == OpKind.p2p else op.ranks  # a p2p's sender drives the engines
        ranks = sorted(r for r in set(members) if r in shown)
        if not ranks or not budget.take(len(ranks)):
            continue
        for r in ranks:
            ends = lane_end[(r, engine)]
            k = next((k for k, e in enumerate(ends) if e <= t0), len(ends))
            if k == len(ends):
                ends.append(t1)
            else:
                ends[k] = t1
            out.append({"ph": "X", "name": f"{op.name or op.kind} · {cat}", "cat": engine,
                        "pid": li * RANK_PID + r, "tid": ENGINE_TID[engine] + k, "ts": _us(t0),
                        "dur": _dur(t0, t1), "args": {"op": int(op_id)}})
    return {key: len(ends) for key, ends in lane_end.items()}, out


def _counters(pid: int, util: pd.DataFrame, budget: _Budget) -> list[dict[str, Any]]:
    """One counter track per resource group; a sample wherever a member changes."""
    wide = util.pivot_table(index="time_s", columns="resource", values="utilisation", observed=True)
    wide = wide.sort_index().ffill().fillna(0.0)
    out: list[dict[str, Any]] = []
    for group, members in COUNTER_GROUPS.items():
        cols = [c for c in members if c in wide.columns and wide[c].max() > 0]
        if not cols:
            continue
        sub = wide[cols]
        changed = np.ones(len(sub), dtype=bool)
        changed[1:] = (sub.diff().abs().to_numpy()[1:] > 1e-12).any(axis=1)
        sub = sub[changed]
        if not budget.take(len(sub)):
            continue
        for t, row in zip(sub.index, sub.to_numpy(), strict=True):
            out.append({"ph": "C", "name": f"{group} utilisation", "pid": pid, "ts": _us(float(t)),
                        "args": {c: round(float(v), 6) for c, v in zip(cols, row, strict=True)}})
    return out


def _thread_names(pid: int, names: dict[str, str], tids: dict[str, int]) -> list[dict[str, Any]]:
    out = []
    for key, tid in tids.items():
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": names[key]}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    return out


def _shown_ranks(trace: Trace, max_ranks: int) -> list[int]:
    used = sorted({r for op in trace.ops for r in op.ranks}) if len(trace.ops) < 50_000 else \
        list(range(trace.world_size))
    if len(used) <= max_ranks:
        return used
    idx = np.linspace(0, len(used) - 1, max_ranks).round().astype(int)
    return sorted({used[i] for i in idx})


def interval_timeline(intervals: pd.DataFrame, label: str, max_events: int = MAX_EVENTS) -> dict[str, Any]:
    """A run-level Chrome trace from tidy intervals (columns library, track, name, start_s, end_s;
    every other column goes to the slice's args): one process per (library, track), overlapping
    intervals of a track on extra lanes (greedy by start), so e.g. a serving run's iterations per
    instance and its requests show over the whole run. Events past `max_events` are dropped (the
    count is in otherData)."""
    budget = _Budget(max_events)
    events: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": ABOUT_PID, "args": {"name": f"timeline of: {label}"}},
                          {"ph": "M", "name": "process_sort_index", "pid": ABOUT_PID, "args": {"sort_index": -2}}]
    extra = [c for c in intervals.columns if c not in ("library", "track", "name", "start_s", "end_s")]
    df = intervals.sort_values(["library", "track", "start_s"], kind="stable")
    df = df[df["end_s"].notna() & df["start_s"].notna()]
    for pid, ((lib, track), sub) in enumerate(df.groupby(["library", "track"], sort=False)):
        events += [{"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"{lib} · {track}"}},
                   {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}}]
        lane_end: list[float] = []
        starts, ends = sub["start_s"].to_numpy(dtype=float).tolist(), sub["end_s"].to_numpy(dtype=float).tolist()
        for row, t0, t1 in zip(sub.itertuples(index=False), starts, ends, strict=True):
            k = next((k for k, e in enumerate(lane_end) if e <= t0), len(lane_end))
            lane_end[k:k + 1] = [t1]
            if budget.take():
                args = {c: v for c in extra if (v := _plain(getattr(row, c))) is not None}
                events.append({"ph": "X", "name": str(row.name), "cat": str(track), "pid": pid, "tid": k,
                               "ts": _us(t0), "dur": _dur(t0, t1), "args": args})
    other: dict[str, Any] = {"timeline_of": label}
    if budget.dropped:
        other.update(dropped_events=budget.dropped, max_events=max_events)
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def _plain(v: object) -> object:
    """A JSON value: numpy scalars as Python ones, NaN as null."""
    v = v.item() if hasattr(v, "item") else v
    return None if isinstance(v, float) and v != v else v


def write_timeline(path: Path, runs: dict[str, tuple[Trace, SimResult]], max_ranks: int,
                   label: str = "") -> None:
    path.write_text(json.dumps(chrome_trace(runs, max_ranks, label=label)))
