"""Bundled public request traces: recorded replay is exact, scaling keeps lengths and order, bad
request tables are refused cell by cell."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from helpers import compose_run, merged, run_cli

from stratacl.config import validate_run
from stratacl.errors import ConfigError
from workloads.llm_infer.requests import (
    TRACES_DIR,
    describe,
    generate,
    window_end,
    window_note,
    window_start,
)


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


# --------------------------------------------------------------------------- a user's own table

EXAMPLE = TRACES_DIR.parent / "examples" / "requests.csv"


def _table(path, arrivals) -> str:  # noqa: ANN001
    pd.DataFrame({"arrival_s": arrivals, "input_tokens": 256, "output_tokens": 8}).to_csv(path, index=False)
    return str(path)


def _infer(*overrides: str):  # noqa: ANN202
    return compose_run(["workload=llm_infer", *overrides])


def test_the_example_table_reads_with_its_documented_columns() -> None:
    reqs = generate(_infer("workload.requests.arrival=csv", f"workload.requests.csv={EXAMPLE}").workload.requests, 0)
    raw = pd.read_csv(EXAMPLE)
    assert list(raw.columns) == ["arrival_s", "input_tokens", "output_tokens"] and len(reqs) == len(raw)
    np.testing.assert_array_equal(reqs.input_tokens, raw["input_tokens"])


def test_a_table_is_measured_over_its_own_span(tmp_path) -> None:  # noqa: ANN001
    path = _table(tmp_path / "r.csv", np.arange(0, 300, 1.0))  # 300 s, past the 60 s default duration_s
    cfg = _infer("workload.requests.arrival=csv", f"workload.requests.csv={path}").workload
    validate_run(_infer("workload.requests.arrival=csv", f"workload.requests.csv={path}"))
    reqs = generate(cfg.requests, 0)
    end = window_end(reqs, cfg.requests)  # just past the last arrival: the half-open window holds it
    assert len(reqs) == 300 and end == np.nextafter(299.0, np.inf) and (reqs.arrival_s < end).all()
    assert "[10, 299] s (after the 10 s warm-up, to the table's last arrival)" in window_note(reqs, cfg.requests, 10.0)
    cfg.requests.csv_window = "duration"  # the knob: measure [warmup_s, duration_s) and serve only those rows
    reqs = generate(cfg.requests, 0)
    assert len(reqs) == 60 and window_end(reqs, cfg.requests) == 60.0
    assert "[10, 60) s" in window_note(reqs, cfg.requests, 10.0) and "before duration_s = 60 s" in \
        describe(reqs, cfg.requests, 60.0)


def test_a_table_shorter_than_the_warm_up_is_refused(tmp_path) -> None:  # noqa: ANN001
    path = _table(tmp_path / "r.csv", np.linspace(0, 5, 20))
    with pytest.raises(ConfigError) as err:
        validate_run(_infer("workload.requests.arrival=csv", f"workload.requests.csv={path}"))
    assert err.value.field == "workload.warmup_s" and "last request arrives at 5 s" in err.value.problem
    validate_run(_infer("workload.requests.arrival=csv", f"workload.requests.csv={path}", "workload.warmup_s=1"))
    with pytest.raises(ConfigError) as err:  # the duration window holding none of the table's rows
        validate_run(_infer("workload.requests.arrival=csv", f"workload.requests.csv={path}", "workload.warmup_s=6",
                            "workload.requests.duration_s=30", "workload.requests.csv_window=duration"))
    assert err.value.field == "workload.requests.duration_s"


def test_a_window_that_falls_back_to_zero_says_so() -> None:
    assert window_start(np.array([0.0, 1.0, 2.0]), 5.0, 60.0) == 0.0  # no arrival after the warm-up
    assert window_start(np.array([0.0, 6.0]), 5.0, 60.0) == 5.0
    cfg = _cfg(trace="azure_conv", trace_timing="recorded", duration_s=60.0)
    reqs = generate(cfg, 0)
    cut = type(reqs)(reqs.arrival_s[reqs.arrival_s < 5], reqs.input_tokens[reqs.arrival_s < 5],
                     reqs.output_tokens[reqs.arrival_s < 5])
    assert "[0, 60) s (from 0 s: no request arrives after the 5 s warm-up" in window_note(cut, cfg, 5.0)


@pytest.mark.parametrize("overrides, field", [
    (["workload.requests.csv={path}"], "workload.requests.csv"),  # a table without arrival=csv
    (["workload.requests.arrival=poisson", "workload.requests.csv={path}"], "workload.requests.csv"),
    (["workload.requests.arrival=csv"], "workload.requests.csv"),  # arrival=csv without a table
    (["workload.requests.arrival=csv", "workload.requests.csv={missing}"], "workload.requests.csv"),
    (["workload.requests.arrival=csv", "workload.requests.csv={columns}"], "workload.requests.csv"),
])
def test_a_table_given_the_wrong_way_is_refused_before_the_run(tmp_path, overrides, field) -> None:  # noqa: ANN001
    path = _table(tmp_path / "r.csv", np.arange(0, 30, 1.0))
    (tmp_path / "c.csv").write_text("time,prompt,output\n0,1,1\n")
    fill = {"path": path, "missing": tmp_path / "none.csv", "columns": tmp_path / "c.csv"}
    with pytest.raises(ConfigError) as err:
        validate_run(_infer(*(o.format(**fill) for o in overrides)))
    assert err.value.field == field and err.value.fix


def test_a_csv_run_reports_its_own_window(tmp_path) -> None:  # noqa: ANN001
    """A 30-s table at 2 req/s on the tiny model: the note names [2, 29.5] s and the served rate is
    the table's (60 requests over [2, 60) would read as half of it)."""
    from test_user_loop import TINY_SERVE

    path = _table(tmp_path / "r.csv", np.arange(0, 30, 0.5))
    out = tmp_path / "run"
    proc = run_cli(merged(TINY_SERVE, ["workload.requests.arrival=csv", f"workload.requests.csv={path}",
                                       "workload.warmup_s=2", f"hydra.run.dir={out}"]), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "statistics over requests arriving in [2, 29.5] s (after the 2 s warm-up, to the table's last arrival)" \
        in proc.stdout
    rate = json.loads((out / "summary.json").read_text())["libraries"]["hccl"]["requests_per_s"]
    assert rate == pytest.approx(2.0, rel=0.1)
