"""`output.trace=true`: every trace a run replays, saved in the run directory.

`RunContext.simulate` (the one door every replay goes through) hands each (trace, library, result)
to a `TraceRecorder`. A trace is written once, when first replayed, as `traces/<name>.parquet`
(`Trace.save`); the op start/end times of every library's replay of it go to
`traces/<name>.times.parquet` (columns library, op, start_s, end_s) and one line per trace to
`traces/index.json` when the run finishes. `python -m stratacl.chakra export <run dir>` reads them
(compute nodes carry the simulated times) and `workload=replay trace=traces/<name>.parquet`
replays one again.

Names are `<sequence>_<label>`, the label built from the trace's short scalar `meta` values
(e.g. `0003_phase-decode_size-64`), so files sort in replay order.
"""

from __future__ import annotations

import json
import re
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from stratacl.errors import ConfigError, TraceError
from stratacl.trace import Trace

if TYPE_CHECKING:
    from stratacl.engine.replay import SimResult

TRACES_DIR = "traces"
INDEX = "index.json"
TIMES_SUFFIX = ".times.parquet"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def trace_label(meta: dict[str, object], limit: int = 60) -> str:
    """A file-name-safe label from a trace's short scalar meta values."""
    parts = [f"{k}-{v}" for k, v in meta.items()
             if isinstance(v, str | int | float | bool) and len(str(v)) <= 24]
    label = _UNSAFE.sub("-", "_".join(parts)).strip("-_.")
    return label[:limit].rstrip("-_.") or "trace"


@dataclass
class _Saved:
    name: str
    ops: int
    world_size: int
    meta: dict[str, object]
    times: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # library -> (start, end)
    makespan_s: dict[str, float] = field(default_factory=dict)


class TraceRecorder:
    """Writes each distinct trace once (by identity: a workload replays one object per library)."""

    def __init__(self, out_dir: Path) -> None:
        self.dir = Path(out_dir) / TRACES_DIR
        self._seen: dict[int, tuple[weakref.ref[Trace], _Saved]] = {}
        self._saved: list[_Saved] = []

    def record(self, trace: Trace, library: str, res: SimResult) -> None:
        key = id(trace)
        hit = self._seen.get(key)
        if hit is None or hit[0]() is not trace:  # a new object (an id can be reused after GC)
            saved = _Saved(f"{len(self._saved):04d}_{trace_label(trace.meta)}", len(trace.ops),
                           trace.world_size, dict(trace.meta))
            self.dir.mkdir(parents=True, exist_ok=True)
            trace.save(self.dir / f"{saved.name}.parquet")
            self._seen[key] = (weakref.ref(trace), saved)
            self._saved.append(saved)
        else:
            saved = hit[1]
        saved.times[library] = (res.start.copy(), res.end.copy())
        saved.makespan_s[library] = float(res.makespan_s)

    def close(self) -> int:
        """Write the replay times and the index; the number of traces saved."""
        if not self._saved:
            return 0
        index = []
        for s in self._saved:
            frames = [pd.DataFrame({"library": lib, "op": range(len(start)), "start_s": start, "end_s": end})
                      for lib, (start, end) in s.times.items()]
            pd.concat(frames, ignore_index=True).to_parquet(self.dir / f"{s.name}{TIMES_SUFFIX}", index=False)
            index.append({"name": s.name, "file": f"{s.name}.parquet", "times": f"{s.name}{TIMES_SUFFIX}",
                          "ops": s.ops, "world_size": s.world_size, "makespan_s": s.makespan_s,
                          "meta": s.meta})
        (self.dir / INDEX).write_text(json.dumps(index, indent=1, default=str) + "\n")
        return len(self._saved)


def saved_traces(source: Path, name: str | None = None) -> list[Path]:
    """Trace files to work on: `source` itself (a trace file), or the traces a run directory saved
    (all, or the one called `name`)."""
    source = Path(source)
    if not source.is_dir():
        if not source.is_file():
            raise ConfigError("trace", f"{source} does not exist", "give a run directory or a trace .parquet file")
        return [source]
    index = source / TRACES_DIR / INDEX
    if not index.is_file():
        raise ConfigError("trace", f"run directory {source} holds no saved traces ({TRACES_DIR}/{INDEX})",
                          "run it again with output.trace=true")
    try:
        names = [str(entry["name"]) for entry in json.loads(index.read_text())]
    except (ValueError, TypeError, KeyError) as exc:
        raise TraceError(f"{index}: not a trace index ({exc})") from None
    if name is not None:
        if name not in names:
            raise ConfigError("--trace", f"'{name}' is not among the run's traces", f"use one of {names[:8]}")
        names = [name]
    return [source / TRACES_DIR / f"{n}.parquet" for n in names]


def run_baseline(trace_file: Path) -> str | None:
    """The baseline library of the run that saved `trace_file` (its summary.json), if any."""
    summary = trace_file.parent.parent / "summary.json"
    try:
        return str(json.loads(summary.read_text())["baseline"]) if trace_file.parent.name == TRACES_DIR else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass
class ReplayTimes:
    """Op start / end times (s) of one library's replay of a saved trace (what `export_chakra`'s
    `sim` reads)."""

    library: str
    start: np.ndarray
    end: np.ndarray


def replay_times(trace_file: Path, library: str | None = None) -> ReplayTimes | None:
    """The replay times saved beside `trace_file` (`<name>.times.parquet`) for `library` (None: the
    run's baseline, else the first library replayed); None when there are none."""
    times = trace_file.with_name(trace_file.name.removesuffix(".parquet") + TIMES_SUFFIX)
    if not times.is_file():
        return None
    try:
        df = pd.read_parquet(times)
        libs = list(dict.fromkeys(df["library"]))
    except Exception as exc:  # pyarrow raises several types for damaged files
        raise TraceError(f"{times}: not readable replay times ({exc})") from None
    baseline = run_baseline(trace_file)
    lib = library or (baseline if baseline is not None and baseline in libs else str(libs[0]))
    sel = df[df["library"] == lib].sort_values("op")
    if sel.empty:
        raise ConfigError("--library", f"'{lib}' did not replay {trace_file.name}", f"use one of {libs}")
    return ReplayTimes(lib, sel["start_s"].to_numpy(), sel["end_s"].to_numpy())
