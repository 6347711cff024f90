"""Metric helpers: nccl-tests conventions are covered in test_closed_forms; interval unions and the
serving latency percentiles' window here."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from stratacl.metrics import latency_percentiles, measured_requests, union_length


def test_union_length_merges_overlaps_and_keeps_gaps() -> None:
    # [0,2) ∪ [1,3) ∪ [5,6) ∪ [5.5,5.7) = 3 + 1
    assert union_length([5.0, 0.0, 1.0, 5.5], [6.0, 2.0, 3.0, 5.7]) == pytest.approx(4.0)
    assert union_length([], []) == 0.0


def _requests(arrivals: list[float], ttft: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"arrival_s": arrivals, "ttft_s": ttft, "tpot_s": [0.01] * len(ttft),
                         "e2e_s": [t + 1 for t in ttft]})


def test_latency_percentiles_count_only_requests_arriving_in_the_window() -> None:
    # a cold start (warm-up requests wait 10 s) and one arrival after the window must not count
    req = _requests([0.0, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0], [10.0, 10.0, 0.1, 0.2, 0.3, 0.4, 50.0])
    p = latency_percentiles(req, warmup_s=1.0, end_s=5.0)
    inside = np.array([0.1, 0.2, 0.3, 0.4])
    assert p["ttft_p99_s"] == pytest.approx(np.percentile(inside, 99))
    assert p["ttft_p50_s"] == pytest.approx(0.25) and p["e2e_p90_s"] == pytest.approx(np.percentile(inside + 1, 90))
    assert set(p) == {f"{m}_p{q}_s" for m in ("ttft", "tpot", "e2e") for q in (50, 90, 99)}
    # all requests would read the cold start as the tail
    assert np.percentile(req["ttft_s"], 99) > 40


def test_a_window_with_no_arrival_counts_every_request() -> None:
    req = _requests([0.0, 0.5], [1.0, 3.0])
    assert len(measured_requests(req, warmup_s=2.0, end_s=5.0)) == 2
    assert latency_percentiles(req, 2.0, 5.0)["ttft_p50_s"] == pytest.approx(2.0)
    nan = latency_percentiles(_requests([1.0], [float("nan")]), 0.0, 5.0)["ttft_p99_s"]
    assert np.isnan(nan)  # not served: no percentile (not 0)
