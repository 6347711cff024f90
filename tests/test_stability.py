"""Whether a served run keeps up (workloads/llm_infer/stability.py): the rise of the backlog's floor
gives the served share of the arrival rate — 1 in a steady state, 1 − ε under an overload by ε —
and a burst at the window's end, which the two-ends count reads as a shortfall of h ÷ A, leaves it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from workloads.llm_infer.deployment import load_word, regime
from workloads.llm_infer.stability import (
    backlog,
    served_fractions,
    served_rate_fraction,
    window_served_fraction,
)

T0, T1, RATE = 10.0, 70.0, 20.0  # a 60 s window at 20 items/s


def steady(delay: float = 1.3) -> tuple[np.ndarray, np.ndarray]:
    enter = np.arange(0.0, T1 + 20, 1 / RATE)
    return enter, enter + delay


def test_steady_state_serves_the_whole_rate_whatever_the_delay() -> None:
    for delay in (0.2, 1.3, 9.0):
        enter, leave = steady(delay)
        assert served_rate_fraction(enter, leave, np.ones_like(enter), T0, T1) == pytest.approx(1.0, abs=2e-3)


@pytest.mark.parametrize("eps", [0.02, 0.05, 0.1, 0.3])
def test_an_overload_by_eps_serves_one_minus_eps(eps: float) -> None:
    """FIFO service at (1 − ε) of the arrival rate from t = 0: the backlog grows at ε·λ."""
    enter = np.arange(0.0, T1 + 20, 1 / RATE)
    leave = 0.5 + np.arange(len(enter)) / (RATE * (1 - eps))
    w = np.ones_like(enter)
    assert served_rate_fraction(enter, leave, w, T0, T1) == pytest.approx(1 - eps, abs=3e-3)
    # never-served items (NaN leave) count in the backlog
    cut = leave > 40.0
    leave_nan = np.where(cut, np.nan, leave)
    assert served_rate_fraction(enter, leave_nan, w, T0, T1) < 1 - eps


def test_a_burst_at_the_end_leaves_the_floor_but_fails_the_two_ends_count() -> None:
    """Steady traffic plus a burst of h items (6 % of the window's) arriving 1 s before its end and
    served 1.5 s later: the two ends read 1 − h ÷ A < 0.95, the floor does not move."""
    enter, leave = steady(0.5)
    h, d, t = 0.06 * RATE * (T1 - T0), 1.0, T1 - T0
    enter = np.concatenate([enter, [T1 - d]])
    leave = np.concatenate([leave, [T1 - d + 1.5]])
    w = np.concatenate([np.ones(len(enter) - 1), [h]])
    arrived = RATE * t + h
    assert window_served_fraction(enter, leave, w, T0, T1) == pytest.approx(1 - h / arrived, abs=2e-3)
    assert window_served_fraction(enter, leave, w, T0, T1) < 0.95
    assert served_rate_fraction(enter, leave, w, T0, T1) == pytest.approx(1.0, abs=2e-3)


def test_a_light_window_whose_requests_mostly_arrive_at_its_end_keeps_up() -> None:
    """azure_code's shape at a tenth of capacity: 120 requests spread over the window, then 120 more
    within its last 2 s, served FIFO at 30 /s (the burst drains 2 s after the window): it keeps up."""
    rng = np.random.default_rng(0)
    enter = np.sort(np.concatenate([rng.uniform(0, T1 - 2, 120), rng.uniform(T1 - 2, T1, 120)]))
    leave = np.empty_like(enter)
    free = 0.0
    for i, a in enumerate(enter):
        free = leave[i] = max(free, a) + 1 / 30
    w = rng.integers(100, 8000, len(enter)).astype(float)
    assert window_served_fraction(enter, leave, w, T0, T1) < 0.95
    assert served_rate_fraction(enter, leave, w, T0, T1) == pytest.approx(1.0, abs=1e-3)


def test_a_backlog_draining_from_before_the_window_reads_above_one() -> None:
    enter, leave = steady(0.5)
    extra = np.full(200, 5.0)  # 200 items queued at t = 5 s, served through the window at 4 /s
    enter = np.concatenate([enter, extra])
    leave = np.concatenate([leave, 5.0 + np.arange(1, 201) / 4.0])
    assert served_rate_fraction(enter, leave, np.ones_like(enter), T0, T1) > 1.05


def test_nothing_arriving_is_nan() -> None:
    assert np.isnan(served_rate_fraction(np.array([1.0]), np.array([2.0]), np.ones(1), T0, T1))


@given(st.lists(st.tuples(st.floats(0, 50), st.floats(0, 10), st.booleans(), st.integers(1, 9)), min_size=1, max_size=40),
       st.lists(st.floats(0, 60), min_size=1, max_size=10))
def test_backlog_counts_what_entered_and_has_not_left(items: list, times: list) -> None:
    enter = np.array([a for a, _, _, _ in items])
    leave = np.array([a + s if done else np.nan for a, s, done, _ in items])
    w = np.array([x for *_, x in items], float)
    t = np.array(times)
    brute = [sum(wi for e, lv, wi in zip(enter, leave, w, strict=True) if e <= tt and not (lv <= tt)) for tt in t]
    assert backlog(enter, leave, w, t) == pytest.approx(brute)


# ------------------------------------------------------------------ the regime note's queue reading
def _frame(enter: np.ndarray, first: np.ndarray) -> pd.DataFrame:
    """A request frame: prompts of 100 tokens, one output token (decode never queues)."""
    return pd.DataFrame({"arrival_s": enter, "first_token_s": first, "input_tokens": np.full(len(enter), 100.0),
                         "output_tokens": np.ones(len(enter)), "decode_start_s": first})


def test_served_fractions_read_the_queue_a_run_leaves() -> None:
    enter = np.arange(0.0, T1 + 20, 1 / RATE)
    steady_fr = served_fractions(_frame(enter, enter + 0.4), T0, T1)
    assert steady_fr["served_fraction"] == pytest.approx(1.0, abs=2e-3)
    # prefill served FIFO at 40 % of the arrival rate: the backlog floor rises at 0.6 λ
    slow = served_fractions(_frame(enter, 0.4 + np.arange(len(enter)) / (RATE * 0.4)), T0, T1)
    assert slow["prefill_served_fraction"] == pytest.approx(0.4, abs=5e-3)
    assert slow["served_fraction"] == slow["prefill_served_fraction"]
    assert np.isnan(slow["decode_served_fraction"])  # no request decodes: no decode queue, not a shortfall


@pytest.mark.parametrize("offered, served, word", [
    (0.2, 1.0, "under-load"), (0.6, 1.0, "moderate load"), (0.9, 0.99, "near capacity"),
    (3.4, 0.3, "overload"),  # offered beyond the analytic capacity
    (0.7, 0.8, "overload"),  # below it on paper, but the measured backlog grows
    (1.2, float("nan"), "overload"),  # no backlog reading: the analytic side decides
    (0.4, float("nan"), "under-load"),
])
def test_the_regime_word_is_judged_from_the_offered_rate_and_the_queue(offered: float, served: float,
                                                                       word: str) -> None:
    assert load_word(offered, served, 0.95) == word


def test_an_overloaded_run_is_named_overload_with_its_backlog_and_its_model() -> None:
    """A run like issue 32's Qwen3-235B-A22B one: 15 req/s offered on a 4.4 req/s layout that completes
    3.5 req/s in its window (79 % of capacity, "moderate load" when judged by the completed rate)."""
    m = {"prefill_capacity_req_per_s": 4.43, "decode_capacity_req_per_s": 16.3, "offered_req_per_s": 15.0,
         "offered_load_fraction": 15.0 / 4.43, "requests_per_s": 3.5, "served_fraction": 0.31,
         "backlog_growth_req_per_s": 15.0 * 0.69, "ttft_p99_s": 121.0, "prefill_die_busy_fraction": 0.97,
         "mean_decode_batch_per_die": 1.0, "decode_batch_fraction": 0.52, "decode_slo_batch_per_die": 2.0,
         "prefill_served_fraction": 0.31, "decode_served_fraction": 1.0}
    note = regime("hccl", m, "Qwen3-235B-A22B (qwen3_moe, /m/Qwen3-235B-A22B/config.json)", 0.95)
    assert note.startswith("hccl regime, model Qwen3-235B-A22B (qwen3_moe, /m/Qwen3-235B-A22B/config.json): "
                           "overload, prefill-bound — 15 req/s offered is 339% of the layout's analytic capacity")
    assert "the prefill queue grows: the run serves 31% of the arrival rate, the backlog growing by 10.3 req/s" in note
    assert "TTFT p99 121 s" in note and "moderate" not in note
    kept = regime("hccl", {**m, "offered_req_per_s": 2.0, "offered_load_fraction": 2.0 / 4.43,
                           "served_fraction": 1.0}, "x", 0.95)
    assert ": under-load, prefill-bound" in kept and "the queue keeps up" in kept
