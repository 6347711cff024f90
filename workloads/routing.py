"""Token routing to experts over expert-parallel ranks: who sends how many token copies to whom.

Each token picks `top_k` distinct experts with probability proportional to the product of their
popularities (uniform, Zipf or a given histogram): k draws with replacement, redrawn for the
tokens that drew an expert twice (cheap: ~10 % of tokens for top-8 of 256 uniform); experts are placed
contiguously, experts/ep per rank. High-throughput dispatch (DeepEP normal mode) sends a token
once to every rank hosting at least one of its experts; low-latency mode sends one copy per
selected expert.
"""

from __future__ import annotations

import numpy as np

from stratacl.errors import ConfigError


def expert_weights(experts: int, skew: str, zipf_s: float = 1.0,
                   histogram: list[float] | None = None, seed: int = 0) -> np.ndarray:
    if skew == "uniform":
        w = np.ones(experts)
    elif skew == "zipf":
        if zipf_s < 0:
            raise ConfigError("workload.zipf_s", f"must be ≥ 0, got {zipf_s}")
        ranks = np.random.default_rng(seed).permutation(experts) + 1  # hot experts anywhere
        w = 1.0 / ranks.astype(float) ** zipf_s
    elif skew == "histogram":
        if not histogram or len(histogram) != experts or min(histogram) < 0 or sum(histogram) <= 0:
            raise ConfigError("workload.histogram", f"needs {experts} non-negative weights, not all 0",
                              "one weight per expert")
        w = np.asarray(histogram, dtype=float)
    else:
        raise ConfigError("workload.skew", f"unknown skew '{skew}'", "use uniform, zipf or histogram")
    return w / w.sum()


def route(tokens_per_rank: int, ep: int, experts: int, top_k: int, weights: np.ndarray,
          rng: np.random.Generator) -> np.ndarray:
    """Chosen experts per token: array (ep, tokens, top_k)."""
    if experts % ep:
        raise ConfigError("workload.ep", f"{ep} ranks do not divide {experts} experts",
                          "use an EP size that divides the number of experts")
    if not 0 < top_k <= experts:
        raise ConfigError("workload.top_k", f"must be in 1..{experts}, got {top_k}")
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    n_tok = ep * tokens_per_rank
    choice = np.empty((n_tok, top_k), dtype=np.int64)
    todo = np.arange(n_tok)
    for _ in range(1000):
        draw = np.searchsorted(cdf, rng.random((todo.size, top_k)), side="right")
        draw = np.minimum(draw, experts - 1)
        srt = np.sort(draw, axis=1)
        ok = (np.diff(srt, axis=1) != 0).all(axis=1)
        choice[todo[ok]] = draw[ok]
        todo = todo[~ok]
        if todo.size == 0:
            return choice.reshape(ep, tokens_per_rank, top_k)
    raise ConfigError("workload.zipf_s", "expert popularity too concentrated to draw top_k distinct "
                      "experts", "lower the skew or top_k")


def copies_matrix(choice: np.ndarray, ep: int, experts: int, per_expert: bool) -> np.ndarray:
    """Token copies from each source rank (row) to each destination rank (column)."""
    dest = choice // (experts // ep)  # (ep, tokens, k) destination rank of each selected expert
    out = np.zeros((ep, ep))
    for src in range(ep):
        d = dest[src]
        if per_expert:
            out[src] = np.bincount(d.ravel(), minlength=ep)
        else:  # one copy per distinct destination rank of each token
            hit = np.zeros((d.shape[0], ep), dtype=bool)
            np.put_along_axis(hit, d, True, axis=1)
            out[src] = hit.sum(axis=0)
    return out
