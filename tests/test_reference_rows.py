"""REFERENCE §5 operator rows as validation rows: the pass rule, and the rows as the harness computes them."""

from __future__ import annotations

import math

import pytest

from stratacl.validate import cm384_ops
from stratacl.validate.reference_rows import TOLERANCE, RefRow, table


def _r(target: float, harness: float, unit: str = "ratio", relation: str = "=") -> RefRow:
    return RefRow("x", "g", "check", target, harness, unit, "what", relation=relation)


def test_pass_rule_is_absolute_for_ratios_relative_otherwise() -> None:
    assert _r(1.6, 1.6 + TOLERANCE * 0.99).ok and not _r(1.6, 1.6 + TOLERANCE * 1.01).ok
    assert _r(100.0, 114.0, unit="GB/s").ok and not _r(100.0, 116.0, unit="GB/s").ok
    assert _r(100.0, 80.0, unit="GB/s").error == pytest.approx(-0.2)
    # a bound is met by anything beyond it, and by a shortfall within the tolerance
    assert _r(1.3, 5.0, relation=">=").ok and _r(1.3, 1.2, relation=">=").ok and not _r(1.3, 1.1, relation=">=").ok
    assert _r(0.05, 0.0, unit="fraction", relation="<=").ok and not _r(0.05, 0.3, unit="fraction", relation="<=").ok
    # a fraction (a slowdown) is judged relatively: 6.8 % for a published 13 % is off
    assert not _r(0.13, 0.068, unit="fraction").ok and _r(0.25, 0.27, unit="fraction").ok
    with pytest.raises(ValueError, match="role"):
        RefRow("x", "g", "fit", 1.0, 1.0, "ratio", "what")
    with pytest.raises(ValueError, match="relation"):
        RefRow("x", "g", "check", 1.0, 1.0, "ratio", "what", relation="~")


def test_table_lists_calibration_rows_first_and_names_what_is_missing() -> None:
    rows = [RefRow("c1", "g", "check", 1.0, 3.0, "ratio", "w", missing="a mechanism"),
            RefRow("k1", "g", "calibrate", 1.0, 1.0, "ratio", "w", sets="knob")]
    text = table(rows).splitlines()
    assert text[1].startswith("k1") and text[2].startswith("c1")
    assert "OFF (a mechanism)" in text[2]


@pytest.fixture(scope="module")
def collective_rows() -> list[RefRow]:
    return cm384_ops.collective_rows() + cm384_ops.partition_rows()


def test_collective_rows_are_finite_named_and_say_what_is_missing(collective_rows: list[RefRow]) -> None:
    ids = [r.id for r in collective_rows]
    assert len(ids) == len(set(ids))
    assert all(math.isfinite(r.harness) and r.harness != 0 for r in collective_rows)
    # a row off its target says which mechanism is believed missing
    assert all(r.missing for r in collective_rows if not r.ok)


def test_balanced_partitioning_narrows_the_spread_and_shortens_the_makespan(collective_rows: list[RefRow]) -> None:
    by = {r.id: r.harness for r in collective_rows}
    assert by["core_spread_balanced"] < by["core_spread_uniform"]
    assert by["core_makespan_change"] < 0


def test_hccl_in_aiv_mode_is_faster_below_1MiB_and_the_lead_against_it_is_bounded(collective_rows: list[RefRow]) -> None:
    # AIV expansion drops the AI CPU's serial per-peer descriptor writes: below 1 MiB, where they dominate,
    # HCCL gets faster and StrataCL's lead over it can only shrink
    from stratacl.validate import ascend

    sizes = (64 * 1024.0, 512 * 1024.0)
    aiv = ascend.collective_runs("hccl", "allgather", sizes, overrides=("library.hccl.expansion_mode=aiv",))
    assert all(t < ascend.collective_s("hccl", "allgather", s) for s, (t, _) in zip(sizes, aiv, strict=True))
    by = {r.id: r.harness for r in collective_rows}
    assert by["stratacl_vs_hccl_aiv_small_medium"] > 1.0


def test_staging_rows_follow_the_copy_rate_and_the_conf_value_is_the_fit() -> None:
    from stratacl.validate import staging_row

    by = {r.id: r for r in staging_row.rows()}
    cal = by["zerocopy_vs_hccl_16MiB"]
    assert (cal.role, cal.sets, cal.relation) == ("calibrate", staging_row.RATE, ">=")
    assert abs(cal.harness - staging_row.TARGET) < 0.01  # the conf/ rate is the largest meeting the bound
    # the zerocopy pool removes HCCL's staging copies: never slower than staging, and slower copies widen
    # the gap at every size (monotone in the rate); the copies' share grows with size (check rows above it)
    assert all(r.harness >= 1.0 for r in by.values())
    slow, fast = (staging_row.ratios((16 * 2.0**20,), (f"{staging_row.RATE}={g}",))[0] for g in (200.0, 750.0))
    assert slow > cal.harness > fast > 1.0
    assert by["zerocopy_vs_hccl_128MiB"].harness > cal.harness


def test_figure_draws_every_row_including_those_off_the_axis(tmp_path) -> None:  # noqa: ANN001
    pytest.importorskip("matplotlib")
    rows = [_r(4.5, 1.95), _r(1.0, 9.0, relation=">="), RefRow("k", "h", "calibrate", 1.0, 1.05, "ratio", "w")]
    rows = [RefRow(f"r{i}", r.group, r.role, r.target, r.harness, r.unit, r.what, relation=r.relation)
            for i, r in enumerate(rows)]
    out = cm384_ops.figure(rows, tmp_path / "rows.png")
    assert out.stat().st_size > 1000
