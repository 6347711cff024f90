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
        lib = make_library(cm384, "cann_ep", moe_copy_us={"dispatch_ll": t_us}, copy_overlaps_store=False)
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


def test_overlapped_copy_loop_is_a_two_stage_flow_shop() -> None:
    """n copies of store t = α + s/r and processing p on one core take p + t + (n − 1)·max(p, t),
    less the first start-up (which overlaps the step latency); never longer than the serial loop;
    processing below the store time costs only the first copy's."""
    alpha, s, r, n = 2e-6, 7e3, 7e9, 40
    t = alpha + s / r
    for p in (0.0, 0.5e-6, t, 3e-6, 10e-6):
        one = [partition.PeerWork(n * s, alpha, r, copies=n, process_s=p)]
        got = partition.even(one, 1, overlap=True).makespan_s
        assert got == pytest.approx(p + t + (n - 1) * max(p, t) - alpha)
        serial = [partition.PeerWork(n * s, alpha, 1 / (1 / r + p / s), copies=n)]
        assert got <= partition.even(serial, 1).makespan_s * (1 + 1e-12)
    hidden = [partition.PeerWork(n * s, alpha, r, copies=n, process_s=0.5e-6)]
    bare = [partition.PeerWork(n * s, alpha, r, copies=n)]
    gap = partition.even(hidden, 1, overlap=True).makespan_s - partition.even(bare, 1, overlap=True).makespan_s
    assert gap == pytest.approx(0.5e-6)


def test_flags_pay_a_start_up_each_unless_posted() -> None:
    """A flag per peer adds one start-up per peer spread over the cores; posted flags add none."""
    peers = [partition.PeerWork(1e5, 2e-6, 7e9, copies=3, flags=1) for _ in range(32)]
    plain = [dataclasses.replace(w, flags=0) for w in peers]
    for overlap in (False, True):
        diff = partition.even(peers, 16, overlap).makespan_s - partition.even(plain, 16, overlap).makespan_s
        assert diff == pytest.approx(32 * 2e-6 / 16)
    assert partition.uniform(peers, 16).makespan_s > partition.uniform(plain, 16).makespan_s


def test_cann_ep_stores_every_token_copy_and_posts_its_flags(cm384) -> None:  # noqa: ANN001
    """The preset as ops-transformer's kernels run: one store per token copy (per_copy), the copy
    processing behind the stores, posted flags. Per-copy stores: raising the copies per window
    (fewer experts per rank) does not change the start-ups, where per-expert windows would."""
    n, tokens, top_k, bpc = 8, 128, 8, 7680.0
    group = tuple(range(n))
    pb = np.full((n, n), tokens * top_k / n * bpc)

    def wire_s(experts: int, **kw: object) -> float:
        lib = make_library(cm384, "cann_ep", **kw)
        ph = lib.collective_phases("dispatch", float(pb.sum(axis=1).max()), group, tuple(pb.ravel()),
                                   moe_mode="ll", moe=MoeOp("ll", bpc, experts, top_k))
        return max(p.min_time_s for p in ph)

    cfg = make_library(cm384, "cann_ep").cfg
    assert (cfg.moe_ll_windows, cfg.copy_overlaps_store, cfg.posted_flag_writes) == ("per_copy", True, True)
    assert wire_s(32) == pytest.approx(wire_s(4))
    assert wire_s(32, moe_ll_windows="per_expert") < wire_s(4, moe_ll_windows="per_expert")
    assert wire_s(32, posted_flag_writes=False) > wire_s(32)


def test_overlapped_copies_need_the_even_split() -> None:
    from helpers import compose_run

    from stratacl.config import validate_run

    base = ["library.cann_ep.partitioning=uniform", "library=[cann_ep]", "baseline=cann_ep"]
    with pytest.raises(ConfigError, match=r"library\.cann_ep\.copy_overlaps_store"):
        validate_run(compose_run([*base, "library.cann_ep.posted_store_ops=[]"]))
    with pytest.raises(ConfigError, match=r"library\.cann_ep\.posted_store_ops"):
        validate_run(compose_run([*base, "library.cann_ep.copy_overlaps_store=false"]))
    with pytest.raises(ConfigError, match=r"library\.cann_ep\.posted_store_ops.*allreduce"):
        validate_run(compose_run(["library.cann_ep.posted_store_ops=[allreduce]", "library=[cann_ep]",
                                  "baseline=cann_ep"]))
