"""StrataCL's full mesh with the package peer relaying over SIO (algorithms.fullmesh_sio) and the
per-op choice (algorithm=auto) between it and the plain full mesh: conservation of bytes, the UB work it
saves, and that the library runs the cheapest candidate."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import make_library
from test_closed_forms import one_op_time

from stratacl.comm import algorithms as alg
from stratacl.config import Algorithm

MiB = 2**20


@pytest.mark.parametrize("n", [4, 16, 32, 64])
def test_relay_matrix_conserves_bytes_and_halves_ub(cm384, n: int) -> None:  # noqa: ANN001
    size = 64 * MiB
    tidx = cm384.group_tiers(tuple(range(n)))
    m = alg.sio_relay_matrix(n, size, tidx)
    assert m is not None
    # every die still receives (and sends) the n − 1 chunks an all-gather owes it
    assert np.allclose(m.sum(axis=0), (n - 1) / n * size)
    assert np.allclose(m.sum(axis=1), (n - 1) / n * size)
    # over UB it pulls only the P − 1 remote chunks of its own side; the plain mesh pulls n − 2
    ub = np.where(tidx > 0, m, 0.0).sum(axis=0)
    assert np.allclose(ub, (n // 2 - 1) / n * size)
    assert np.allclose(np.where(tidx == 0, m, 0.0).sum(axis=0), (n // 2) / n * size)


def test_no_relay_without_every_package_peer(cm384) -> None:  # noqa: ANN001
    odd = (0, 1, 2, 4)  # die 4's package peer (5) is missing
    assert alg.sio_relay_matrix(4, MiB, cm384.group_tiers(odd)) is None
    lib = make_library(cm384, "stratacl", algorithm=Algorithm.fullmesh_sio)
    assert lib.wire_plan("allgather", MiB, odd).algorithm == "fullmesh"
    assert lib.wire_plan("alltoall", MiB, tuple(range(8))).algorithm == "fullmesh"  # no dedupe in an exchange


def test_relay_moves_the_large_allgather_to_the_double_ring(cm384) -> None:  # noqa: ANN001
    # REFERENCE §5: at the largest sizes the zerocopy (double) ring is only ~6 % ahead of StrataCL;
    # the plain full mesh puts twice the ring's bytes on each UB port
    n, size = 32, 1024 * MiB
    ring = make_library(cm384, "hccl_zerocopy")
    plain = make_library(cm384, "stratacl", algorithm=Algorithm.fullmesh)
    relay = make_library(cm384, "stratacl", algorithm=Algorithm.fullmesh_sio)
    t_ring, t_plain, t_relay = (one_op_time(cm384, lib, "allgather", range(n), size) for lib in (ring, plain, relay))
    assert t_relay < 0.6 * t_plain
    assert t_relay == pytest.approx(t_ring, rel=0.15)
    p = relay.wire_plan("allgather", size, tuple(range(n)))
    assert p.tx_s["ub"] == pytest.approx(plain.wire_plan("allgather", size, tuple(range(n))).tx_s["ub"] / 2, rel=0.1)


@pytest.mark.parametrize("coll", ["allgather", "reducescatter", "allreduce", "alltoall"])
@pytest.mark.parametrize("size", [64 * 1024, 4 * MiB, 256 * MiB])
@pytest.mark.parametrize("group", [tuple(range(128)), tuple(range(32)), tuple(range(4)), (0, 2, 4, 6)])
def test_preset_runs_its_cheapest_candidate(cm384, coll: str, size: int, group: tuple[int, ...]) -> None:  # noqa: ANN001
    lib = make_library(cm384, "stratacl")  # the preset's own size- and scale-aware choice
    assert lib.cfg.algorithm == Algorithm.auto and len(lib.candidates("allgather")) >= 3
    times = {}  # each candidate run alone, priced as the library prices it (phases on an idle fabric)
    for cand in lib.candidates(coll):
        one = make_library(cm384, "stratacl", algorithm=Algorithm(cand))
        times[one.chosen_algorithm(coll, size, group)] = sum(p.standalone_s() for p in one.collective_phases(coll, size, group))
    chosen = lib.chosen_algorithm(coll, size, group)
    assert times[chosen] == pytest.approx(min(times.values()), rel=1e-9)
