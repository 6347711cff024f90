"""Operator micro-benchmark: bus bandwidth vs message size per library (nccl-tests conventions).

One trace holds every (collective, size) point as warmup + iters ops on the same user buffer,
each after the previous on one stream, so an op's duration is its operator latency on an
otherwise idle fabric; like nccl-tests, first-use costs (registration) fall in the warm-up runs.
`p2p` is a send/recv between rank i and rank i + n/2 of each group (across the group's halves). With `group_size` <
`ranks`, every op runs on all groups of the family at once (they contend only where they share
dies, which contiguous groups do not).

The verdict judges operator time per size band (`stratacl.metrics.SIZE_BANDS`): per band, and per
collective in it, the geometric mean of the operator time over the band's sizes — whose ratio
between two libraries is the geometric mean of their per-size time ratios, every size weighing
the same (a sum would be the band's largest size alone).
"""

from __future__ import annotations

import math

import pandas as pd

from stratacl.compare import pivot_table
from stratacl.errors import ConfigError
from stratacl.limits import RunSize
from stratacl.metrics import algbw, bands_text, busbw_factor, geomean, human_bytes, size_band
from stratacl.trace import COLLECTIVES, MOE_COLLS, Trace
from stratacl.vocab import Collective, OpKind
from stratacl.workload_api import RunContext, WorkloadResult
from workloads.collectives.schema import CollectivesConfig


def message_sizes(cfg: CollectivesConfig) -> list[int]:
    if cfg.min_bytes <= 0 or cfg.max_bytes < cfg.min_bytes:
        raise ConfigError("workload.min_bytes", f"need 0 < min_bytes ≤ max_bytes, got "
                          f"{cfg.min_bytes}..{cfg.max_bytes}", "e.g. min_bytes=65536 max_bytes=1073741824")
    if cfg.step_factor < 2:
        raise ConfigError("workload.step_factor", f"must be ≥ 2, got {cfg.step_factor}")
    sizes, s = [], cfg.min_bytes
    while s <= cfg.max_bytes:
        sizes.append(s)
        s *= cfg.step_factor
    return sizes


def estimate(cfg: CollectivesConfig) -> RunSize:
    """One trace of every (collective, size, run) point."""
    sizes = 0
    if 0 < cfg.min_bytes <= cfg.max_bytes and cfg.step_factor >= 2:
        sizes = int(math.floor(math.log(cfg.max_bytes / cfg.min_bytes, cfg.step_factor) + 1e-9)) + 1
    n = len(cfg.collectives) * sizes * (cfg.warmup + cfg.iters)
    return RunSize(trace_ops=n, replayed_ops=n)


