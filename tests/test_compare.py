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
