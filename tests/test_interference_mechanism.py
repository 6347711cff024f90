"""Compute slowed by communication's HBM traffic (stratacl/engine/interference.py): the closed form
of the rate cap, no effect at κ = 0 or without time overlap, monotone in κ and in the traffic's HBM
share, work conserved, the same per event whatever the number of ranks; and the REFERENCE rows."""

from __future__ import annotations

import copy

import pytest
import simpy
from helpers import make_library

from stratacl.engine.fluid import FluidSystem
from stratacl.engine.interference import U_MAX, latency_growth, stall_cap
from stratacl.engine.replay import simulate
from stratacl.machine.fabric import Fabric, R
from stratacl.trace import Trace

HBM, CUBE = R["hbm"], R["cube"]


def fluid_run(kappa: float, u: float, traffic_s: float = 0.5, compute_s: float = 1.0, delay_s: float = 0.0,
              ranks: tuple[int, ...] = (0, 1), compute_hbm: float = 0.0) -> tuple[float, FluidSystem, list]:
    """A compute activity (cube for `compute_s`, optional HBM share) and, from `delay_s`, a traffic
    activity taking `u` of HBM for `traffic_s` on the same dies. Returns the compute's end time."""
    env = simpy.Environment()
    fl = FluidSystem(env, check=True)
    k = fl.rankset(ranks)
    done: dict[str, float] = {}
    acts = []
    loads = [(k, CUBE, compute_s)] + ([(k, HBM, compute_hbm * compute_s)] if compute_hbm else [])
    acts.append(fl.start(loads, [], compute_s, lambda: done.setdefault("c", env.now), stall=kappa))

    def traffic():  # noqa: ANN202
        yield env.timeout(delay_s)
        acts.append(fl.start([(k, HBM, u * traffic_s)], [], traffic_s, lambda: done.setdefault("x", env.now),
                             traffic=HBM))

    env.process(traffic())
    env.run()
    return done["c"], fl, acts


def test_closed_form_rate_cap() -> None:
    # a compute-bound kernel runs at r = 1 / (1 + κ u/(1-u)) while the traffic runs, then at 1
    kappa, u, d = 0.4, 0.5, 0.5
    r = 1 / (1 + kappa * u / (1 - u))
    end, fl, acts = fluid_run(kappa, u, traffic_s=d)
    assert r == pytest.approx(stall_cap(kappa, u))
    assert end == pytest.approx(d + (1 - r * d))
    assert all(a.work == pytest.approx(1.0, abs=1e-12) for a in acts)  # conservation
    assert fl.max_violation <= 1e-12
    assert latency_growth(1.0) == pytest.approx(U_MAX / (1 - U_MAX))  # capped: no infinite stall


def test_zero_coefficient_and_no_overlap_mean_no_slowdown() -> None:
    assert fluid_run(0.0, 0.6)[0] == pytest.approx(1.0)
    assert fluid_run(0.5, 0.6, delay_s=1.0)[0] == pytest.approx(1.0)  # traffic after the kernel
    assert fluid_run(0.5, 0.0)[0] == pytest.approx(1.0)  # no HBM traffic


def test_monotone_in_coefficient_and_traffic() -> None:
    by_kappa = [fluid_run(k, 0.4)[0] for k in (0.0, 0.1, 0.3, 1.0, 3.0)]
    assert by_kappa == sorted(by_kappa) and by_kappa[-1] > by_kappa[0]
    by_u = [fluid_run(0.3, u)[0] for u in (0.0, 0.2, 0.4, 0.6, 0.8, 0.99)]
    assert by_u == sorted(by_u) and by_u[-1] > by_u[0]
    # the kernel's own HBM share: the bandwidth the traffic leaves it, then the stall, never faster
    assert fluid_run(0.3, 0.6, compute_hbm=0.5)[0] >= fluid_run(0.0, 0.6, compute_hbm=0.5)[0]


def test_independent_of_rank_count() -> None:
    small, fl_s, _ = fluid_run(0.3, 0.5, ranks=(0, 1))
    large, fl_l, _ = fluid_run(0.3, 0.5, ranks=tuple(range(256)))
    assert small == pytest.approx(large) and fl_s.solves == fl_l.solves


def _fabric(cm384: Fabric, kappa: float) -> Fabric:
    cfg = copy.deepcopy(cm384.cfg)
    cfg.die.kernel.comm_hbm_stall = kappa
    return Fabric(cfg)


def _gemm_beside_copy(fab: Fabric, copy_bytes: float, after: bool = False) -> tuple[float, float]:
    """(kernel time, work error) of a compute-bound cube kernel beside (or after) a local copy on
    another stream of the same dies, replayed with the hccl preset."""
    tr = Trace(world_size=4)
    ranks = range(4)
    c = tr.memcpy(ranks, copy_bytes, stream="copy")
    k = tr.compute(ranks, flops=2e12, hbm_bytes=1e8, stream="main", deps=[c] if after else [])
    res = simulate(tr, make_library(fab, "hccl"), check=True)
    assert res.max_violation <= 1e-9
    return float(res.end[k] - res.start[k]), res.work_error


def test_replay_slows_compute_beside_a_copy(cm384: Fabric) -> None:
    base, _ = _gemm_beside_copy(_fabric(cm384, 0.0), 2e9)
    slowed = [_gemm_beside_copy(_fabric(cm384, k), 2e9) for k in (0.1, 0.3, 1.0)]
    times = [t for t, _ in slowed]
    assert base < times[0] < times[1] < times[2]
    assert max(e for _, e in slowed) <= 1e-9  # every activity did exactly its work
    # more copy bytes: the copy takes HBM longer beside the kernel -> a larger slowdown
    assert _gemm_beside_copy(_fabric(cm384, 0.3), 4e9)[0] > times[1]
    # the copy before the kernel: no overlap, no slowdown (beside it at κ = 0, only the HBM share)
    alone = _gemm_beside_copy(_fabric(cm384, 0.0), 2e9, after=True)[0]
    assert _gemm_beside_copy(_fabric(cm384, 0.3), 2e9, after=True)[0] == pytest.approx(alone)
    assert alone <= base


def test_config_default_is_ideal_and_conf_sets_cloudmatrix(cm384: Fabric) -> None:
    from stratacl.config import KernelModelConfig

    assert KernelModelConfig().comm_hbm_stall == 0.0
    assert cm384.cfg.die.kernel.comm_hbm_stall > 0


def test_reference_rows() -> None:
    from stratacl.validate.interference_row import KNOB, rows

    by_id = {r.id: r for r in rows()}
    cal, chk = by_id["interference_hccl"], by_id["interference_hccl_zerocopy"]
    assert (cal.role, cal.sets, cal.target, cal.unit) == ("calibrate", KNOB, 0.25, "fraction")
    assert (chk.role, chk.sets, chk.target) == ("check", "", 0.13)
    assert abs(cal.error) < 0.01  # the conf/ value is the fit on this row
    assert chk.ok or chk.missing  # an off row names what is believed missing
    # the staging copies' extra HBM traffic: HCCL's compute slows more than the zerocopy pool's
    assert cal.harness > chk.harness > 0
