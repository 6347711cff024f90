"""The 910C rows of the kernel validation table (CANN on one die, 2506.12708 Tables 8-10): they load
with the shapes and byte counts the paper's own columns confirm, the split rule gives each group its
roles, `--fit` never reads a check row, and conf/fabric/cloudmatrix384.yaml holds a fresh fit."""

from __future__ import annotations

import csv
import statistics
from collections.abc import Iterator

import pytest

from stratacl.validate import kernels as validate

CM = "cloudmatrix384"
GROUPED, MLA = "910c int8 grouped_gemm", "910c bf16 attention_decode"


@pytest.fixture()
def cm_free() -> Iterator[None]:
    """--fit restricted to the 910C classes (the H800 fits are tested elsewhere)."""
    orig = validate.FREE
    validate.FREE = {k: v for k, v in orig.items() if k[0] == CM}
    try:
        yield
    finally:
        validate.FREE = orig


def cm_rows() -> list[validate.Row]:
    return [r for r in validate.load_table() if r.fabric == CM]


def test_rows_load_with_the_shapes_the_papers_columns_confirm() -> None:
    rows = cm_rows()
    assert {r.group for r in rows} == {GROUPED, MLA}
    with (validate.TABLE.parent / "cann_910c.csv").open() as f:
        src = [r for r in csv.DictReader(f) if r["kernel"] == "int8_grouped_gemm"]
    grouped = [r for r in rows if r.group == GROUPED]
    assert len(grouped) == len(src) == 6
    for row, s in zip(grouped, src, strict=True):
        (m, n, k, g), = row.gemms
        assert (g, m, n, k) == tuple(int(s[c]) for c in ("groups", "m", "n", "k"))
        assert row.flops == 2 * m * n * k * g and row.format == "int8" and row.kernel == "grouped_gemm"
        # the table's sustained HBM rate follows from these bytes over the kernel time at the stated
        # utilisation of 752 TOPS: the byte count and the peak are the paper's
        t = row.flops / (row.measured * 1e12)
        assert row.hbm_bytes / t / 1e9 == pytest.approx(float(s["hbm_GBps"]), rel=5e-3)
    units = {r.id: r.unit for r in rows if r.group == MLA}
    assert units == {"cann_mla_decode_compute_bound": "TFLOPS", "cann_mla_decode_memory_bound": "GBps"}


def test_split_rule_gives_each_group_its_roles() -> None:
    rows = cm_rows()
    grouped = [r.role for r in rows if r.group == GROUPED]
    assert grouped == ["check" if i % 3 == 2 else "calibrate" for i in range(6)]
    assert [r.role for r in rows if r.group == MLA] == ["calibrate", "calibrate"]  # one figure per bound


@pytest.mark.usefixtures("cm_free")
def test_fit_never_reads_check_rows() -> None:
    rows = validate.load_table()
    base = validate.fit(rows)
    assert set(base) == {(CM, "grouped_gemm"), (CM, "attention_decode")}
    poisoned = [validate.replace(r, measured=r.measured * 7) if r.role == "check" else r for r in rows]
    assert validate.fit(poisoned) == base
    first_cal = next(r.id for r in rows if r.group == GROUPED and r.role == "calibrate")
    moved = [validate.replace(r, measured=r.measured * 0.8) if r.id == first_cal else r for r in rows]
    assert validate.fit(moved)[(CM, "grouped_gemm")] != base[(CM, "grouped_gemm")]


@pytest.mark.usefixtures("cm_free")
def test_yaml_holds_a_fresh_fit() -> None:
    fitted = validate.fit(validate.load_table())
    classes = validate.fabric_preset(CM).cfg.die.kernel.classes
    gg, att = fitted[(CM, "grouped_gemm")], fitted[(CM, "attention_decode")]
    assert classes["grouped_gemm"].compute_fraction["int8"] == pytest.approx(gg["compute_fraction.int8"], abs=5e-4)
    assert classes["grouped_gemm"].k_fill == pytest.approx(gg["k_fill"], abs=0.5)
    assert classes["attention_decode"].compute_fraction["bf16"] == pytest.approx(att["compute_fraction.bf16"],
                                                                                 abs=5e-4)
    assert classes["attention_decode"].hbm_fraction == pytest.approx(att["hbm_fraction"], abs=5e-4)
    # the dense class carries the grouped fit by the YAML's stated assumption
    assert classes["gemm"].compute_fraction["int8"] == classes["grouped_gemm"].compute_fraction["int8"]
    assert classes["gemm"].k_fill == classes["grouped_gemm"].k_fill


