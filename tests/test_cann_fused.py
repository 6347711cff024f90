"""CANN's fused MoE ops on A3: tokens split evenly over the AIVs, a per-copy processing cost, and
their operator rows (stratacl/validate/fused.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers import make_library

from stratacl.comm import partition
from stratacl.comm.ep import MoeOp
from stratacl.errors import ConfigError
from stratacl.validate import fused


def test_even_split_is_the_mean_of_every_peers_work() -> None:
    """Every core carries total / cores; with as many identical peers as cores it equals the
    peer-per-core split, and with more peers than cores it beats round-robin's whole peers."""
    peers = [partition.PeerWork(1e6, 1e-6, 1e9, copies=4) for _ in range(24)]
    even = partition.even(peers, 24)
    assert even.makespan_s == pytest.approx(1e-3 + 3e-6)  # the first start-up overlaps the step latency
    assert even.makespan_s == pytest.approx(partition.uniform(peers, 24).makespan_s)
    more = peers + peers[:7]  # 31 peers on 24 cores: round-robin gives 7 cores two peers
    assert partition.even(more, 24).makespan_s == pytest.approx(31 * (1e-3 + 4e-6) / 24 - 1e-6)
    assert partition.even(more, 24).makespan_s < partition.uniform(more, 24).makespan_s
    assert partition.even([], 4).makespan_s == 0.0


def test_a_copys_processing_slows_a_core_bound_dispatch_by_copies_per_core(cm384) -> None:  # noqa: ANN001
    """+t µs per token copy on the AIVs: a core-bound LL dispatch takes (copies to peers / cores) · t
    more (the die's copies to itself do not cross the fabric)."""
    n, tokens, top_k, bpc = 8, 128, 8, 7680.0
    group = tuple(range(n))
    pb = np.full((n, n), tokens * top_k / n * bpc)
    moe = MoeOp("ll", bpc, 256 // n, top_k)

    def wire_s(t_us: float) -> float:
        lib = make_library(cm384, "cann_ep", moe_copy_us={"dispatch_ll": t_us})
        ph = lib.collective_phases("dispatch", float(pb.sum(axis=1).max()), group, tuple(pb.ravel()),
                                   moe_mode="ll", moe=moe)
        return max(p.min_time_s for p in ph)

    cores = make_library(cm384, "cann_ep").cfg.comm_cores
    assert wire_s(2.0) - wire_s(0.0) == pytest.approx(tokens * top_k * (n - 1) / n * 2e-6 / cores, rel=1e-6)


def test_per_copy_cost_of_an_op_that_moves_no_tokens_names_the_field() -> None:
    from helpers import compose_run

    from stratacl.config import validate_run

    with pytest.raises(ConfigError, match=r"library\.cann_ep\.moe_copy_us\.allreduce"):
        validate_run(compose_run(["+library.cann_ep.moe_copy_us.allreduce=1.0", "library=[cann_ep]",
                                  "baseline=cann_ep"]))
    with pytest.raises(ConfigError, match=r"library\.cann_ep\.moe_copy_us\.dispatch_ll"):  # beyond 1 ms a copy
        validate_run(compose_run(["library.cann_ep.moe_copy_us.dispatch_ll=1e30", "library=[cann_ep]",
                                  "baseline=cann_ep"]))


def test_rows_load_with_sources_and_the_stated_split() -> None:
    rows = fused.load()
    assert all(r.source.startswith(("sgl-project/sgl-kernel-npu", "sgl-kernel-npu")) for r in rows)
    for r in rows:  # low-latency: the EP ends calibrate, the middle checks; normal rows only check
        want = "calibrate" if r.mode == "ll" and r.ep in (8, 32) else "check"
        assert r.role == want, r.id
    assert {(r.kind, r.role) for r in rows if r.mode == "ll"} == {
        (k, role) for k in ("dispatch", "combine") for role in ("calibrate", "check")}


def test_fit_recovers_a_known_cost_and_never_reads_check_rows(monkeypatch) -> None:  # noqa: ANN001
    """With a harness linear in the per-copy cost, the fit finds the cost that makes the
    calibration rows exact; changing a check row's measurement leaves it unchanged."""
    def harness(row: fused.FusedRow, copy_us: float | None = None) -> float:
        x = 1.5 if copy_us is None else copy_us
        return 60.0 + row.ep + 40.0 * x  # exact at x = (latency - 60 - ep) / 40 per row

    monkeypatch.setattr(fused, "harness", harness)
    rows = [r for r in fused.load() if r.mode == "ll" and r.kind == "dispatch"]
    rows = [dataclasses.replace(r, latency_us=60.0 + r.ep + 40.0 * 1.25) if r.role == "calibrate" else r for r in rows]
    got = fused.fit(rows)["dispatch_ll"]
    assert got == pytest.approx(1.25, abs=1e-3)
    moved = [dataclasses.replace(r, latency_us=r.latency_us * 3) if r.role == "check" else r for r in rows]
    assert fused.fit(moved)["dispatch_ll"] == got


@pytest.mark.slow
def test_the_presets_values_equal_a_fresh_fit() -> None:
    """conf/library/cann_ep.yaml's moe_copy_us is what --fit gives (rounded as written)."""
    from helpers import make_library

    from stratacl.machine.fabric import Fabric
    from stratacl.validate.operators import compose

    fab = Fabric(compose(("fabric=cloudmatrix384",)).fabric)
    conf = make_library(fab, "cann_ep").cfg.moe_copy_us
    for knob, value in fused.fit(fused.load()).items():
        assert conf[knob] == pytest.approx(value, abs=0.006), knob