def build_trace(cfg: CollectivesConfig, world: int) -> tuple[Trace, list[tuple[str, int]]]:
    group = cfg.group_size or cfg.ranks
    if group <= 0 or cfg.ranks % group:
        raise ConfigError("workload.group_size", f"{group} does not divide workload.ranks={cfg.ranks}",
                          "use a divisor of workload.ranks (or 0 for one group)")
    if group < 2:
        raise ConfigError("workload.group_size", "collectives need at least 2 ranks per group")
    # uneven and MoE exchanges need a routing matrix this workload does not draw
    supported = [c for c in COLLECTIVES if c not in (Collective.alltoallv, *MOE_COLLS)] + [OpKind.p2p.value]
    unknown = [c for c in cfg.collectives if c not in supported]
    if unknown or not cfg.collectives:
        raise ConfigError("workload.collectives", f"unsupported {unknown or 'empty list'}",
                          f"use some of {supported}")
    if cfg.iters < 1 or cfg.warmup < 0:
        raise ConfigError("workload.iters", "need iters ≥ 1 and warmup ≥ 0")
    trace = Trace(world_size=world, meta={"workload": "collectives"})
    groups = [range(g, g + group) for g in range(0, cfg.ranks, group)]
    trace.add_family("world", groups)
    src = [r for g in groups for r in g[: group // 2]]
    dst = [r + group // 2 for r in src]
    points = []
    for coll in cfg.collectives:
        for size in message_sizes(cfg):
            for it in range(cfg.warmup + cfg.iters):
                name, buf = f"{coll}_{size}_{it}", f"{coll}_{size}"
                if coll == OpKind.p2p:
                    trace.add(OpKind.p2p, sorted(src + dst), src=src, dst=dst, nbytes=size, name=name, buffer=buf)
                else:
                    trace.collective(coll, "world", size, name=name, buffer=buf)
                points.append((coll, size, it >= cfg.warmup))
    return trace, points


def run(ctx: RunContext) -> WorkloadResult:
    cfg: CollectivesConfig = ctx.cfg.workload
    ctx.fabric.check_ranks(cfg.ranks, "workload.ranks")
    trace, points = build_trace(cfg, cfg.ranks)
    n = cfg.group_size or cfg.ranks
    frames, metrics, timelines = [], {}, {}
    ctx.progress.phase("replay", total=len(ctx.libraries), unit="lib")
    for lib, res in ctx.replay_all(trace, progress=True).items():
        ops = res.op_frame(trace)
        ops["collective"] = [c for c, _, _ in points]
        ops["size_bytes"] = [s for _, s, _ in points]
        ops["time_s"] = ops["end_s"] - ops["start_s"]
        first = ops.groupby(["collective", "size_bytes"], sort=False)["time_s"].transform("first")
        ops = ops[[m for _, _, m in points]].copy()
        ops["first_time_s"] = first[ops.index]
        ops = ops.groupby(["collective", "size_bytes"], sort=False, as_index=False).agg(
            {**{c: "mean" for c in ops.columns if c.endswith("_s") or c.endswith("_bytes") and c != "size_bytes"},
             "n_ranks": "first", "library": "first", "algorithm": "first",
             # fastest-to-slowest comm-core completion spread, as the library partitioned the cores
             "core_spread": "mean"})
        ops["algbw_GBps"] = [algbw(s, t) / 1e9 for s, t in zip(ops["size_bytes"], ops["time_s"], strict=True)]
        ops["busbw_GBps"] = [a * busbw_factor(c, n) for a, c in zip(ops["algbw_GBps"], ops["collective"], strict=True)]
        ops["iters"] = cfg.iters
        ops["group_size"] = n
        ops["band"] = [size_band(s) for s in ops["size_bytes"]]
        frames.append(ops)
        metrics[lib] = _metrics(ops)
        timelines[lib] = (trace, res)
    rows = pd.concat(frames, ignore_index=True)
    wide = pivot_table(rows, ["collective", "size_bytes"], "busbw_GBps", list(ctx.libraries), ctx.baseline)
    wide.insert(1, "size", [human_bytes(s) for s in wide["size_bytes"]])
    wide.insert(2, "band", [size_band(s) for s in wide["size_bytes"]])
    wide = wide.drop(columns="size_bytes")
    note = (f"verdict per size band (REFERENCE §5 size regimes): {bands_text()}; a band's operator time is "
            "the geometric mean over its sizes, judged per collective (a band is mixed when they disagree)")
    notes, extra = [note], {}
    if cfg.breakdown:
        extra["breakdown"] = parts = breakdown(rows, cfg.breakdown, list(ctx.libraries))
        notes.append(breakdown_text(parts))
    return WorkloadResult(rows=rows, metrics=metrics, timelines=timelines, table=wide, notes=notes,
                          extra_rows=extra)


def _metrics(ops: pd.DataFrame) -> dict[str, float]:
    """One library's summary: busbw and summed time per collective and overall, and the operator
    time per size band (`<band>_op_time_s`) and per collective in each band
    (`<collective>_<band>_op_time_s`), geometric means over the band's sizes."""
    m: dict[str, float] = {}
    for coll, sub in ops.groupby("collective", sort=False):
        m[f"{coll}_busbw_GBps_mean"] = float(sub["busbw_GBps"].mean())
        m[f"{coll}_busbw_GBps_peak"] = float(sub["busbw_GBps"].max())
        m[f"{coll}_time_s_total"] = float(sub["time_s"].sum())
    m["busbw_GBps_mean"] = float(ops["busbw_GBps"].mean())
    m["time_s_total"] = float(ops["time_s"].sum())
    for band, sub in ops.groupby("band", sort=False):
        m[f"{band}_op_time_s"] = geomean(sub["time_s"])
        for coll, cell in sub.groupby("collective", sort=False):
            m[f"{coll}_{band}_op_time_s"] = geomean(cell["time_s"])
    return m


# the parts of an operator's time the breakdown prints (stratacl/engine/accounting.py categories)
PARTS = ("wire", "sync", "launch", "copy", "register", "host")


def breakdown(rows: pd.DataFrame, coll: str, libraries: list[str]) -> pd.DataFrame:
    """Per size and library, one collective's operator time and its parts (µs): the phase time of
    each category (wire, sync steps, launch, staging copies, registration, host) and `other`, the
    rest of the op's time (admission waits), so that the parts sum to the time. `wire` is the transfer
    phase: for an SDMA mover it cannot end before its agent has written every descriptor (HCCL's AI
    CPU ~1 µs per task descriptor, two per peer of a full mesh: flat below ~1 MiB)."""
    sub = rows[rows["collective"] == coll]
    out = []
    for (size, lib), r in sub.set_index(["size_bytes", "library"]).iterrows():
        if lib not in libraries:
            continue
        parts = {p: float(r[f"{p}_s"]) * 1e6 for p in PARTS}
        time_us = float(r["time_s"]) * 1e6
        out.append({"collective": coll, "size_bytes": int(size), "library": lib, "algorithm": r["algorithm"],
                    "time_us": time_us, **parts, "other": time_us - sum(parts.values())})
    return pd.DataFrame(out)


def breakdown_text(frame: pd.DataFrame) -> str:
    """The breakdown as a note: one line per size and library, parts in µs and as shares of the time."""
    lines = [f"{frame['collective'].iloc[0]} per size (µs; share of the operator's time): "
             + " + ".join((*PARTS, "other"))]
    for _, r in frame.iterrows():
        shares = "  ".join(f"{p} {r[p]:,.1f} ({r[p] / r['time_us']:.0%})" for p in (*PARTS, "other")
                           if abs(r[p]) >= 0.05)
        lines.append(f"  {human_bytes(r['size_bytes']):>8} {r['library']:<16} {r['algorithm']:<14} "
                     f"{r['time_us']:>10,.1f}  = {shares}")
    return "\n".join(lines)