def test_report_groups_keep_roles_apart_and_check_within_the_bar() -> None:
    results = validate.evaluate(cm_rows())
    summ = {(g, role): (n, med, worst) for g, role, n, med, worst in validate.summary(results)}
    assert set(summ) == {(GROUPED, "calibrate"), (GROUPED, "check"), (MLA, "calibrate")}
    n, med, worst = summ[(GROUPED, "check")]
    check = [abs(e) for r, _, e in results if r.group == GROUPED and r.role == "check"]
    assert (n, med, worst) == (2, statistics.median(check), max(check))
    assert med <= 0.15


# --------------------------------------------------------------------------- decode layer check


def test_decode_layer_breakdown_closed_form() -> None:
    """Two MoE layers × two micro-batches with known op times: each paper op is its harness ops'
    summed device time averaged over (layer, micro-batch); a dense layer and the embedding do not
    count; each stream's check row is the sum of its ops against 600 µs."""
    import numpy as np

    from stratacl.trace import Trace
    from stratacl.validate import decode_layer as dl

    tr = Trace(world_size=1)
    times: list[float] = []
    us = {"attn": 100.0, "attn.vec": 10.0, "attn_core": 300.0, "gate.route": 20.0, "gate": 25.0,
          "shared": 5.0, "dispatch": 50.0, "moe": 200.0, "combine": 80.0}

    def op(name: str, stream: str, t: float) -> None:
        tr.add("compute", [0], flops=1.0, stream=stream, name=name)
        times.append(t)

    op("embedding.mb0", "attn_path", 999.0)
    op("L0.dense_mlp.mb0", "moe_path", 999.0)  # no dispatch: not a MoE layer
    for layer in (1, 2):
        for mb in (0, 1):
            scale = layer * (1 + mb)  # 1, 2, 2, 4: mean 2.25
            for kind, t in us.items():
                base, _, part = kind.partition(".")
                stream = "attn_path" if base.startswith("attn") else "moe_path"
                op(f"L{layer}.{base}.mb{mb}" + (f".{part}" if part else ""), stream, t * scale)
    end = np.cumsum(np.array(times)) * 1e-6
    start = end - np.array(times) * 1e-6
    got = {o.op: o.harness_us for o in dl.breakdown(tr, start, end)}
    assert got == pytest.approx({"MLAProlog + O_PROJ": 110 * 2.25, "FusedAttention": 300 * 2.25,
                                 "Gate (+ local shared expert)": 50 * 2.25, "Dispatch": 50 * 2.25,
                                 "MLP (routed expert)": 200 * 2.25, "Combine": 80 * 2.25})
    rows = dl.stream_rows(dl.breakdown(tr, start, end))
    assert [(r.id, r.role, r.measured) for r in rows] == [("decode layer stream 0", "check", 600.0),
                                                         ("decode layer stream 1", "check", 600.0)]
    assert rows[0].harness == pytest.approx(410 * 2.25) and rows[1].harness == pytest.approx(380 * 2.25)
    assert rows[0].error == pytest.approx(410 * 2.25 / 600 - 1)
    # a decode step without the two-stream pipeline (one compute, one comm stream) has no such row
    flat = Trace(world_size=1)
    flat.add("compute", [0], flops=1.0, stream="comm", name="L1.dispatch.mb0")
    with pytest.raises(ValueError, match="two streams"):
        dl.breakdown(flat, np.zeros(1), np.ones(1))


def test_decode_layer_of_the_deployment_is_a_check_on_both_streams() -> None:
    """The cloudmatrix_infer decode step: every paper op has harness time; both rows check."""
    from stratacl.validate import decode_layer as dl

    step = dl.simulated_decode()
    ops = dl.breakdown(*step)
    assert len(ops) == len(dl.OPS) and all(o.harness_us > 0 for o in ops)
    assert {o.stream for o in ops} == {"stream 0", "stream 1"}
    assert [r.role for r in dl.stream_rows(ops)] == ["check", "check"]
    # the HBM-share range: a kernel on more core groups never draws less HBM, so no op's alone time
    # grows as fewer groups saturate HBM; the compute-bound attention does not move at all
    rows = dl.hbm_range(*step, sats=(4, 12, 24))
    per = [{o.op: o.harness_us for o in times} for _, times in rows]
    for op in per[0]:
        assert per[0][op] <= per[1][op] + 1e-9 <= per[2][op] + 2e-9
    assert per[0]["FusedAttention"] == pytest.approx(per[2]["FusedAttention"])
    assert per[2]["MLAProlog + O_PROJ"] > per[1]["MLAProlog + O_PROJ"]  # memory-bound on 16 of 24
    assert "hbm_saturation_cores" in dl.report(dl.breakdown(*step), rows)
