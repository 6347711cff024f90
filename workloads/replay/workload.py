"""`workload=replay`: one saved or imported trace, replayed under each selected library.

The trace is a harness trace (`.parquet`: `Trace.save`, e.g. a run's `traces/<name>.parquet` from
`output.trace=true`) or a Chakra ET set (`python -m stratacl.chakra export` output, or foreign
traces: ASTRA-sim examples, Chakra's converters; read by `stratacl.chakra.import_et.import_chakra`). The
rows are the per-op timeline of every library's replay (`SimResult.op_frame`); the metrics the
iteration time (the replay's makespan), the exposed-communication accounting and the time the
communication ops took; the table the slowest ops side by side. A missing or damaged trace, or
one with more ranks than the fabric has dies, is one ConfigError before the run directory exists
(`ReplayConfig.check`, called by `validate_run`).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pandas as pd

from stratacl.chakra.import_et import ET_FILE, import_chakra
from stratacl.compare import pivot_table
from stratacl.config import FabricConfig, world_size
from stratacl.errors import ConfigError, TraceError
from stratacl.limits import RunSize
from stratacl.trace import Trace
from stratacl.workload_api import RunContext, WorkloadResult
from workloads.replay.schema import ReplayConfig

FIELD = "workload.trace"
FIX = "give a .parquet trace (Trace.save, runs/<dir>/traces/<name>.parquet), a directory of " \
      "<prefix>.<rank>.et files or <dir>/<prefix>"


def load_trace(path: str, merge: bool = True) -> Trace:
    """The trace at `path` (parquet or Chakra); any problem is a ConfigError naming workload.trace."""
    if not path:
        raise ConfigError(FIELD, "no trace given", FIX)
    p = Path(path).expanduser()
    m = ET_FILE.match(p.name)
    if p.suffix == ".et" and m:  # one file of a set stands for the set
        p = p.with_name(m["prefix"])
    is_chakra = p.is_dir() or (p.parent.is_dir() and any(p.parent.glob(f"{p.name}.*.et")))
    if not is_chakra and not p.is_file():
        raise ConfigError(FIELD, f"{path} does not exist", FIX)
    try:
        st = p.stat() if p.exists() else p.parent.stat()
        return _load(str(p.resolve()), st.st_mtime_ns, is_chakra, merge)
    except (TraceError, ImportError, OSError) as exc:
        raise ConfigError(FIELD, f"{path}: {' '.join(str(exc).split())}", FIX) from None


@functools.lru_cache(maxsize=2)  # the check before the run and the run itself load it once
def _load(path: str, mtime_ns: int, is_chakra: bool, merge: bool) -> Trace:  # noqa: ARG001 - cache key
    return import_chakra(path, merge=merge) if is_chakra else Trace.load(path)


def check(cfg: ReplayConfig, fabric: FabricConfig) -> None:
    trace = load_trace(cfg.trace, cfg.merge)
    if trace.world_size > world_size(fabric):
        raise ConfigError(FIELD, f"the trace has {trace.world_size} ranks, fabric '{fabric.name}' "
                          f"{world_size(fabric)} dies", "choose a fabric with at least as many dies")


def estimate(cfg: ReplayConfig) -> RunSize:
    n = len(load_trace(cfg.trace, cfg.merge).ops)
    return RunSize(trace_ops=n, replayed_ops=n)


def run(ctx: RunContext) -> WorkloadResult:
    cfg: ReplayConfig = ctx.cfg.workload
    trace = load_trace(cfg.trace, cfg.merge)
    ctx.progress.phase("replay", total=len(ctx.libraries), unit="lib")
    frames, metrics, timelines = [], {}, {}
    for lib, res in ctx.replay_all(trace, progress=True).items():
        ops = res.op_frame(trace)
        ops["time_s"] = ops["end_s"] - ops["start_s"]
        frames.append(ops)
        e = res.exposure()
        metrics[lib] = {
            "iteration_time_s": float(res.makespan_s),
            "compute_s": e.compute_s,
            "exposed_comm_s": e.exposed_comm_s,
            "exposed_comm_share": e.exposed_comm_s / e.time_s if e.time_s > 0 else 0.0,
            "comm_ops_s": e.comm_ops_s,  # summed durations of the communication ops
            **{f"comm_{k}_s": getattr(e, f"{k}_s") for k in ("wire", "copy", "sync", "register", "launch")},
        }
        timelines[lib] = (trace, res)
    rows = pd.concat(frames, ignore_index=True)
    return WorkloadResult(rows=rows, metrics=metrics, timelines=timelines, table=_slowest(rows, ctx, cfg.top_ops),
                          notes=[_describe(cfg.trace, trace)])


def _slowest(rows: pd.DataFrame, ctx: RunContext, top: int) -> pd.DataFrame | None:
    """The `top` slowest ops of the baseline's replay, each library's time (µs) side by side."""
    if top == 0:
        return None
    base = rows[rows["library"] == ctx.baseline].nlargest(top, "time_s")["op"]
    sel = rows[rows["op"].isin(base)].assign(time_us=lambda d: d["time_s"] * 1e6)
    wide = pivot_table(sel, ["op", "name", "kind"], "time_us", list(ctx.libraries), ctx.baseline)
    return wide.set_index("op").loc[base.to_numpy()].reset_index()


def _describe(path: str, trace: Trace) -> str:
    kinds = pd.Series([op.kind for op in trace.ops]).value_counts().to_dict()
    source = ", ".join(f"{k}={v}" for k, v in trace.meta.items() if isinstance(v, str | int | float))
    return (f"replayed {path}: {len(trace.ops)} ops ({', '.join(f'{n} {k}' for k, n in kinds.items())}) on "
            f"{trace.world_size} ranks{f' ({source})' if source else ''}; iteration time = the replay's makespan")
