"""The engine's one exposed-communication accounting (stratacl/engine/accounting.py)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import make_library

from stratacl.engine.accounting import COMM_CATEGORIES, exposure
from stratacl.engine.replay import simulate
from stratacl.trace import Trace


def _split(n: int, **cols: list[float]) -> dict[str, np.ndarray]:
    out = {c: np.zeros(n) for c in ("compute", *COMM_CATEGORIES)}
    for k, v in cols.items():
        out[k] = np.asarray(v, dtype=float)
    return out


def test_exposed_is_window_minus_union_of_compute_and_while_ops_only_count_when_exposed() -> None:
    # compute [0,4) and [3,6) on two streams (union 6), a collective [5,9), a fetch [8,12)
    start = np.array([0.0, 3.0, 5.0, 8.0])
    end = np.array([4.0, 6.0, 9.0, 12.0])
    kinds = np.array(["compute", "compute", "collective", "p2p"], dtype=object)
    split = _split(4, wire=[0, 0, 3, 4], sync=[0, 0, 1, 0])
    e = exposure(start, end, kinds, split, np.zeros(4), while_ops=np.array([False, False, False, True]))
    assert e.time_s == 12.0 and e.compute_s == 6.0 and e.exposed_comm_s == 6.0
    assert e.exposed_while_s == pytest.approx(4.0)  # the fetch is never hidden by compute
    assert e.wire_s == 7.0 and e.sync_s == 1.0 and e.comm_ops_s == 8.0
    # a window clips intervals; `ops` selects what the split sums
    w = exposure(start, end, kinds, split, np.zeros(4), window=(2.0, 7.0),
                 ops=np.array([True, True, True, False]))
    assert w.time_s == 5.0 and w.compute_s == 4.0 and w.exposed_comm_s == pytest.approx(1.0)
    assert w.wire_s == 3.0 and w.comm_ops_s == 4.0


def test_replay_exposure_of_serial_compute_then_collective(cm384_ideal) -> None:  # noqa: ANN001
    fab = cm384_ideal  # compute priced as the ideal kernel: 1 ms of cube work takes 1 ms
    lib = make_library(fab, "stratacl")
    tr = Trace(world_size=8)
    tr.add_family("world", [range(8)])
    c = tr.compute(range(8), flops=fab.cube_flops * 1e-3, core="cube")  # 1 ms of cube work
    tr.collective("allreduce", "world", 1 << 20, deps=[c])
    res = simulate(tr, lib)
    e = res.exposure()
    coll_t = res.end[1] - res.start[1]
    assert e.compute_s == pytest.approx(1e-3)
    assert e.exposed_comm_s == pytest.approx(coll_t)  # nothing hides a collective after the compute
    assert e.wire_s + e.sync_s + e.launch_s + e.copy_s + e.register_s == pytest.approx(coll_t)
