"""How far to trust a verdict: the validation groups saved by `python -m stratacl.validate --trust`
(stratacl/validate/trust.py) and the report's `trust:` lines (stratacl/report/trust.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from stratacl.report import trust as report_trust
from stratacl.validate import kernels
from stratacl.validate import trust as validate_trust


@dataclass
class _Row:
    group: str
    role: str
    fabric: str = ""


def test_groups_take_the_median_and_worst_absolute_error_per_group_and_role() -> None:
    rows = [(_Row("a", "check", "x"), 0.0, 0.1), (_Row("a", "check", "x"), 0.0, -0.3), (_Row("a", "check", "y"), 0.0, 0.2),
            (_Row("a", "calibrate", "x"), 0.0, 0.05), (_Row("b", "check"), 0.0, -0.4)]
    out = {(g["group"], g["role"]): g for g in validate_trust.groups(rows, "s", None)}
    a = out[("a", "check")]
    assert (a["rows"], a["median_abs_error"], a["worst_abs_error"], a["fabrics"]) == (3, 0.2, 0.3, ["x", "y"])
    assert out[("a", "calibrate")]["rows"] == 1
    assert validate_trust.groups(rows[-1:], "s", "cm")[0]["fabrics"] == ["cm"]  # one fabric for a whole section


def _file(tmp_path: Path, groups: list[dict]) -> Path:
    p = tmp_path / "trust.json"
    p.write_text(json.dumps({"written_by": "test", "groups": groups}))
    return p


def test_trust_lines_name_the_fabrics_check_groups_worst_first(tmp_path: Path) -> None:
    g = lambda name, fab, med, role="check": {"group": name, "role": role, "rows": 2, "median_abs_error": med,  # noqa: E731
                                              "worst_abs_error": med * 2, "fabrics": [fab]}
    path = _file(tmp_path, [g("mild", "cm", 0.05), g("bad", "cm", 0.3), g("gpu", "h100", 0.01),
                            g("fitted", "cm", 0.0, role="calibrate")])
    lines = report_trust.trust_lines("cm", path=path)
    assert "cm" in lines[0]
    assert [ln.split()[0] for ln in lines[1:]] == ["bad", "mild"]  # check rows only, worst median first
    assert "30.0% median / 60.0% worst (2 rows)" in lines[1]
    assert "no check rows run on tpu" in report_trust.trust_lines("tpu", path=path)[0]
    assert "no validation file" in report_trust.trust_lines("cm", path=tmp_path / "missing.json")[0]
    (tmp_path / "bad.json").write_text("{not json")
    assert "no validation file" in report_trust.trust_lines("cm", path=tmp_path / "bad.json")[0]
    # a workload skips the groups its numbers do not rest on
    moe = _file(tmp_path, [g("cm384 moe ll", "cm", 0.3), g("ub p2p", "cm", 0.1)])
    assert [ln.split()[0] for ln in report_trust.trust_lines("cm", "dlrm_train", moe)[1:]] == ["ub"]
    assert len(report_trust.trust_lines("cm", "llm_infer", moe)) == 3
    ratio = _file(tmp_path, [{**g("ratio", "cm", 0.5), "error": "absolute"}, g("rel", "cm", 0.9)])
    lines = report_trust.trust_lines("cm", path=ratio)
    assert "±0.50 in the ratio" in lines[1] and "90.0%" in lines[2]  # ratio groups first, their error absolute


def test_the_saved_kernel_groups_are_the_codes_current_errors() -> None:
    # the shipped file is rewritten with `python -m stratacl.validate --trust --operators` when a
    # parameter moves; the kernel groups (cheap to recompute) must match it
    doc = report_trust.load()
    assert doc is not None, "stratacl/data/validation/trust.json: run python -m stratacl.validate --trust --operators"
    saved = {(g["group"], g["role"]): g for g in doc["groups"] if g["section"] == "kernels"}
    now = validate_trust.groups(kernels.evaluate(kernels.load_table(kernels.TABLE)), "kernels")
    assert now and len(now) == len(saved)
    for g in now:
        s = saved[(g["group"], g["role"])]
        assert s["rows"] == g["rows"]
        assert s["median_abs_error"] == pytest.approx(g["median_abs_error"], abs=1e-9)
    assert {s for g in doc["groups"] for s in [g["section"]]} >= {"kernels", "operators", "cloudmatrix384"}
