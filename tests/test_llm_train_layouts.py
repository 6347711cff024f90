"""llm_train: bad layouts fail with one clear ConfigError naming the field; mesh groups."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers import compose_run

from stratacl.errors import ConfigError
from stratacl.machine.fabric import Fabric
from workloads.llm_train.checkpointing import AcMode
from workloads.llm_train.layout import Layout
from workloads.llm_train.memory import check_fits, memory_breakdown
from workloads.llm_train.workload import prepare

BASE = ["workload=llm_train", "workload.num_layers=4", "workload.dies=16", "workload.fsdp=4",
        "workload.tp=4", "workload.ep=8", "workload.global_batch=4", "workload.seq_len=512"]


def _prepare(extra: list[str]):  # noqa: ANN202
    cfg = compose_run(BASE + extra)
    return cfg, prepare(cfg.workload, Fabric(cfg.fabric))


@pytest.mark.parametrize("extra, field", [
    (["workload.fsdp=3"], "workload.fsdp"),                    # 3 × 4 ≠ 16 dies
    (["workload.ep=6"], "workload.ep"),                        # not a multiple of tp / divisor of dies
    (["+workload.model.overrides.n_routed_experts=36"], "workload.ep"),  # 8 does not divide 36
    (["workload.global_batch=6"], "workload.global_batch"),    # 6 sequences over fsdp 4
    (["workload.dies=1024", "workload.fsdp=256"], "workload.dies"),  # beyond 768 dies
])
def test_bad_layout_fails_clearly(extra, field) -> None:  # noqa: ANN001
    with pytest.raises(ConfigError) as err:
        _prepare(extra)
    assert err.value.field == field


def test_layout_that_does_not_fit_fails_with_breakdown() -> None:
    cfg, prep = _prepare(["workload.ac=none"])
    mem = memory_breakdown(prep.plan, prep.layout, prep.knobs, 1.6e9)
    with pytest.raises(ConfigError, match="GB per die") as err:
        check_fits(mem, 1e9, "hccl", ac=AcMode.none)
    assert "ac=full" in str(err.value)
    with_ac = memory_breakdown(prep.plan, prep.layout, replace(prep.knobs, ac=AcMode.full), 1.6e9)
    assert with_ac["activations"] < mem["activations"]


def test_mesh_groups_partition_the_dies() -> None:
    lay = Layout(dies=512, fsdp=128, tp=4, ep=64)
    groups = lay.groups()
    assert lay.efsdp == 8
    for fam, size in (("tp", 4), ("fsdp", 128), ("ep", 64), ("efsdp", 8)):
        flat = sorted(r for g in groups[fam] for r in g)
        assert flat == list(range(512)) and {len(g) for g in groups[fam]} == {size}
    # an EP group holds whole TP groups; each efsdp group holds one die per EP group
    assert set(groups["tp"][0]) <= set(groups["ep"][0])
    assert all(len({r // 64 for r in g}) == 8 for g in groups["efsdp"])
