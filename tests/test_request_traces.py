"""Bundled public request traces: recorded replay is exact, scaling keeps lengths and order, bad
request tables are refused cell by cell."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers import compose_run

from stratacl.errors import ConfigError
from workloads.llm_infer.requests import TRACES_DIR, describe, generate


def _cfg(**kw: object):  # noqa: ANN202
    cfg = compose_run(["workload=llm_infer"]).workload.requests
    cfg.arrival = "trace"
    for k, v in kw.items():
        setattr(cfg, k, v)
    return cfg


@pytest.mark.parametrize("name", ["azure_conv", "azure_code", "mooncake_conv"])
def test_recorded_replay_is_exact(name: str) -> None:
    raw = pd.read_csv(TRACES_DIR / f"{name}.csv")
    cfg = _cfg(trace=name, trace_timing="recorded", duration_s=120.0)
    reqs = generate(cfg, seed=0)
    t = raw["arrived_at"].to_numpy() - raw["arrived_at"].iloc[0]
    n = int((t < 120.0).sum())
    assert len(reqs) == n
    np.testing.assert_allclose(reqs.arrival_s, np.sort(t)[:n])
    np.testing.assert_array_equal(reqs.input_tokens, raw["num_prefill_tokens"].to_numpy()[np.argsort(t, kind="stable")][:n])
    np.testing.assert_array_equal(reqs.output_tokens, raw["num_decode_tokens"].to_numpy()[np.argsort(t, kind="stable")][:n])


def test_scaling_hits_the_rate_and_preserves_lengths_and_order() -> None:
    slow = generate(_cfg(trace="azure_conv", rate=2.0, duration_s=60.0), seed=0)
    fast = generate(_cfg(trace="azure_conv", rate=8.0, duration_s=60.0), seed=0)
    assert len(slow) == 120 and len(fast) == 480  # exactly rate × duration
    np.testing.assert_array_equal(fast.input_tokens[:120], slow.input_tokens)  # same requests, same order
    np.testing.assert_array_equal(fast.output_tokens[:120], slow.output_tokens)
    gaps_s, gaps_f = np.diff(slow.arrival_s), np.diff(fast.arrival_s[:120])
    ratio = gaps_s[gaps_s > 0] / gaps_f[gaps_s > 0]
    assert np.allclose(ratio, ratio[0])  # one time-scale factor: relative burstiness kept
    assert "= 8.00 req/s" in describe(fast, _cfg(trace="azure_conv", rate=8.0), 60.0)


def test_rate_beyond_the_trace_is_refused() -> None:
    with pytest.raises(ConfigError, match="workload.requests.rate"):
        generate(_cfg(trace="azure_code", rate=1000.0, duration_s=60.0), seed=0)


@pytest.mark.parametrize("cell, column", [("abc", "arrival_s"), ("", "input_tokens"), ("nan", "arrival_s"),
                                          ("inf", "arrival_s"), ("-3", "output_tokens"), ("2.5", "input_tokens")])
def test_bad_csv_cell_names_row_and_column(tmp_path, cell: str, column: str) -> None:  # noqa: ANN001
    rows = {"arrival_s": ["0", "1"], "input_tokens": ["10", "20"], "output_tokens": ["5", "6"]}
    rows[column][1] = cell
    path = tmp_path / "r.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    cfg = _cfg(arrival="csv", csv=str(path))
    with pytest.raises(ConfigError, match=f"row 2, column '{column}'"):
        generate(cfg, seed=0)
