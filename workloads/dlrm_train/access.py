"""Row popularity of the embedding tables: Zipf, with its exponent derived from a published skew
figure instead of assumed.

Source: Bagpipe (Agarwal et al., SOSP'23; arXiv 2202.12429v4, abstract): "embedding accesses are
heavily skewed, with around 1% of embeddings representing more than 92% of total accesses". The
data set is Criteo Kaggle: the authors' code trains on `kaggle_criteo_weekly.txt` and lists its
26 table cardinalities (uw-mad-dash/bagpipe@753ba37, README.md and `kaggle_criteo_info`).

Derivation (`zipf_from_top_share`): each sample looks up every table once and each table's rows
are Zipf(s) over its own cardinality; the hottest `fraction` of all rows of all tables is what an
ideal LFU cache of that many rows holds (`cache.cached_rows`, unit row size), and the share of
lookups it serves rises with s, so bisection finds the s at which it equals `share`: 0.984 for
1 % → 92 % on the Kaggle cardinalities. "More than 92 %" makes that a lower bound on the skew.
The figure is one global number: it gives no per-table exponent, so every table shares it.
"""

from __future__ import annotations

from functools import lru_cache

from stratacl.errors import ConfigError
from workloads.dlrm_train.schema import DlrmTrainConfig

from .cache import Segment, hit_rates


def top_share(rows: tuple[int, ...], fraction: float, s: float) -> float:
    """Share of all lookups (one per table per sample) that the hottest `fraction` of all rows get."""
    return float(hit_rates([Segment(r, 1.0, 1.0) for r in rows], fraction * float(sum(rows)), s, "lfu").mean())


@lru_cache(maxsize=16)
def zipf_from_top_share(rows: tuple[int, ...], fraction: float, share: float) -> float:
    """The Zipf exponent at which the hottest `fraction` of the rows get `share` of the lookups."""
    if not rows:  # no rows: no share to match (top_share would be the mean of nothing)
        raise ConfigError("workload.skew_rows", "is empty", "list the tables' row counts, or set workload.zipf_exponent")

    def f(s: float) -> float:
        return top_share(rows, fraction, s) - share

    # top_share rises with s (from `fraction` at s = 0 towards 1): one root in the bracket, found
    # by false position with the Illinois step (a dozen evaluations instead of bisection's 40)
    a, b = 1e-3, 8.0
    fa, fb = f(a), f(b)
    if fa > 0 or fb < 0:
        raise ConfigError("workload.skew_top_share", f"{share} is out of reach for the hottest {fraction} of "
                          f"these tables' rows (from {fa + share:.3f} with near-uniform rows to {fb + share:.3f})",
                          "give a share inside that range, or set workload.zipf_exponent")
    for _ in range(100):
        c = b - fb * (b - a) / (fb - fa)
        fc = f(c)
        if abs(fc) < 1e-12 or abs(b - a) < 1e-9:
            break
        if fc * fb < 0:
            a, fa = b, fb
        else:
            fa /= 2
        b, fb = c, fc
    return c


def zipf_exponent(cfg: DlrmTrainConfig) -> float:
    """The knob when set (> 0), else the exponent derived from the cited skew figure."""
    if cfg.zipf_exponent > 0:
        return float(cfg.zipf_exponent)
    return zipf_from_top_share(tuple(int(r) for r in cfg.skew_rows), float(cfg.skew_top_fraction),
                               float(cfg.skew_top_share))
