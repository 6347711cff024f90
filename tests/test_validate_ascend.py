"""The CloudMatrix384 section of `python -m stratacl.validate` (stratacl/validate/ascend.py, p2p.py):
HIXL's UB P2P rows, REFERENCE §5's MoE table and relations, and every Ascend group in one place."""

from __future__ import annotations

import dataclasses

import pytest

from stratacl.validate import ascend, decode_layer, p2p
from stratacl.validate import kernels as validate

CAL_BLOCKS = {16, 64, 256, 1024}  # the rule in stratacl/data/operators/README.md


def test_hixl_rows_load_with_provenance_and_the_stated_split() -> None:
    rows = p2p.load()
    assert len(rows) == 2 * 3 * 2 * 8  # tiers x issuers x directions x blocks
    assert all(r.source.startswith("hicann/hixl@9ed283b") and r.measured > 0 for r in rows)
    for r in rows:
        calibrate = r.issuer == "aicpu" and r.block_KiB in CAL_BLOCKS
        assert r.role == ("calibrate" if calibrate else "check"), r.id
    # every FabricMem device-issued series has both roles; host-issued and HCCL comm-domain ones only check
    for tier in ("node", "supernode"):
        assert {r.role for r in rows if r.tier == tier and r.issuer == "aicpu"} == {"calibrate", "check"}
        assert {r.role for r in rows if r.tier == tier and r.issuer != "aicpu"} == {"check"}
    assert {(r.issuer, r.transport) for r in rows} == {("aicpu", "FabricMem"), ("host", "FabricMem"), ("hccl", "HCCS")}


def test_a_hixl_row_without_source_is_refused(tmp_path) -> None:  # noqa: ANN001
    lines = p2p.TABLE.read_text().splitlines()
    bad = tmp_path / "hixl.csv"
    bad.write_text("\n".join([lines[0], lines[1].split(',"')[0] + ","]) + "\n")
    with pytest.raises(ValueError, match="a source"):
        p2p.load(bad)


def _row(issuer: str, tier: str, kib: int) -> p2p.P2PRow:
    return next(r for r in p2p.load() if (r.issuer, r.tier, r.block_KiB, r.direction) == (issuer, tier, kib, "D2rD"))


def test_p2p_pricing_closed_forms() -> None:
    fab = validate.fabric_preset(p2p.FABRIC)
    # small blocks: the AI CPU writes one descriptor per block, the call lasts blocks x descriptor time
    small = _row("aicpu", "node", 16)
    assert p2p.harness_GBps(small) == pytest.approx(16384 / fab.sdma_descriptor_s["aicpu"] / 1e9, rel=0.01)
    # large blocks within a node (puts posted): the wire at the tier's beta, less the call's fixed start
    big = p2p.harness_GBps(_row("aicpu", "node", 2048))
    assert big == pytest.approx(fab.cfg.tiers["node"].beta_GBps, rel=0.03)
    assert big < fab.cfg.tiers["node"].beta_GBps
    # across nodes one put in flight: each block waits the round trip, block / (rtt + block / beta),
    # less the call's fixed start
    sn = fab.tiers["supernode"]
    block = 2048 * 1024
    windowed = block / (sn.round_trip_s + block / sn.beta_Bps) / 1e9
    assert p2p.harness_GBps(_row("aicpu", "supernode", 2048)) == pytest.approx(windowed, rel=0.03)
    assert p2p.harness_GBps(_row("aicpu", "supernode", 2048)) < windowed
    # host unfold: the 4 streams share one host submission path
    host = p2p.harness_GBps(_row("host", "node", 16))
    assert host == pytest.approx(16384 / fab.sdma_descriptor_s["host"] / 1e9, rel=0.01)


def test_a_higher_beta_only_moves_wire_bound_rows() -> None:
    small, big = _row("aicpu", "node", 16), _row("aicpu", "node", 2048)
    higher = {"tiers.node.beta_GBps": 190.0}
    assert p2p.harness_GBps(small, higher) == pytest.approx(p2p.harness_GBps(small), rel=1e-9)
    assert p2p.harness_GBps(big, higher) > 1.1 * p2p.harness_GBps(big)


