"""Metric conventions shared by workloads: nccl-tests bus bandwidth, operator size bands,
percentiles, interval unions."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

MiB = 1 << 20

# Size bands of an operator sweep (per-rank payload, nccl-tests convention), the collectives
# verdict's unit of judgement. Measurement choice: the edges are the regimes REFERENCE §5 reports —
# below 1 MiB latency-bound (full-mesh ≈ 2× ring), ring ahead above ≈ 16 MiB, between them the
# crossover. Each band: (name, lowest size in it, first size above it).
SIZE_BANDS: tuple[tuple[str, int, float], ...] = (
    ("small", 0, 1 * MiB), ("medium", 1 * MiB, 16 * MiB), ("large", 16 * MiB, math.inf))


def busbw_factor(coll: str, n: int) -> float:
    """nccl-tests doc/PERFORMANCE.md: busbw = algbw × factor (REFERENCE §7)."""
    if coll == "allreduce":
        return 2 * (n - 1) / n
    if coll in ("allgather", "reducescatter", "alltoall", "alltoallv"):
        return (n - 1) / n
    if coll in ("broadcast", "reduce", "p2p", "sendrecv"):
        return 1.0
    raise ValueError(f"no busbw convention for {coll}")


def human_bytes(n: float) -> str:
    """1048576 -> "1 MiB"."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:g} {unit}"
        n /= 1024
    return f"{n:g} TiB"


def size_band(nbytes: float) -> str:
    """The SIZE_BANDS name a payload falls in."""
    return next(name for name, lo, hi in SIZE_BANDS if lo <= nbytes < hi)


def band_range(name: str) -> str:
    """"< 1 MiB", "1 MiB – 16 MiB", "≥ 16 MiB"."""
    lo, hi = next((lo, hi) for n, lo, hi in SIZE_BANDS if n == name)
    if lo == 0:
        return f"< {human_bytes(hi)}"
    return f"≥ {human_bytes(lo)}" if math.isinf(hi) else f"{human_bytes(lo)} – {human_bytes(hi)}"


def bands_text() -> str:
    """The band edges as one phrase, for output and docs."""
    return ", ".join(f"{name} {band_range(name)}" for name, _, _ in SIZE_BANDS)


def geomean(values: np.ndarray) -> float:
    """Geometric mean of positive values (NaN if any is not positive or there are none)."""
    v = np.asarray(values, dtype=float)
    return float(np.exp(np.log(v).mean())) if v.size and (v > 0).all() else float("nan")


def algbw(size_bytes: float, seconds: float) -> float:
    """algbw = S / t with S the full buffer (bytes/s)."""
    return size_bytes / seconds


def percentile(values: np.ndarray, q: float) -> float:
    values = np.asarray(values, dtype=float)
    return float(np.percentile(values, q)) if values.size else float("nan")


# Serving latency percentiles: one definition for the CLI table, summary.json and the notebooks.
LATENCY_QUANTILES = (50, 90, 99)
LATENCY_DEFINITION = ("TTFT/TPOT/E2E p50/p90/p99: over the requests arriving in the measured window "
                      "(after warmup_s, to requests.duration_s or a request table's last arrival), "
                      "linear-interpolated percentiles; TPOT of requests with more than one output token")


def measured_requests(requests: pd.DataFrame, warmup_s: float, end_s: float) -> pd.DataFrame:
    """The requests arriving in the measured window [warmup_s, end_s); all of them when none
    does (a warm-up as long as the run): a percentile is then still defined, over the whole run."""
    arrival = requests["arrival_s"]
    inside = (arrival >= warmup_s) & (arrival < end_s)
    return requests[inside] if warmup_s < end_s and inside.any() else requests


def latency_percentiles(requests: pd.DataFrame, warmup_s: float, end_s: float) -> dict[str, float]:
    """`ttft_p99_s`, ... (LATENCY_DEFINITION) from per-request `ttft_s`, `tpot_s`, `e2e_s` rows
    (a serving run's results.parquet, one library and run)."""
    m = measured_requests(requests, warmup_s, end_s)
    return {f"{name}_p{q}_s": percentile(m[f"{name}_s"].dropna().to_numpy(), q)
            for name in ("ttft", "tpot", "e2e") for q in LATENCY_QUANTILES}


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
