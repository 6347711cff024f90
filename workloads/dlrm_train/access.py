"""Row popularity of the embedding tables: Zipf, with its exponent derived from a published skew
figure instead of assumed (issue 26).

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

import numpy as np

from stratacl.schemas.dlrm_train import DlrmTrainConfig

from .cache import Segment, cached_rows, harmonic


def top_share(rows: tuple[int, ...], fraction: float, s: float) -> float:
    """Share of all lookups (one per table per sample) that the hottest `fraction` of all rows get."""
    n = np.asarray(rows, dtype=float)
    m = cached_rows([Segment(r, 1.0, 1.0) for r in n], fraction * float(n.sum()), s)
    return float((harmonic(m, s) / harmonic(n, s)).mean())


@lru_cache(maxsize=16)
def zipf_from_top_share(rows: tuple[int, ...], fraction: float, share: float) -> float:
    """The Zipf exponent at which the hottest `fraction` of the rows get `share` of the lookups."""
    lo, hi = 1e-3, 8.0
    for _ in range(60):  # top_share rises with s
        mid = (lo + hi) / 2
        if top_share(rows, fraction, mid) < share:
            lo = mid
        else:
            hi = mid
    return hi


def zipf_exponent(cfg: DlrmTrainConfig) -> float:
    """The knob when set (> 0), else the exponent derived from the cited skew figure."""
    if cfg.zipf_exponent > 0:
        return float(cfg.zipf_exponent)
    return zipf_from_top_share(tuple(int(r) for r in cfg.skew_rows), float(cfg.skew_top_fraction),
                               float(cfg.skew_top_share))
