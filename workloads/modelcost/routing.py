"""Routing model: how many (token, expert) rows land on one EP rank's experts.

The MoE module's own routing is data-dependent (fake tensors carry no values), so the
expert MLP is run on a row count from this model instead. Uniform routing gives every
rank tokens x top_k rows (each of ep ranks sends T*k rows spread over ep ranks). A Zipf
skew models imbalanced experts; costs then follow the hottest rank (the critical path).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import CostInputError


@dataclass(frozen=True)
class RoutingModel:
    kind: str = "uniform"  # "uniform" | "zipf"
    skew: float = 0.0      # Zipf exponent for kind="zipf" (0 = uniform)
    seed: int = 0          # which experts are hot (random placement of popularity ranks)

    def __post_init__(self) -> None:
        if self.kind not in ("uniform", "zipf"):
            raise CostInputError(f"routing.kind: {self.kind!r}; valid options: uniform, zipf")
        if self.skew < 0:
            raise CostInputError(f"routing.skew: must be >= 0, got {self.skew}")

    def expert_share(self, n_experts: int) -> np.ndarray:
        """Fraction of routed rows each expert receives (sums to 1)."""
        if self.kind == "uniform" or self.skew == 0:
            return np.full(n_experts, 1.0 / n_experts)
        p = 1.0 / np.arange(1, n_experts + 1) ** self.skew
        rng = np.random.default_rng(self.seed)
        return rng.permutation(p / p.sum())

    def rank_load(self, n_experts: int, ep: int) -> np.ndarray:
        """Relative load of each EP rank (contiguous expert blocks); mean 1."""
        if n_experts % ep:
            raise CostInputError(f"ep: {ep} does not divide n_routed_experts={n_experts}")
        share = self.expert_share(n_experts).reshape(ep, n_experts // ep).sum(axis=1)
        return share * ep

    def rows_on_rank(self, tokens: int, top_k: int, n_experts: int, ep: int) -> int:
        """Rows the hottest EP rank's experts process when every rank holds `tokens` tokens."""
        return int(math.ceil(tokens * top_k * float(self.rank_load(n_experts, ep).max())))
