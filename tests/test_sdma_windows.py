"""SDMA point-to-point mechanisms behind HIXL's A3 rows (stratacl/comm/sdma.py, movers.py): a get
waits for its data, a capped queue pays a round trip per window, host-issued streams share one
submission path, and the calibrated costs are fitted on calibration rows only."""

from __future__ import annotations

import dataclasses

import pytest

from stratacl.comm import algorithms as alg
from stratacl.comm import sdma
from stratacl.errors import ConfigError
from stratacl.machine.fabric import Fabric
from stratacl.validate import kernels as validate
from stratacl.validate import p2p
from stratacl.validate.operators import compose

BLOCKS = (16, 32, 64, 128, 256, 512, 1024, 2048)


def _row(issuer: str, tier: str, kib: int, direction: str = "D2rD") -> p2p.P2PRow:
    return next(r for r in p2p.load() if (r.issuer, r.tier, r.block_KiB, r.direction) == (issuer, tier, kib, direction))


def _call_s(row: p2p.P2PRow, knobs: dict[str, float] | None = None) -> float:
    return row.total_MiB * 2**20 / (p2p.harness_GBps(row, knobs) * 1e9)


@pytest.mark.parametrize("kib", [16, 64, 512, 2048])
def test_a_get_costs_at_least_one_round_trip_more_than_a_put(kib: int) -> None:
    node = validate.fabric_preset(p2p.FABRIC).tiers["node"]
    assert node.round_trip_s > 0 and node.put_in_flight == 0  # within a node puts are posted
    put, get = _row("aicpu", "node", kib, "D2rD"), _row("aicpu", "node", kib, "rD2D")
    one_put, one_get = (dataclasses.replace(r, total_MiB=kib / 1024) for r in (put, get))  # a single block
    assert _call_s(one_get) - _call_s(one_put) >= node.round_trip_s * (1 - 1e-9)
    # a call of many blocks: gets one at a time, each paying the round trip on top of its wire time
    # (the AI CPU writes the next descriptors meanwhile: small blocks stay bound by the writing)
    blocks = put.total_MiB * 1024 // kib
    assert _call_s(get) >= blocks * (node.round_trip_s + kib * 1024 / node.beta_Bps)
    assert _call_s(get) >= _call_s(put)
    if kib * 1024 / node.beta_Bps > validate.fabric_preset(p2p.FABRIC).sdma_descriptor_s["aicpu"]:
        assert _call_s(get) - _call_s(put) >= blocks * node.round_trip_s * 0.99


def test_across_nodes_a_get_never_beats_a_put() -> None:
    for kib in BLOCKS:
        assert _call_s(_row("aicpu", "supernode", kib, "rD2D")) >= _call_s(_row("aicpu", "supernode", kib)) * (1 - 1e-9)


@pytest.mark.parametrize("streams", [1, 2, 4, 8])
def test_host_streams_share_one_submission_path(streams: int) -> None:
    fab = validate.fabric_preset(p2p.FABRIC)
    per_stream = 128  # transfers of 16 KiB each stream carries
    row = dataclasses.replace(_row("host", "node", 16), streams=streams, total_MiB=2 * streams)
    assert _call_s(row) >= streams * per_stream * fab.sdma_descriptor_s["host"]


def test_device_issued_streams_are_not_serialised_by_the_host_path() -> None:
    one = dataclasses.replace(_row("aicpu", "node", 16), streams=1, total_MiB=2)
    four = dataclasses.replace(one, streams=4, total_MiB=8)
    assert _call_s(four) < 2 * _call_s(one)  # each stream's AI CPU expansion writes its own descriptors


def _window_plan(nbytes: float, tier: int) -> alg.WirePlan:
    return alg.WirePlan(algorithm="p2p", steps=1, latency_s=0.0, send_bytes=nbytes, recv_bytes=nbytes,
                        peers=1, peer_work=((nbytes, tier),))


def test_window_closed_form_and_unbounded_queue() -> None:
    fab = validate.fabric_preset(p2p.FABRIC)
    node, sn = fab.tiers["node"], fab.tiers["supernode"]
    unit = {1: 64 * 1024.0, 2: 64 * 1024.0}
    plan = _window_plan(64 * 2**20, sn.index)
    n = 1024
    assert sdma.window_s(plan, fab, "put", unit) == pytest.approx(
        n * (sn.round_trip_s + 64 * 1024 / sn.beta_Bps) / sn.put_in_flight)
    assert node.put_in_flight == 0 and sdma.window_s(_window_plan(64 * 2**20, node.index), fab, "put", unit) == 0.0


