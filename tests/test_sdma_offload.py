"""SDMA offload trade-off (REFERENCE §5): physics of the device trigger's pricing and the rows' rule."""

from __future__ import annotations

import math

import pytest

from stratacl.comm import sdma
from stratacl.comm.algorithms import WirePlan
from stratacl.validate import sdma_row
from stratacl.validate.reference_rows import RefRow

STARTUP = sdma_row.STARTUP
DEVICE = sdma_row.DEVICE


class _Fab:
    """The two fields descriptors() / submission() read."""

    sdma_descriptor_bytes = 4096.0 * 1024
    sdma_descriptor_s = {"device": 0.5e-6, "aicpu": 1e-6, "host": 5e-6}


def _plan(peer_bytes: list[float], steps: int = 1) -> WirePlan:
    return WirePlan(algorithm="fullmesh", steps=steps, latency_s=0.0, tx_s={}, rx_s={}, send_bytes=sum(peer_bytes),
                    recv_bytes=sum(peer_bytes), group_wire_bytes=sum(peer_bytes), peers=len(peer_bytes),
                    peer_work=tuple((b, 1) for b in peer_bytes))


def test_descriptor_count_conservation() -> None:
    """Data descriptors = Σ ⌈bytes / unit⌉ per peer; one completion per peer (or step)."""
    unit = 256 * 1024.0
    peers = [1.0, unit, unit + 1, 10 * unit]
    n = sdma.descriptors(_plan(peers), _Fab(), {1: unit})
    assert n == sum(max(1, math.ceil(b / unit)) for b in peers) + len(peers)
    # splitting a peer's bytes in two peers adds exactly its completion (and at most one unit)
    assert sdma.descriptors(_plan([5 * unit, 5 * unit]), _Fab(), {1: unit}) == \
        sdma.descriptors(_plan([10 * unit]), _Fab(), {1: unit}) + 1


@pytest.mark.parametrize("agents", [1, 3, 4, 24])
def test_submission_splits_all_descriptors(agents: int) -> None:
    """The agents write every descriptor: ⌈n / agents⌉ each, none lost, no agent idle beyond one."""
    plan = _plan([3e6] * 31)
    sub = sdma.submission(plan, _Fab(), "device", agents, {1: 256 * 1024.0})
    per = _Fab.sdma_descriptor_s["device"]
    written = round(sub.total_s / per)
    assert written * sub.agents >= sub.descriptors > (written - 1) * sub.agents
    assert sub.first_s == pytest.approx(per) and sub.rest_s >= 0
    # an AI CPU writes alone, whatever the agents asked
    assert sdma.submission(plan, _Fab(), "aicpu", agents).agents == 1


def test_latency_change_monotone_in_startup() -> None:
    lat = [sdma_row.changes("allgather", (f"{STARTUP}={s}",))[0] for s in (0.0, 2.0, 8.0)]
    assert lat[0] < lat[1] < lat[2]


def test_occupancy_grows_with_descriptor_write_only() -> None:
    """Cores are held only while writing descriptors: write time moves occupancy, start-up barely does."""
    occ = [sdma_row.changes("allgather", (f"{DEVICE}={d}",))[1] for d in (0.1, 0.5, 1.0)]
    assert occ[0] < occ[1] < occ[2]
    still = [sdma_row.changes("allgather", (f"{STARTUP}={s}",))[1] for s in (0.0, 8.0)]
    assert still[0] == pytest.approx(still[1], abs=0.005)


def test_sdma_holds_at_most_5pct_of_vector_core_time_at_large_sizes() -> None:
    """Where the data dominates (≥ 16 MiB), the SDMA path's core-seconds ≤ 5 % of the core path's."""
    for coll in ("allgather", "allreduce"):
        for size, (_, occ) in zip(sdma_row.SIZES, sdma_row.per_size(coll), strict=True):
            if size >= 16 * 2**20:
                assert occ <= 0.05, (coll, size, occ)


def test_rows_follow_the_rule() -> None:
    """Allgather rows calibrate and name what they set; allreduce rows and the per-size row check."""
    rows = sdma_row.rows()
    assert all(isinstance(r, RefRow) and r.unit == "fraction" for r in rows)
    assert {r.target for r in rows} == {sdma_row.LATENCY, sdma_row.OCCUPANCY}
    for r in rows:
        per_size = r.id.endswith(("KiB", "MiB"))
        expect = "calibrate" if sdma_row.CALIBRATE in r.id and not per_size else "check"
        assert r.role == expect, r.id
        assert bool(r.sets) == (r.role == "calibrate"), r.id
    lat = [r for r in rows if r.id.startswith("sdma_latency") and not r.id.endswith("MiB")]
    occ = [r for r in rows if r.id.startswith("sdma_occupancy") and not r.id.endswith("KiB")]
    assert len(lat) == 2 and len(occ) == 2
    # the calibration rows pass (conf holds the fitted values), the offload trades latency for cores
    assert all(r.ok for r in rows if r.role == "calibrate")
    assert all(r.harness > 0 for r in lat) and all(r.harness < -0.9 for r in occ)
