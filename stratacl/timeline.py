"""Chrome / Perfetto trace (JSON) of simulated timelines: one process per (library, rank)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from stratacl.engine.replay import SimResult
from stratacl.phases import CATEGORIES
from stratacl.trace import Trace

MAX_EVENTS = 200_000  # keep files openable in the Perfetto UI


def chrome_trace(runs: dict[str, tuple[Trace, SimResult]], max_ranks: int) -> dict:
    events: list[dict] = []
    budget = MAX_EVENTS
    for li, (lib, (trace, res)) in enumerate(runs.items()):
        shown = _shown_ranks(trace, max_ranks)
        streams: dict[str, int] = {}
        for r in shown:
            pid = li * 1_000_000 + r
            events.append({"ph": "M", "name": "process_name", "pid": pid,
                           "args": {"name": f"{lib} · rank {r}"}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}})
        shown_set = set(shown)
        for op in trace.ops:
            ranks = [r for r in op.ranks if r in shown_set]
            if not ranks:
                continue
            tid = streams.setdefault(op.stream, len(streams))
            start, end = float(res.start[op.id]), float(res.end[op.id])
            args = {"kind": op.kind, "ranks": len(op.ranks), "wire_bytes": float(res.wire_bytes[op.id]),
                    "copy_bytes": float(res.copy_bytes[op.id])}
            if op.coll:
                args.update(coll=op.coll, comm=op.comm)
            for cat in CATEGORIES:
                v = float(res.split[cat][op.id])
                if v > 0:
                    args[f"{cat}_us"] = round(v * 1e6, 3)
            for r in ranks:
                if budget <= 0:
                    break
                budget -= 1
                events.append({"ph": "X", "name": op.name or op.kind, "cat": op.kind,
                               "pid": li * 1_000_000 + r, "tid": tid, "ts": start * 1e6,
                               "dur": max(0.0, (end - start) * 1e6), "args": args})
        for name, tid in streams.items():
            for r in shown:
                events.append({"ph": "M", "name": "thread_name", "pid": li * 1_000_000 + r, "tid": tid,
                               "args": {"name": name}})
    return {"traceEvents": events, "displayTimeUnit": "ns"}


def _shown_ranks(trace: Trace, max_ranks: int) -> list[int]:
    used = sorted({r for op in trace.ops for r in op.ranks}) if len(trace.ops) < 50_000 else \
        list(range(trace.world_size))
    if len(used) <= max_ranks:
        return used
    idx = np.linspace(0, len(used) - 1, max_ranks).round().astype(int)
    return sorted({used[i] for i in idx})


def write_timeline(path: Path, runs: dict[str, tuple[Trace, SimResult]], max_ranks: int) -> None:
    path.write_text(json.dumps(chrome_trace(runs, max_ranks)))
