"""Metric conventions shared by workloads: nccl-tests bus bandwidth, percentiles, ratios."""

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


def ratios(metrics: dict[str, dict[str, float]], baseline: str) -> dict[str, dict[str, float]]:
    """value / baseline value per library and metric (nan where the baseline is 0 or missing)."""
    base = metrics[baseline]
    out: dict[str, dict[str, float]] = {}
    for lib, m in metrics.items():
        out[lib] = {}
        for key, v in m.items():
            b = base.get(key)
            out[lib][key] = float(v) / float(b) if b not in (None, 0) else float("nan")
    return out
