"""The one routing module: Zipf popularity, sampled routing and the expected hottest-rank load
agree with each other and with their closed forms."""

from __future__ import annotations

import numpy as np
import pytest

from stratacl.errors import ConfigError
from workloads.common.errors import CostInputError
from workloads.common.routing import (
    RoutingModel,
    copies_matrix,
    dispatch_rows,
    expert_weights,
    imbalance,
    route,
    zipf_exponent,
    zipf_shares,
)
from workloads.llm_train.schema import SkewScheduleConfig

N, EP, TOP_K = 32, 4, 4


def test_zipf_shares_are_a_placement_of_the_zipf_law() -> None:
    s = zipf_shares(N, 1.2, np.random.default_rng(3))
    law = 1.0 / np.arange(1, N + 1) ** 1.2
    np.testing.assert_allclose(np.sort(s)[::-1], law / law.sum())
    assert s.sum() == pytest.approx(1.0)
    assert not np.all(np.diff(s) <= 0)  # placed at random, not in rank order


def test_every_user_draws_the_same_popularity() -> None:
    """Serving weights, the modelcost expected load and a zero-exponent schedule are one law."""
    w = expert_weights(N, "zipf", 0.8, seed=5)
    np.testing.assert_array_equal(w, zipf_shares(N, 0.8, np.random.default_rng(5)))
    np.testing.assert_array_equal(RoutingModel("zipf", 0.8, seed=5).expert_share(N), w)
    np.testing.assert_allclose(expert_weights(N, "uniform"), RoutingModel().expert_share(N))


def test_expected_rank_load_matches_sampled_routing() -> None:
    """Law of large numbers: the mean of many sampled routings approaches RoutingModel's load."""
    model = RoutingModel("zipf", 1.0, seed=2)
    load = model.rank_load(N, EP)
    assert load.mean() == pytest.approx(1.0)
    tokens = 4000
    rng = np.random.default_rng(0)
    choice = route(tokens, EP, N, 1, model.expert_share(N), rng)  # top_1: copies ∝ share exactly
    recv = copies_matrix(choice, EP, N, per_expert=True).sum(axis=0)
    np.testing.assert_allclose(recv / recv.mean(), load, rtol=0.05)
    # the hottest rank's expected rows: what the sampled hottest rank received from all EP ranks
    assert model.rows_on_rank(tokens, 1, N, EP) == pytest.approx(recv.max(), rel=0.05)
    assert model.rows_on_rank(tokens, 1, N, EP) > tokens  # above the mean under skew
    # uniform routing: every rank processes exactly tokens × top_k rows (docstring of RoutingModel)
    assert RoutingModel().rows_on_rank(tokens, TOP_K, N, EP) == tokens * TOP_K


def test_dispatch_rows_conserve_tokens_and_follow_the_layer_placement() -> None:
    tokens, seed, layer = 2000, 1, 3
    rows = [dispatch_rows(EP, N, TOP_K, tokens, 1.0, seed, layer, it) for it in range(20)]
    for r in rows:
        np.testing.assert_array_equal(r.sum(axis=1), tokens * TOP_K)  # every rank routes all its rows
    share = zipf_shares(N, 1.0, np.random.default_rng([seed, layer, 0]))
    mean_recv = np.mean([r.sum(axis=0) for r in rows], axis=0)
    per = N // EP  # rank j hosts the contiguous experts [j·per, (j + 1)·per)
    rank_share = np.array([share[j * per:(j + 1) * per].sum() for j in range(EP)])
    np.testing.assert_allclose(mean_recv, EP * tokens * TOP_K * rank_share, rtol=0.03)
    assert imbalance(rows[0]) >= 1.0


def test_skew_schedule_decays_from_start_to_end() -> None:
    sched = SkewScheduleConfig(start=1.2, end=0.2, decay_iters=100)
    assert zipf_exponent(sched, 0) == pytest.approx(1.2)
    assert zipf_exponent(sched, 100) == pytest.approx(0.2 + 1.0 / np.e)
    assert zipf_exponent(sched, 10**6) == pytest.approx(0.2)


def test_copies_matrix_ht_mode_counts_a_token_once_per_rank() -> None:
    choice = np.array([[[0, 1, 9]], [[31, 30, 8]], [[2, 3, 4]], [[16, 24, 25]]])  # (ep, 1 token, k=3)
    ll = copies_matrix(choice, EP, N, per_expert=True)
    ht = copies_matrix(choice, EP, N, per_expert=False)
    np.testing.assert_array_equal(ll.sum(axis=1), 3)
    np.testing.assert_array_equal(ht[0], [1, 1, 0, 0])  # experts 0, 1 on rank 0; 9 on rank 1
    np.testing.assert_array_equal(ht[3], [0, 0, 1, 1])


def test_bad_routing_input_names_its_field() -> None:
    with pytest.raises(ConfigError, match="workload.ep"):
        route(4, 3, N, TOP_K, np.ones(N) / N, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="workload.skew"):
        expert_weights(N, "pareto")
    with pytest.raises(CostInputError):
        RoutingModel("pareto")
    with pytest.raises(CostInputError):
        RoutingModel().rank_load(N, 3)