@pytest.mark.parametrize("cap", [1, 2, 4])
def test_an_in_flight_cap_keeps_bandwidth_monotone_and_below_beta(cap: int) -> None:
    knobs = {"tiers.supernode.in_flight.put": cap}
    beta = validate.fabric_preset(p2p.FABRIC).cfg.tiers["supernode"].beta_GBps
    bw = [p2p.harness_GBps(_row("aicpu", "supernode", kib), knobs) for kib in BLOCKS]
    assert all(b <= beta for b in bw)
    assert all(a <= b * (1 + 1e-9) for a, b in zip(bw, bw[1:], strict=False))
    # a wider window moves at least as fast
    if cap > 1:
        narrower = {"tiers.supernode.in_flight.put": cap // 2}
        assert all(b >= p2p.harness_GBps(_row("aicpu", "supernode", kib), narrower) * (1 - 1e-9)
                   for kib, b in zip(BLOCKS, bw, strict=True))


def test_the_cost_fit_never_reads_check_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    # one cost, one pass keeps the test short; the rule is the same for every cost
    monkeypatch.setattr(p2p, "COSTS", {"die.sdma.descriptor_us.aicpu": p2p.COSTS["die.sdma.descriptor_us.aicpu"]})
    monkeypatch.setattr(p2p, "PASSES", 1)
    rows = [r for r in p2p.load() if r.tier == "node"]
    before = p2p.fit_costs(rows)
    check = next(i for i, r in enumerate(rows) if r.role == "check" and r.issuer == "aicpu" and r.block_KiB == 32)
    perturbed = list(rows)
    perturbed[check] = dataclasses.replace(rows[check], measured=rows[check].measured / 3)
    assert p2p.fit_costs(perturbed) == before
    (desc,) = before
    # small intra-node blocks take ~1 us each (16K and 64K writes): the fit lands there
    assert desc.rows == 8 and 0.8 < desc.fitted < 1.2
    moved = [dataclasses.replace(r, measured=0.5 * r.measured) if r.role == "calibrate" else r for r in rows]
    assert p2p.fit_costs(moved)[0].fitted > desc.fitted


@pytest.mark.parametrize(("override", "field"), [
    ("+fabric.tiers.node.in_flight.push=1", "fabric.tiers.node.in_flight"),
    ("fabric.tiers.node.in_flight.get=-1", "fabric.tiers.node.in_flight"),
    ("fabric.tiers.supernode.round_trip_us=-2", "fabric.tiers.supernode.round_trip_us"),
])
def test_hostile_window_knobs_give_one_clean_error(override: str, field: str) -> None:
    cfg = compose(("fabric=cloudmatrix384", "library=[stratacl]", "baseline=stratacl", override))
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        Fabric(cfg.fabric)


def test_a_hostile_p2p_op_gives_one_clean_error() -> None:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    with pytest.raises((HydraException, OmegaConfBaseException), match="p2p_op"):
        compose(("fabric=cloudmatrix384", "library=[stratacl]", "baseline=stratacl", "library.stratacl.p2p_op=fetch"))


def test_each_submitting_agent_has_its_own_queue() -> None:
    """A peer's transfers spread over the agents' queues: q queues cut the capped window q-fold
    while the peer has at least q transfers, and never below one transfer's round trip."""
    fab = validate.fabric_preset(p2p.FABRIC)
    sn = fab.tiers["supernode"]
    unit = {2: 64 * 1024.0}
    plan = _window_plan(64 * 2**20, sn.index)  # 1024 transfers
    one = sdma.window_s(plan, fab, "put", unit)
    assert sdma.window_s(plan, fab, "put", unit, queues=4) == pytest.approx(one / 4)
    small = _window_plan(128 * 1024, sn.index)  # two transfers: at most two queues help
    assert sdma.window_s(small, fab, "put", unit, queues=4) == pytest.approx(sdma.window_s(small, fab, "put", unit, queues=2))
