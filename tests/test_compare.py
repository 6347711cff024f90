"""The one comparison helper: ratios vs the baseline (summary.json) and side-by-side tables."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from stratacl.compare import metric_table, pivot_table, ratios


def test_ratios_against_baseline_and_null_where_undefined() -> None:
    r = ratios({"a": {"t": 2.0, "z": 0.0, "u": math.nan}, "b": {"t": 1.0, "z": 3.0, "u": 1.0}}, "a")
    assert r["b"]["t"] == 0.5 and r["a"]["t"] == 1.0
    assert r["b"]["z"] is None  # baseline 0: no ratio
    assert r["b"]["u"] is None  # baseline undefined
    json.dumps(r, allow_nan=False)  # strict JSON


def test_metric_table_values_and_ratios_in_library_order() -> None:
    t = metric_table({"base": {"x": 2.0, "y": 4.0}, "new": {"x": 1.0, "y": 8.0}}, "base")
    assert list(t.columns) == ["metric", "base", "new", "new/base"]
    assert t.set_index("metric").loc["y", "new/base"] == pytest.approx(2.0)
    only = metric_table({"base": {"x": 2.0, "y": 4.0}, "new": {"x": 1.0, "y": 8.0}}, "base", ["y"])
    assert list(only["metric"]) == ["y"]


def test_pivot_table_from_long_rows() -> None:
    rows = pd.DataFrame({"size": [1, 2, 1, 2], "library": ["a", "a", "b", "b"], "bw": [1.0, 2.0, 3.0, 8.0]})
    t = pivot_table(rows, ["size"], "bw", ["b", "a"], "a")
    assert list(t.columns) == ["size", "b", "a", "b/a"]
    assert list(t["b/a"]) == [3.0, 4.0]


def test_side_by_side_ratio_is_undefined_where_the_baseline_is_zero() -> None:
    """The printed tables agree with summary.json: no inf where `ratios` gives null."""
    t = metric_table({"base": {"x": 0.0, "y": 2.0, "z": math.inf}, "new": {"x": 3.0, "y": 1.0, "z": 1.0}},
                     "base").set_index("metric")
    assert math.isnan(t.loc["x", "new/base"]) and math.isnan(t.loc["z", "new/base"])
    assert t.loc["y", "new/base"] == pytest.approx(0.5)


def test_printed_side_by_side_tables_carry_units() -> None:
    """The per-size / per-op / per-iteration table the CLI prints before the metric table says
    what its numbers are in: the pivoted value's unit on every library column, × on ratios."""
    from stratacl.report.text import report_lines

    rows = pd.DataFrame({"iteration": [0, 0, 100, 100], "library": ["hccl", "stratacl"] * 2,
                         "iteration_time_s": [2.0, 1.0, 2.2, 1.1]})
    t = pivot_table(rows, ["iteration"], "iteration_time_s", ["hccl", "stratacl"], "hccl")
    summary = {"libraries": {"hccl": {"iteration_time_s": 2.1}, "stratacl": {"iteration_time_s": 1.05}},
               "baseline": "hccl"}
    lines = report_lines("llm_train", summary, detail=t)
    assert lines[0].startswith("iteration_time_s per library [s]")
    assert lines[1].splitlines()[0].split() == ["iteration", "hccl", "[s]", "stratacl", "[s]", "stratacl/hccl", "[×]"]
    bw = pivot_table(rows.rename(columns={"iteration_time_s": "busbw_GBps"}), ["iteration"], "busbw_GBps",
                     ["hccl", "stratacl"], "hccl")
    assert "hccl [GB/s]" in report_lines("collectives", summary, detail=bw)[1].splitlines()[0]


def test_every_metric_row_has_a_unit() -> None:
    """Names no direction entry lists still print a unit: read off the name, else 1 (a count)."""
    from stratacl.report.text import table_lines

    names = ["iteration_time_s", "prefix_hit_rate_blocks", "decode_dp", "mtp", "prefill_token_budget",
             "decode_max_batch", "ep_imbalance", "served_fraction", "some_new_bytes", "wait_ms"]
    metrics = {"a": dict.fromkeys(names, 1.0), "b": dict.fromkeys(names, 2.0)}
    body = table_lines(metrics, "a", "llm_train")[2:-1]  # header and rule first, legend last
    units = {ln.split()[0]: ln.split()[1] for ln in body}
    assert units == {"iteration_time_s": "s", "prefix_hit_rate_blocks": "%", "decode_dp": "dies", "mtp": "flag",
                     "prefill_token_budget": "tokens", "decode_max_batch": "seq", "ep_imbalance": "1",
                     "served_fraction": "%", "some_new_bytes": "B", "wait_ms": "ms"}
