"""Metric conventions shared by workloads: nccl-tests bus bandwidth, percentiles, interval unions."""

from __future__ import annotations

import numpy as np


def busbw_factor(coll: str, n: int) -> float:
    """nccl-tests doc/PERFORMANCE.md: busbw = algbw × factor (REFERENCE §7)."""
    if coll == "allreduce":
        return 2 * (n - 1) / n
    if coll in ("allgather", "reducescatter", "alltoall", "alltoallv"):
        return (n - 1) / n
    if coll in ("broadcast", "reduce", "p2p", "sendrecv"):
        return 1.0
    raise ValueError(f"no busbw convention for {coll}")


def algbw(size_bytes: float, seconds: float) -> float:
    """algbw = S / t with S the full buffer (bytes/s)."""
    return size_bytes / seconds


def percentile(values: np.ndarray, q: float) -> float:
    values = np.asarray(values, dtype=float)
    return float(np.percentile(values, q)) if values.size else float("nan")


def union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length of the union of intervals [start, end) (e.g. time some kernel computes)."""
    starts, ends = np.asarray(starts, dtype=float), np.asarray(ends, dtype=float)
    if len(starts) == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    total, cur_s, cur_e = 0.0, float(starts[order[0]]), float(ends[order[0]])
    for s, e in zip(starts[order[1:]], ends[order[1:]], strict=True):
        if s > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = float(s), float(e)
        else:
            cur_e = max(cur_e, float(e))
    return total + cur_e - cur_s
