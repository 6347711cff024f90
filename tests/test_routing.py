"""workloads.routing: expert popularity, top-k routing and the token-copy matrices MoE ops carry."""

from __future__ import annotations

import numpy as np
import pytest

from stratacl.errors import ConfigError
from workloads.common.routing import copies_matrix, expert_weights, route

EP, EXPERTS, TOP_K, TOKENS = 16, 64, 4, 2000


def _route(seed: int, s: float = 1.0, tokens: int = TOKENS, ep: int = EP, experts: int = EXPERTS,
           top_k: int = TOP_K) -> np.ndarray:
    w = expert_weights(experts, "zipf", s, seed=seed)
    return route(tokens, ep, experts, top_k, w, np.random.default_rng(seed))


# ------------------------------------------------------------------ popularity
def test_zipf_weights_are_normalised_inverse_rank_powers() -> None:
    for s in (0.0, 0.6, 1.3):
        w = expert_weights(EXPERTS, "zipf", s, seed=3)
        ranks = np.arange(1, EXPERTS + 1, dtype=float)
        assert w.sum() == pytest.approx(1.0)
        assert np.sort(w)[::-1] == pytest.approx(ranks**-s / (ranks**-s).sum(), rel=1e-12)
    np.testing.assert_allclose(expert_weights(EXPERTS, "zipf", 0.0), expert_weights(EXPERTS, "uniform"))
    # the hot experts sit wherever the seed puts them, and only the seed decides
    assert np.argmax(expert_weights(EXPERTS, "zipf", 1.0, seed=1)) == np.argmax(expert_weights(EXPERTS, "zipf", 2.0, seed=1))
    assert not np.array_equal(expert_weights(EXPERTS, "zipf", 1.0, seed=1), expert_weights(EXPERTS, "zipf", 1.0, seed=2))


def test_histogram_weights_and_bad_popularity_inputs() -> None:
    assert expert_weights(4, "histogram", histogram=[1, 1, 2, 0]) == pytest.approx([0.25, 0.25, 0.5, 0.0])
    with pytest.raises(ConfigError, match="workload.histogram"):
        expert_weights(4, "histogram", histogram=[1, 1])
    with pytest.raises(ConfigError, match="workload.zipf_s"):
        expert_weights(4, "zipf", -0.5)
    with pytest.raises(ConfigError, match="workload.skew"):
        expert_weights(4, "pareto")


# ------------------------------------------------------------------ routing
def test_every_token_picks_top_k_distinct_experts() -> None:
    choice = _route(seed=0, s=1.6)  # strong skew: many first draws repeat an expert and are redrawn
    assert choice.shape == (EP, TOKENS, TOP_K)
    assert choice.min() >= 0 and choice.max() < EXPERTS
    srt = np.sort(choice, axis=-1)
    assert (np.diff(srt, axis=-1) > 0).all()


def test_single_expert_routing_follows_the_popularity() -> None:
    """top-1 draws are multinomial in the weights: every expert's count within 5 σ of n·p."""
    w = expert_weights(16, "zipf", 0.8, seed=5)
    choice = route(25_000, 4, 16, 1, w, np.random.default_rng(5))
    n = choice.size
    counts = np.bincount(choice.ravel(), minlength=16)
    sigma = np.sqrt(n * w * (1 - w))
    assert np.abs(counts - n * w).max() < 5 * sigma.max()


def test_routing_is_deterministic_per_seed() -> None:
    np.testing.assert_array_equal(_route(seed=7), _route(seed=7))
    assert not np.array_equal(_route(seed=7), _route(seed=8))


def test_bad_routing_inputs_name_the_field() -> None:
    w = expert_weights(EXPERTS, "uniform")
    with pytest.raises(ConfigError, match="workload.ep"):
        route(8, 12, EXPERTS, TOP_K, w, np.random.default_rng(0))  # 12 does not divide 64
    with pytest.raises(ConfigError, match="workload.top_k"):
        route(8, EP, EXPERTS, EXPERTS + 1, w, np.random.default_rng(0))
    two_hot = expert_weights(8, "histogram", histogram=[1, 1, 0, 0, 0, 0, 0, 0])
    with pytest.raises(ConfigError, match="too concentrated"):
        route(8, 2, 8, 3, two_hot, np.random.default_rng(0))  # only 2 experts can ever be drawn


# ------------------------------------------------------------------ copy matrices
def test_low_latency_copies_conserve_token_copies() -> None:
    """One copy per selected expert: each source sends tokens·k copies, to the ranks hosting them."""
    choice = _route(seed=1)
    ll = copies_matrix(choice, EP, EXPERTS, per_expert=True)
    assert ll.sum(axis=1) == pytest.approx(np.full(EP, TOKENS * TOP_K))
    per = EXPERTS // EP  # rank j hosts the contiguous experts [j·per, (j + 1)·per)
    for j in range(EP):
        on_j = (choice >= j * per) & (choice < (j + 1) * per)
        np.testing.assert_array_equal(ll[:, j], on_j.sum(axis=(1, 2)))


def test_copy_matrices_of_a_hand_worked_routing() -> None:
    # 2 ranks × 4 experts (rank 0 hosts 0–1, rank 1 hosts 2–3), 2 tokens per rank, top-2
    choice = np.array([[[0, 1], [1, 3]],    # rank 0: token 0 → rank 0 twice; token 1 → ranks 0, 1
                       [[2, 3], [0, 2]]])   # rank 1: token 0 → rank 1 twice; token 1 → ranks 0, 1
    np.testing.assert_array_equal(copies_matrix(choice, 2, 4, per_expert=True), [[3, 1], [1, 3]])
    np.testing.assert_array_equal(copies_matrix(choice, 2, 4, per_expert=False), [[2, 1], [1, 2]])


def test_high_throughput_copies_one_per_destination_rank() -> None:
    choice = _route(seed=2)
    ht = copies_matrix(choice, EP, EXPERTS, per_expert=False)
    ll = copies_matrix(choice, EP, EXPERTS, per_expert=True)
    hosts = choice // (EXPERTS // EP)
    distinct = np.array([[len(set(t)) for t in hosts[s]] for s in range(EP)])
    assert ht.sum(axis=1) == pytest.approx(distinct.sum(axis=1))  # Σ over tokens of their ranks
    assert (ht <= TOKENS).all() and (ht <= ll).all()  # a token reaches a rank at most once
    assert (ht.sum(axis=1) >= TOKENS).all() and (ht.sum(axis=1) <= TOKENS * TOP_K).all()
    assert ht.sum() < ll.sum()  # 4 experts on 16 ranks of 4 experts each: some tokens share a rank


def test_one_expert_per_rank_makes_both_modes_equal() -> None:
    choice = _route(seed=3, ep=EXPERTS)  # distinct experts live on distinct ranks
    ht = copies_matrix(choice, EXPERTS, EXPERTS, per_expert=False)
    np.testing.assert_array_equal(ht, copies_matrix(choice, EXPERTS, EXPERTS, per_expert=True))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_receive_imbalance_grows_with_the_zipf_exponent(seed: int) -> None:
    """The busiest rank's share of received copies (max/mean) rises strictly with the exponent."""
    imbalance = []
    for s in (0.0, 0.4, 0.8, 1.2, 1.6):
        recv = copies_matrix(_route(seed, s), EP, EXPERTS, per_expert=True).sum(axis=0)
        imbalance.append(recv.max() / recv.mean())
    assert imbalance[0] < 1.1  # uniform: every rank receives about the same
    assert all(b > a for a, b in zip(imbalance, imbalance[1:], strict=False)), imbalance
