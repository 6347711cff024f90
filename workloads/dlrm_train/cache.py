"""HBM embedding cache hit rate and deduplicated misses from a Zipf access distribution, analytically.

Rows of a table (or of one die's shard of it) are ranked by popularity; the k-th is looked up
with probability ∝ k^-s. A cache of C bytes in front of a die's shards (TorchRec UVM caching: one
cache per table-batched embedding module, shared by its tables) serves, in steady state:

- ``lfu`` (ideal LFU): the rows with the highest lookup rate per byte across all its shards; the
  hit rate is Σ_j Λ_j·H(m_j, s)/H(n_j, s) / Σ_j Λ_j, with H the generalised harmonic number.
- ``lru`` (FBGEMM's default, `SplitTableBatchedEmbeddingBagsCodegen(cache_algorithm=
  CacheAlgorithm.LRU)`): Che's approximation (Che, Tung, Wang, IEEE JSAC 2002; Fricker, Robert,
  Roberts, ITC 2012) — a row with rate λ is cached with probability 1 − exp(−λ·T), the
  characteristic time T common to all shards and set by Σ_j rb_j Σ_k (1 − exp(−λ_jk·T)) = C; a
  segment's hit rate is Σ_k p_jk (1 − exp(−λ_jk·T)). Below LFU at equal size.

Sums over rows are exact up to 1024 terms and, beyond, the midpoint integral on a log grid
(Euler–Maclaurin for H): billions of rows cost nothing. Deterministic: no sampling here; per-
iteration miss counts are drawn by the caller from a seeded generator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

_EXACT = 1024
_GRID = 257  # log-grid points of the tail integrals (lru)
POLICIES = ("lru", "lfu")


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
    density = lam / (harmonic(n, s) * rb)  # rate per byte of each segment's hottest row
    if cache_bytes <= 0 or not (density > 0).any():  # (a rate may underflow to 0)
        return np.zeros_like(n)

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


def _sum_rows(n: np.ndarray, fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
    """Per segment j, Σ_{k=1}^{n_j} fn(j, k): `fn(idx, k)` takes segment indices (m,) and row ranks
    (m, K) and returns (m, K). Exact up to 1024 rows; beyond, Σ_{k=K+1}^{n} f(k) ≈ ∫_{K+½}^{n+½}
    f(x) dx, the midpoint rule, on a log grid (dx = x du)."""
    k = np.arange(1, _EXACT + 1, dtype=float)[None, :]
    idx = np.arange(len(n))
    out = (fn(idx, np.repeat(k, len(n), axis=0)) * (k <= n[:, None])).sum(axis=1)
    tail = np.flatnonzero(n > _EXACT)
    if tail.size:
        u = np.linspace(0.0, 1.0, _GRID)[None, :]
        lo, hi = np.log(_EXACT + 0.5), np.log(n[tail] + 0.5)[:, None]
        x = np.exp(lo + (hi - lo) * u)
        out[tail] += np.trapezoid(fn(tail, x) * x, u, axis=1) * (hi - lo)[:, 0]
    return out


def _che_q(s: float, a: np.ndarray) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """q_k = 1 − exp(−a_j·k^-s): the probability that row k of segment j is in an LRU cache (Che)."""
    return lambda i, k: -np.expm1(-a[i][:, None] * k ** -s)


def _occupancy(n: np.ndarray, s: float, a: np.ndarray) -> np.ndarray:
    """Per segment (n_j rows, a_j = λ_j·T / H(n_j, s)): Σ_{k≤n_j} q_k, the rows cached."""
    return _sum_rows(n, _che_q(s, a))


def _hit_mass(n: np.ndarray, s: float, a: np.ndarray) -> np.ndarray:
    """Per segment: Σ_{k≤n_j} k^-s·q_k, the lookups (per H(n_j, s)) that hit."""
    q = _che_q(s, a)
    return _sum_rows(n, lambda i, k: q(i, k) * k ** -s)


def lru_presence(segments: list[Segment], cache_bytes: float, s: float) -> np.ndarray | None:
    """Che's a_j = λ_j·T / H(n_j, s) per segment (row k of segment j is cached with probability
    1 − exp(−a_j·k^-s)), T the largest characteristic time whose cached bytes stay within
    `cache_bytes` (bisection on log T; monotone in C); None when every looked-up row fits."""
    n = np.array([g.rows for g in segments], dtype=float)
    rb = np.array([g.row_bytes for g in segments], dtype=float)
    lam = np.array([g.lookups for g in segments], dtype=float)
    if cache_bytes >= float((n * rb)[lam > 0].sum()):
        return None
    rate = lam / harmonic(n, s)  # λ_jk = rate_j · k^-s
    lo, hi = -80.0, 80.0  # log T, T in iterations
    for _ in range(60):  # bytes(T) rises with T; keep the largest T that fits (monotone in C)
        mid = (lo + hi) / 2
        occ = _occupancy(n, s, rate * np.exp(mid))
        if float((occ * rb).sum()) > cache_bytes:
            hi = mid
        else:
            lo = mid
    return rate * np.exp(lo)


def lru_hit_rates(segments: list[Segment], cache_bytes: float, s: float) -> np.ndarray:
    """Per-segment LRU hit rate (Che's approximation, module doc)."""
    return _lru_hits(np.array([g.rows for g in segments], dtype=float), s, lru_presence(segments, cache_bytes, s))


def _lru_hits(n: np.ndarray, s: float, a: np.ndarray | None) -> np.ndarray:
    if a is None:
        return np.ones(len(n))
    return np.clip(_hit_mass(n, s, a) / harmonic(n, s), 0.0, 1.0)


def hit_rates(segments: list[Segment], cache_bytes: float, s: float, policy: str = "lru") -> np.ndarray:
    """Per-segment hit rate of a cache of `cache_bytes` shared by the segments, under `policy`."""
    if not segments:
        return np.zeros(0)
    if policy == "lru":
        return lru_hit_rates(segments, cache_bytes, s)
    n = np.array([g.rows for g in segments], dtype=float)
    return _lfu_hits(n, s, cached_rows(segments, cache_bytes, s))


def _lfu_hits(n: np.ndarray, s: float, m: np.ndarray) -> np.ndarray:
    return harmonic(m, s) / harmonic(n, s)


def die_hit_rate(segments: list[Segment], cache_bytes: float, s: float, policy: str = "lru") -> float:
    """The die's hit rate per lookup (`CacheModel.die_hit`)."""
    return CacheModel(segments, cache_bytes, s, policy).die_hit


class CacheModel:
    """One die's cache in steady state: its per-segment hit rate (per lookup) and the expected
    number of *distinct* rows a batch misses. TorchRec's prefetch (FBGEMM's lxu_cache
    prefetch) deduplicates a batch's indices before looking them up, so a row looked up c times
    in the batch and not cached is fetched once: with L_j lookups of segment j in the batch,

        U_j = Σ_k (1 − q_jk) · (1 − (1 − p_jk)^L_j),   p_jk = k^-s / H(n_j, s),

    q_jk the probability that row k is cached when the batch arrives (LRU: Che's
    1 − exp(−a_j·k^-s); LFU: 1 for the m_j hottest rows), independent of this batch's draws (Che's
    independence assumption). The sum runs exactly to 1024 rows and as an integral beyond."""

    def __init__(self, segments: list[Segment], cache_bytes: float, s: float, policy: str = "lru") -> None:
        self.n = np.array([g.rows for g in segments], dtype=float)
        self.lookups = np.array([g.lookups for g in segments], dtype=float)
        self.s = s
        self.a = self.m = None
        if policy == "lru":
            self.a = lru_presence(segments, cache_bytes, s)
            self.resident = self.a is None
        else:
            self.m = cached_rows(segments, cache_bytes, s)
            self.resident = bool((self.m >= self.n).all())
        # from the solve above (hit_rates would solve the cache again)
        self.hit = np.ones(len(segments)) if self.resident else \
            (_lru_hits(self.n, s, self.a) if policy == "lru" else _lfu_hits(self.n, s, self.m))

    @property
    def die_hit(self) -> float:
        """The die's hit rate per lookup: its segments' rates weighted by their lookups (1 with none)."""
        total = self.lookups.sum()
        return float((self.hit * self.lookups).sum() / total) if total else 1.0

    def unique_misses(self, lookups: np.ndarray) -> np.ndarray:
        """Expected distinct missed rows per segment for a batch with `lookups[j]` lookups of j."""
        L = np.asarray(lookups, dtype=float)
        if self.resident:
            return np.zeros_like(L)
        h, s = harmonic(self.n, self.s), self.s

        def requested(i: np.ndarray, k: np.ndarray) -> np.ndarray:  # 1 − (1 − p)^L
            return -np.expm1(L[i][:, None] * np.log1p(-(k ** -s) / h[i][:, None]))

        if self.a is not None:
            a = self.a
            return _sum_rows(self.n, lambda i, k: np.exp(-a[i][:, None] * k ** -s) * requested(i, k))
        m = self.m  # LFU: the rows after the m_j cached ones, summed from there (no cancellation)
        return _sum_rows(self.n - m, lambda i, j: requested(i, m[i][:, None] + j))
