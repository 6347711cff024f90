"""llm_train memory from the allocator model: the iteration's tensors through the library's
allocator; a die that does not fit turns activation checkpointing on, as TorchTitan users do."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers import compose_run, make_library

from stratacl.errors import ConfigError
from stratacl.machine.fabric import Fabric
from workloads.llm_train.allocation import allocator_peak, iteration_ops
from workloads.llm_train.checkpointing import AcMode
from workloads.llm_train.memory import memory_breakdown
from workloads.llm_train.workload import fit_memory, prepare

BASE = ["workload=llm_train", "workload.num_layers=4", "workload.dies=16", "workload.fsdp=4",
        "workload.tp=4", "workload.ep=8", "workload.global_batch=4", "workload.seq_len=512"]
BIG = 2**40


@pytest.fixture(scope="module")
def setup():  # noqa: ANN201
    cfg = compose_run(BASE + ["workload.ac=none", "workload.alloc_overhead_GB=0"])
    fab = Fabric(cfg.fabric)
    return cfg, fab, prepare(cfg.workload, fab)


def test_the_sequence_is_balanced_and_its_peak_is_the_analytic_one(setup) -> None:  # noqa: ANN001
    cfg, fab, prep = setup
    live: dict[str, float] = {}
    peak = 0.0
    for op in iteration_ops(prep.plan, prep.layout, prep.knobs):
        if op[0] == "alloc":
            assert op[1] not in live
            live[op[1]] = op[2]
            peak = max(peak, sum(live.values()))
        else:
            del live[op[1]]
    # what stays: parameters, gradients and optimizer states
    assert all(n.startswith(("param", "grad", "exp_avg")) for n in live)
    st = allocator_peak(prep.plan, prep.layout, prep.knobs, make_library(fab, "stratacl"), BIG)
    assert st.allocated >= peak  # blocks are rounded up
    mem = memory_breakdown(prep.plan, prep.layout, prep.knobs, 0.0)
    assert st.allocated == pytest.approx(sum(mem.values()), rel=0.1)


def test_pool_baseline_fragments_more_with_expandable_segments_off(setup) -> None:  # noqa: ANN001
    cfg, fab, prep = setup
    on = allocator_peak(prep.plan, prep.layout, prep.knobs, make_library(fab, "stratacl"), BIG)
    off = allocator_peak(prep.plan, prep.layout, prep.knobs, make_library(fab, "hccl_zerocopy"), BIG)
    assert on.expandable_segments and not off.expandable_segments
    assert off.allocated == pytest.approx(on.allocated, rel=1e-3)  # the same tensors (unsplit remainders aside)...
    assert off.reserved > on.reserved and off.fragmentation > on.fragmentation  # ...cost more HBM


def test_a_die_that_does_not_fit_turns_on_recompute(setup) -> None:  # noqa: ANN001
    cfg, fab, prep = setup
    lib = make_library(fab, "stratacl")
    plain = allocator_peak(prep.plan, prep.layout, prep.knobs, lib, BIG)
    ac = allocator_peak(prep.plan, prep.layout, replace(prep.knobs, ac=AcMode.full), lib, BIG)
    assert ac.reserved < plain.allocated  # checkpointing needs less than the tensors alone without it
    hbm = (ac.reserved + plain.allocated) / 2  # fits only with activation checkpointing
    knobs, mem, change = fit_memory(prep, lib, hbm)
    assert change == "recompute:none->full" and knobs.ac == AcMode.full
    assert mem["reserved"] <= ac.reserved  # a tight die releases its cache and retries instead of growing
    knobs, _, change = fit_memory(prep, lib, plain.reserved * 1.5)  # room enough: nothing changes
    assert change == "" and knobs.ac == AcMode.none
    with pytest.raises(ConfigError, match="GB per die"):
        fit_memory(prep, lib, ac.reserved * 0.5)  # not even with recompute
