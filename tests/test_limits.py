"""Run-size budgets: estimates from the config are upper bounds of what runs build, and a run
beyond a budget is refused before any work with the estimate and the knob."""

from __future__ import annotations

import pytest
from helpers import compose_run

from stratacl.errors import ConfigError
from stratacl.limits import RunSize, check
from workloads.collectives import workload as collectives
from workloads.moe import workload as moe


def test_collectives_estimate_counts_the_trace_exactly() -> None:
    cfg = compose_run(["workload=collectives"]).workload
    trace, _ = collectives.build_trace(cfg, cfg.ranks)
    assert collectives.estimate(cfg).trace_ops == len(trace.ops)


def test_moe_estimate_bounds_each_trace() -> None:
    cfg = compose_run(["workload=moe"]).workload
    for mode in cfg.modes:
        trace, _ = moe.build_trace(cfg, mode, 0)
        assert moe.estimate(cfg).trace_ops >= len(trace.ops)


def test_dlrm_estimate_bounds_the_trace() -> None:
    from stratacl.comm.library import LibraryModel
    from stratacl.machine.fabric import Fabric
    from workloads.dlrm_train.workload import estimate, library_run, prepare

    cfg = compose_run(["workload=dlrm_train", "workload.iterations=2"])
    fab = Fabric(cfg.fabric)
    built = library_run(prepare(cfg.workload, fab, 0), LibraryModel("hccl", cfg.library["hccl"], fab), 0).built
    assert len(built.trace.ops) <= estimate(cfg.workload).trace_ops <= 2 * len(built.trace.ops)


@pytest.mark.parametrize("size, field", [(RunSize(trace_ops=11), "limits.max_trace_ops"),
                                         (RunSize(replayed_ops=6), "limits.max_replayed_ops"),
                                         (RunSize(requests=6), "limits.max_requests")])
def test_budgets_refuse_with_the_knob(size: RunSize, field: str) -> None:
    limits = compose_run().limits
    limits.max_trace_ops, limits.max_replayed_ops, limits.max_requests = 10, 10, 10
    with pytest.raises(ConfigError, match=field):
        check(size, limits, libraries=2)
    check(RunSize(trace_ops=10, replayed_ops=5, requests=5), limits, libraries=2)  # at the budget: fine
