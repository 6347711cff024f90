"""Every serving and training run carries the counterfactual split of its steps (issue 37 item 1),
and the verdict's split of two libraries' difference sums to that difference."""

from __future__ import annotations

import math

import pytest
from test_llm_infer import OVERRIDES as SERVING

from stratacl import directions as d
from stratacl.report.text import split_text
from stratacl.report.verdict import accounting, merge_accounting, verdict
from stratacl.validate.operators import run_in_process
from stratacl.workload_api import WorkloadResult

TRAIN = ("workload=llm_train", "workload.num_layers=4", "workload.dies=16", "workload.fsdp=4", "workload.ep=8",
         "workload.global_batch=4", "workload.seq_len=512", "workload.iterations=[0,1000]",
         "library=[hccl,stratacl]", "output.timeline=false")
DLRM = ("workload=dlrm_train", "workload.ranks=32", "workload.iterations=3", "workload.total_table_TiB=1.5",
        "library=[hccl,stratacl]")
SERVE = (*SERVING[:-1], "library=[hccl,stratacl]", "workload.requests.duration_s=8")


def _metrics(name: str, overrides: tuple[str, ...]) -> tuple[WorkloadResult, dict]:
    res = run_in_process(name, overrides)
    return res, merge_accounting(res.metrics, accounting(res.rows, res.extra_rows))


def _check_sums(metrics: dict, wholes: list[str]) -> None:
    for lib, m in metrics.items():
        for whole in wholes:
            terms = [m[d.cf_metric(whole, t)] for t in d.CF_TERMS]
            assert all(math.isfinite(v) for v in terms), (lib, whole)
            assert terms[0] > 0  # a compute path
            assert sum(terms) == pytest.approx(m[d.CF_WHOLES[whole]], rel=1e-9), (lib, whole)


def _check_verdict(workload: str, metrics: dict, n_wholes: int) -> None:
    block = verdict(workload, metrics, "hccl")["libraries"]["stratacl"]
    splits = block["counterfactual"]
    assert len(splits) == n_wholes
    for s in splits:
        assert sum(s["terms"].values()) == pytest.approx(s["value_s"] - s["baseline_s"], rel=1e-9, abs=1e-15)
        sizes = [abs(v) for v in s["terms"].values()]
        assert sizes == sorted(sizes, reverse=True)  # largest term first
    text = split_text(splits)
    assert len(text) == n_wholes + 1 and "→" in text[0]


@pytest.mark.parametrize(("workload", "overrides", "wholes"), [
    ("llm_train", TRAIN, ["iteration"]),
    ("dlrm_train", DLRM, ["iteration"]),
    ("llm_infer", SERVE, ["decode_iter", "prefill_iter"]),
])
def test_the_split_sums_to_each_step_and_to_the_libraries_difference(workload: str, overrides: tuple[str, ...],
                                                                     wholes: list[str]) -> None:
    res, metrics = _metrics(workload, overrides)
    _check_sums(metrics, wholes)
    _check_verdict(workload, metrics, len(wholes))
    if workload == "llm_infer":  # and each iteration's row, not only the means
        its = res.rows if "phase" in res.rows.columns else res.extra_rows["iterations"]
        total = sum(its[f"cf_{t}_s"] for t in d.CF_TERMS)
        assert (total - its["time_s"]).abs().max() < 1e-9 * its["time_s"].max()


@pytest.mark.parametrize(("workload", "overrides"), [("llm_train", TRAIN), ("llm_infer", SERVE)])
def test_the_split_can_be_turned_off(workload: str, overrides: tuple[str, ...]) -> None:
    res, metrics = _metrics(workload, (*overrides, "output.counterfactual=false"))
    assert not any("_cf_" in k for m in metrics.values() for k in m)
    assert not any("cf_" in c for frame in (res.rows, *res.extra_rows.values()) for c in frame.columns)
    block = verdict(workload, metrics, "hccl")["libraries"]["stratacl"]
    assert block["counterfactual"] == []
