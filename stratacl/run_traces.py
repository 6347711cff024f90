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
from typing import Any

import pandas as pd

from stratacl.trace import Trace

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
    times: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # library -> (start, end)
    makespan_s: dict[str, float] = field(default_factory=dict)


class TraceRecorder:
    """Writes each distinct trace once (by identity: a workload replays one object per library)."""

    def __init__(self, out_dir: Path) -> None:
        self.dir = Path(out_dir) / TRACES_DIR
        self._seen: dict[int, tuple[weakref.ref, _Saved]] = {}
        self._saved: list[_Saved] = []

    def record(self, trace: Trace, library: str, res: Any) -> None:  # noqa: ANN401 - SimResult
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


def replay_times(trace_file: Path, library: str | None = None) -> tuple[str, Any, Any] | None:
    """(library, start, end) of a saved trace's replay in its run (`<name>.times.parquet` beside
    it); `library` None = the first one replayed. None when the file has no times beside it."""
    times = trace_file.with_name(trace_file.name.removesuffix(".parquet") + TIMES_SUFFIX)
    if not times.is_file():
        return None
    df = pd.read_parquet(times)
    libs = list(dict.fromkeys(df["library"]))
    lib = library if library is not None else libs[0]
    sel = df[df["library"] == lib].sort_values("op")
    if sel.empty:
        from stratacl.errors import ConfigError

        raise ConfigError("--library", f"'{lib}' did not replay {trace_file.name}", f"use one of {libs}")
    return lib, sel["start_s"].to_numpy(), sel["end_s"].to_numpy()
