"""Routing model over training: expert-load skew that decays as the gate learns to balance.

Each MoE layer has its own expert popularity (a Zipf law over a seeded random permutation of its
experts, stable over training); the Zipf exponent follows the schedule
``end + (start − end)·exp(−iteration / decay_iters)``. Every EP rank routes its tokens × top_k
rows by a multinomial draw (seeded by layer and iteration), so per-peer volumes are uneven and
deterministic for a seed. Experts sit on EP ranks in contiguous blocks.
"""

from __future__ import annotations

import math

import numpy as np

from stratacl.schemas.llm_train import SkewScheduleConfig


def zipf_exponent(schedule: SkewScheduleConfig, iteration: int) -> float:
    return schedule.end + (schedule.start - schedule.end) * math.exp(-iteration / schedule.decay_iters)


def expert_shares(n_experts: int, exponent: float, seed: int, layer: int) -> np.ndarray:
    p = 1.0 / np.arange(1, n_experts + 1) ** exponent
    perm = np.random.default_rng([seed, layer, 0]).permutation(n_experts)
    return (p / p.sum())[perm]


def dispatch_rows(ep: int, n_experts: int, top_k: int, tokens_per_rank: int, exponent: float,
                  seed: int, layer: int, iteration: int) -> np.ndarray:
    """ep × ep rows matrix: rows[i, j] = (token, expert) rows EP rank i sends to EP rank j."""
    shares = expert_shares(n_experts, exponent, seed, layer)
    rng = np.random.default_rng([seed, layer, iteration, 1])
    per_expert = rng.multinomial(tokens_per_rank * top_k, shares, size=ep)  # ep × n_experts
    return per_expert.reshape(ep, ep, n_experts // ep).sum(axis=2)


def imbalance(rows: np.ndarray) -> float:
    """Max over mean rows received per EP rank (1 = perfectly balanced)."""
    recv = rows.sum(axis=0)
    return float(recv.max() / recv.mean())
