"""HBM embedding cache hit rate from a Zipf access distribution, analytically.

Rows of a table (or of one die's shard of it) are ranked by popularity; the k-th is looked up
with probability ∝ k^-s. A cache of C bytes in front of a die's shards (TorchRec UVM caching)
holds, in steady state, the rows with the highest lookup rate per byte across all its shards
(ideal LFU); the hit rate is the share of lookups that land on cached rows,
Σ_j Λ_j·H(m_j, s)/H(n_j, s) / Σ_j Λ_j, with H the generalised harmonic number. H is exact up
to 1024 terms and Euler–Maclaurin beyond (billions of rows cost nothing). Deterministic: no
sampling here; per-iteration miss counts are drawn by the caller from a seeded generator.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_EXACT = 1024


def harmonic(n: np.ndarray | float, s: float) -> np.ndarray:
    """H(n, s) = Σ_{k=1}^{⌊n⌋} k^-s for n ≥ 0 (vectorised)."""
    n = np.floor(np.asarray(n, dtype=float))
    k = np.arange(1, _EXACT + 1, dtype=float)
    prefix = np.concatenate([[0.0], np.cumsum(k ** -s)])
    small = prefix[np.clip(n, 0, _EXACT).astype(np.int64)]
    big = np.maximum(n, _EXACT)
    K = float(_EXACT)
    integral = np.log(big / K) if abs(s - 1.0) < 1e-12 else (big ** (1 - s) - K ** (1 - s)) / (1 - s)
    tail = integral + (big ** -s - K ** -s) / 2 - s * (big ** (-s - 1) - K ** (-s - 1)) / 12
    return np.where(n <= _EXACT, small, prefix[-1] + tail)


@dataclass(frozen=True)
class Segment:
    """One shard a die serves: `rows` rows of `row_bytes`, `lookups` per iteration."""

    rows: float
    row_bytes: float
    lookups: float


def cached_rows(segments: list[Segment], cache_bytes: float, s: float) -> np.ndarray:
    """Rows of each segment the cache holds: all rows whose lookup rate per byte is above a
    threshold λ, with λ chosen (bisection on log λ) so the rows fill `cache_bytes`."""
    n = np.array([g.rows for g in segments], dtype=float)
    rb = np.array([g.row_bytes for g in segments], dtype=float)
    lam = np.array([g.lookups for g in segments], dtype=float)
    if cache_bytes >= float((n * rb).sum()):
        return n
    if cache_bytes <= 0 or not lam.any():
        return np.zeros_like(n)
    density = lam / (harmonic(n, s) * rb)  # rate per byte of each segment's hottest row

    def rows_at(log_thr: float) -> np.ndarray:
        with np.errstate(divide="ignore", over="ignore"):
            m = np.floor((density / np.exp(log_thr)) ** (1.0 / s))
        return np.clip(np.nan_to_num(m, posinf=np.inf), 0, n)

    lo, hi = np.log(density[density > 0].min()) - 200.0, np.log(density.max())
    for _ in range(100):  # bytes(λ) falls as λ rises; keep the largest fill ≤ cache_bytes
        mid = (lo + hi) / 2
        if float((rows_at(mid) * rb).sum()) > cache_bytes:
            lo = mid
        else:
            hi = mid
    return rows_at(hi)


def hit_rates(segments: list[Segment], cache_bytes: float, s: float) -> np.ndarray:
    """Per-segment hit rate with the cache shared as in `cached_rows`."""
    if not segments:
        return np.zeros(0)
    n = np.array([g.rows for g in segments], dtype=float)
    m = cached_rows(segments, cache_bytes, s)
    return harmonic(m, s) / harmonic(n, s)


def die_hit_rate(segments: list[Segment], cache_bytes: float, s: float) -> float:
    lam = np.array([g.lookups for g in segments], dtype=float)
    if not lam.sum():
        return 1.0
    return float((hit_rates(segments, cache_bytes, s) * lam).sum() / lam.sum())