def test_the_fit_never_reads_check_rows() -> None:
    rows = [r for r in p2p.load() if r.tier == "node"]
    before = p2p.fit(rows)
    perturbed = [dataclasses.replace(r, measured=3 * r.measured) if r.role == "check" else r for r in rows]
    assert p2p.fit(perturbed) == before
    (node,) = before
    assert node.rows == 8 and 50 < node.fitted_GBps < 196
    # a calibration row does move it
    moved = [dataclasses.replace(r, measured=0.8 * r.measured) if r.role == "calibrate" else r for r in rows]
    assert p2p.fit(moved)[0].fitted_GBps < node.fitted_GBps


def test_fit_verdicts_follow_the_stated_rule() -> None:
    keep = p2p.TierFit("node", 170.0, 167.0, 8, 0.1)
    assert keep.sane and "keeps" in keep.verdict
    change = p2p.TierFit("node", 170.0, 140.0, 8, 0.1)
    assert change.sane and change.verdict == "set conf to the fitted β"
    insane = p2p.TierFit("supernode", 150.0, 72.0, 8, 0.1)
    assert not insane.sane and insane.verdict.startswith("rejected")


def test_moe_table_rows_are_sourced_checks() -> None:
    rows = ascend.load_moe()
    assert len(rows) == 16 and all(r.role == "check" and "REFERENCE.md §5" in r.source for r in rows)
    assert {r.library for r in rows} == {"deepep", "cann_ep", "cann_ep_zerocopy", "stratacl"}
    assert [r for r in ascend.load_moe(every=False)] == [r for r in rows if r.mode == "ll"]


def test_a_calibrated_moe_row_is_refused(tmp_path) -> None:  # noqa: ANN001
    lines = ascend.MOE_TABLE.read_text().splitlines()
    bad = tmp_path / "moe.csv"
    bad.write_text("\n".join([lines[0], lines[1].replace(",check,", ",calibrate,")]) + "\n")
    with pytest.raises(ValueError, match="role must be 'check'"):
        ascend.load_moe(bad)


def test_section_lists_every_ascend_group() -> None:
    kern = validate.evaluate([r for r in validate.load_table() if r.fabric == ascend.FABRIC])
    layer = [decode_layer.OpTime("stream 0", "MLAProlog + O_PROJ", 600.0),
             decode_layer.OpTime("stream 1", "Dispatch", 900.0)]
    ev = ascend.evaluate(kern, layer)
    text = ascend.section(ev)
    groups = {r.group for r, _, _ in kern} | {r.group for r in p2p.load()} | {
        r.group for r in ascend.load_moe(every=False)} | {decode_layer.GROUP}
    assert len(groups) == 2 + 6 + 4 + 1  # kernel classes, p2p tier x issuer, MoE libraries, decode
    for g in groups:
        assert g in text, g
    assert "cann fused dispatch ll" in text and "HT rows" in text
    assert "--operators)" in text  # the rows with targets (cm384_ops) are named, run with --operators
    # the decode-layer group's errors come from the breakdown: stream 0 on 600 µs, stream 1 900 against 600
    (line,) = [ln for ln in text.splitlines() if ln.startswith(decode_layer.GROUP)]
    assert line.split()[-5:-2] == ["2", "25.0%", "50.0%"]
    # calibrated kernel groups name their parameters; check groups set nothing
    summary = ascend.summary(ev.kernels)
    assert all((what == "check only") == (role == "check") for _, role, _, _, _, what in summary)
    assert any("grouped_gemm.compute_fraction.int8" in what for *_, what in summary)
    assert {r.group for r, _, _ in ev.rates} == {r.group for r in p2p.load()} | {
        r.group for r in ascend.load_moe(every=False)}
