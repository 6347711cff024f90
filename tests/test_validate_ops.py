"""Operator-level validation rows (stratacl/validate/operators.py): NCCL's documented busbw and DeepEP's
README tables as check groups of `python -m stratacl.validate`, each in its convention and in time."""

from __future__ import annotations

import csv
import math

import pytest

from stratacl.metrics import busbw_factor
from stratacl.validate import kernels as validate
from stratacl.validate import operators as validate_ops

TOL = 0.15  # per-group median |error| of the fast subset (as the kernel rows' subset)
WORST = 0.35  # any single row (DeepEP's LL dispatch at EP 8 is the worst, +29 %)


@pytest.fixture(scope="module")
def nccl_results() -> list:
    return validate_ops.evaluate(validate_ops.load_nccl())


@pytest.fixture(scope="module")
def ll_results() -> list:
    rows = [r for r in validate_ops.load_deepep() if r.group == validate_ops.GROUPS["ll"]
            and int(r.get("ep")) <= 16]
    return validate_ops.evaluate(rows)


def test_every_operator_row_is_a_sourced_check_row() -> None:
    rows = validate_ops.load()
    assert len(rows) == 6 + 16
    assert all(r.role == "check" and r.source and r.measured > 0 for r in rows)
    assert {r.convention for r in rows} == {"busbw_GBps", "deepep_logical_GBps", "deepep_rdma_GBps"}
    # DeepEP's internode rows are the normal kernels across nodes; intranode ones are logical
    for r in rows:
        if r.group == validate_ops.GROUPS["ht"]:
            assert (r.convention == "deepep_rdma_GBps") == (int(r.get("ep")) > 8)
    fast = validate_ops.load(every=False)
    assert {r.id for r in rows} - {r.id for r in fast} == {
        f"deepep_ht_{k}_ep{ep}" for k in ("dispatch", "combine") for ep in (32, 64)}


def test_a_calibrated_operator_row_is_refused(tmp_path) -> None:  # noqa: ANN001
    bad = tmp_path / "nccl.csv"
    lines = validate_ops.NCCL_TABLE.read_text().splitlines()
    bad.write_text("\n".join([lines[0], lines[1].replace(",check,", ",calibrate,", 1)]) + "\n")
    with pytest.raises(ValueError, match="role must be 'check'"):
        validate_ops.load_nccl(bad)


def test_nccl_rows_within_tolerance_time_and_busbw_agree(nccl_results) -> None:  # noqa: ANN001
    for g, role, n, med, worst in validate.summary(nccl_results):
        assert role == "check" and n == 6 and med <= TOL and worst <= 0.2, (g, med, worst)
    for r, h, e in nccl_results:
        coll, ranks, size = r.get("collective"), int(r.get("ranks")), float(r.get("size_bytes"))
        t_h, t_p = r.times
        # time and busbw are one number in nccl-tests' convention: busbw = size / t × factor
        assert h == pytest.approx(size / (t_h * 1e-6) / 1e9 * busbw_factor(coll, ranks), rel=1e-9)
        assert t_p == pytest.approx(size * busbw_factor(coll, ranks) / (r.measured * 1e9) * 1e6, rel=1e-9)
        assert t_h / t_p == pytest.approx(1 / (1 + e), rel=1e-9)
        bws = dict(r.bandwidths)
        assert bws["algbw_GBps"] == pytest.approx(bws["busbw_GBps"] / busbw_factor(coll, ranks))
    forced = {r.id: dict(r.spec)["algorithm"] for r, _, _ in nccl_results}
    assert all(a.startswith("nccl:ring/") for i, a in forced.items() if i.endswith("_ring"))


def test_nccl_relation_holds() -> None:
    rel = validate_ops.nccl_relations()
    assert [(i, ok) for i, ok, _ in rel] == [("h100_2node_nvls_tree_beats_ring", True)]


def test_nccl_relation_fails_when_another_algorithm_is_chosen(tmp_path) -> None:  # noqa: ANN001
    """The row states which algorithm NCCL picks: expecting plain tree (faster than ring or not)
    must fail, so the relation checks the choice and not only the bandwidth."""
    text = validate_ops.NCCL_TABLE.read_text().replace(",nvls_tree,,,,", ",tree,,,,")
    assert text != validate_ops.NCCL_TABLE.read_text()
    (tmp_path / "nccl.csv").write_text(text)
    [(_, holds, what)] = validate_ops.nccl_relations(tmp_path / "nccl.csv")
    assert not holds and "not tree" in what


def test_deepep_ll_rows_within_tolerance(ll_results) -> None:  # noqa: ANN001
    for g, _, n, med, worst in validate.summary(ll_results):
        assert n == 4 and med <= TOL and worst <= WORST, (g, med, worst)
    for r, h, _ in ll_results:
        # LL rows state their time: the time comparison is independent of the bandwidth one
        assert r.times[1] == float(r.get("readme_time_us"))
        assert 0.7 < r.times[0] / r.times[1] < 1.3
        bws = dict(r.bandwidths)
        assert math.isnan(bws["deepep_rdma_GBps"])  # no internode convention for LL
        assert bws["deepep_logical_GBps"] == h


def test_deepep_internode_row_counts_token_node_pairs() -> None:
    """The EP 16 normal dispatch: within tolerance in DeepEP's internode convention; its public time
    is the README bandwidth over the harness's own (token, node) bytes; node deduplication makes
    the RDMA convention smaller than the logical one (top-8 over 2 nodes: ≤ 2 nodes per token)."""
    row = next(r for r in validate_ops.load_deepep() if r.id == "deepep_ht_dispatch_ep16")
    [(r, h, e)] = validate_ops.evaluate([row])
    assert r.convention == "deepep_rdma_GBps" and abs(e) <= TOL
    bws = dict(r.bandwidths)
    assert r.times[0] / r.times[1] == pytest.approx(1 / (1 + e), rel=1e-9)
    # logical counts one copy per destination rank; at most 2 distinct nodes of 8 ranks each
    assert bws["deepep_rdma_GBps"] < bws["deepep_logical_GBps"]
    assert bws["algbw_GBps"] * 15 / 16 == pytest.approx(bws["busbw_GBps"])


def test_report_and_figure_carry_the_operator_groups(nccl_results, ll_results, tmp_path) -> None:  # noqa: ANN001
    text = validate_ops.report(nccl_results + ll_results, validate_ops.nccl_relations())
    for g in (validate_ops.GROUPS["nccl"], validate_ops.GROUPS["ll"]):
        assert g in text
    assert "relation" in text and "holds" in text
    out = validate.figure(nccl_results + ll_results, tmp_path / "ops.png")
    assert out.stat().st_size > 10_000


def test_tables_state_their_sources() -> None:
    for path in (validate_ops.NCCL_TABLE, validate_ops.DEEPEP_TABLE):
        with path.open() as f:
            assert all(r["source"] and r["role"] == "check" for r in csv.DictReader(f))
