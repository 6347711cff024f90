"""The verdict and the report on synthetic metric dicts: directions, ties within noise, missing
metrics, mechanisms, one number format (stratacl/report/verdict.py, stratacl/report/text.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from helpers import run_cli

from stratacl import directions as d
from stratacl.report.text import fmt, report_lines, table_lines, verdict_lines
from stratacl.report.verdict import accounting, judge, merge_accounting, verdict


def _serving(tpot: float, e2e: float, sat: float, **extra: float) -> dict[str, float]:
    return {"throughput_tok_per_s": 5000.0, "tpot_p99_s": tpot, "e2e_p99_s": e2e,
            "saturation_throughput_tok_per_s": sat, **extra}


def test_lower_is_better_latency_wins_and_direction_flips_for_throughput():
    m = {"hccl": _serving(0.040, 31.5, 7000.0), "stratacl": _serving(0.028, 25.0, 7900.0)}
    v = verdict("llm_infer", m, "hccl")["libraries"]["stratacl"]
    assert v["outcome"] == "faster"
    assert v["lead_metric"] == "tpot_p99_s"  # not the load-pinned throughput
    assert v["lead_speedup"] == pytest.approx(0.040 / 0.028)
    out = {j["metric"]: j["outcome"] for j in v["headlines"]}
    assert out == {"tpot_p99_s": "better", "e2e_p99_s": "better", "saturation_throughput_tok_per_s": "better"}
    # the same numbers the other way round: every headline flips, the library is slower
    back = verdict("llm_infer", {"stratacl": m["stratacl"], "hccl": m["hccl"]}, "stratacl")["libraries"]["hccl"]
    assert back["outcome"] == "slower"
    assert back["lead_speedup"] == pytest.approx(0.028 / 0.040)
    assert {j["outcome"] for j in back["headlines"]} == {"worse"}


def test_higher_throughput_is_better_but_higher_latency_is_worse():
    assert judge("saturation_throughput_tok_per_s", 100.0, 120.0)["outcome"] == "better"
    assert judge("tpot_p99_s", 0.1, 0.12)["outcome"] == "worse"
    assert judge("dispatch_ht_busbw_GBps", 100.0, 120.0)["outcome"] == "better"  # a pattern family
    assert judge("dispatch_ht_time_us", 100.0, 120.0)["outcome"] == "worse"
    assert judge("mean_decode_batch_per_die", 1.0, 2.0)["outcome"] == "context"  # no direction


def test_ties_within_the_tie_band_and_p99_noise():
    m = {"hccl": _serving(0.040, 30.0, 7000.0), "stratacl": _serving(0.041, 30.3, 7070.0)}
    v = verdict("llm_infer", m, "hccl")["libraries"]["stratacl"]
    # TPOT p99 +2.5 % is inside the P99 band (±5 %), E2E +1 %, saturation +1 % inside ±2 %
    assert [j["outcome"] for j in v["headlines"]] == ["tie", "tie", "tie"]
    assert v["outcome"] == "tie"
    assert d.info("tpot_p99_s").tie > d.info("saturation_throughput_tok_per_s").tie


def test_mixed_when_decisive_headlines_disagree():
    m = {"hccl": _serving(0.040, 30.0, 7000.0), "x": _serving(0.030, 30.0, 6000.0)}
    v = verdict("llm_infer", m, "hccl")["libraries"]["x"]
    assert v["outcome"] == "mixed"
    assert v["lead_metric"] == "tpot_p99_s"


def test_missing_metrics_are_named_and_a_run_without_headlines_has_no_verdict():
    m = {"hccl": {"tpot_p99_s": 0.04, "e2e_p99_s": None}, "x": {"tpot_p99_s": 0.03}}
    v = verdict("llm_infer", m, "hccl")["libraries"]["x"]
    assert v["outcome"] == "faster" and v["missing"] == ["e2e_p99_s"]
    none = verdict("llm_infer", {"hccl": {"foo": 1.0}, "x": {"foo": 2.0}}, "hccl")["libraries"]["x"]
    assert none["outcome"] == "no verdict" and none["lead_metric"] is None
    nan = verdict("llm_infer", {"hccl": {"tpot_p99_s": float("nan")}, "x": {"tpot_p99_s": 0.1}}, "hccl")
    assert nan["libraries"]["x"]["outcome"] == "no verdict"


def test_verdict_is_json_safe_with_zeros():
    m = {"hccl": {"iteration_time_s": 1.0, "exposed_comm_s": 0.2},
         "x": {"iteration_time_s": 0.0, "exposed_comm_s": 0.0}}
    v = verdict("llm_train", m, "hccl")
    json.dumps(v, allow_nan=False)
    assert v["libraries"]["x"]["outcome"] == "faster" and v["libraries"]["x"]["lead_speedup"] is None


def test_mechanisms_material_and_ordered_by_share_of_the_step():
    base = {"iteration_time_s": 10.0, "exposed_comm_s": 3.0, "comm_copy_s": 1.0, "comm_launch_s": 0.02,
            "peak_mem_GB_per_die": 40.0}
    lib = {"iteration_time_s": 8.0, "exposed_comm_s": 1.0, "comm_copy_s": 0.5, "comm_launch_s": 0.05,
           "peak_mem_GB_per_die": 40.0}
    mech = verdict("llm_train", {"hccl": base, "x": lib}, "hccl")["libraries"]["x"]["mechanisms"]
    # exposed comm −20 % of the iteration, copies −5 %; launch +0.3 % is immaterial; memory equal
    assert [j["metric"] for j in mech] == ["exposed_comm_s", "comm_copy_s"]
    assert mech[0]["share_of_whole"] == pytest.approx(-0.2)
    assert mech[0]["mechanism"] == d.EXPOSED


def test_accounting_from_iteration_rows_and_operator_rows():
    its = pd.DataFrame({"library": ["a", "a", "b"], "phase": ["decode"] * 3, "time_s": [1.0, 3.0, 1.0],
                        "exposed_comm_s": [0.2, 0.4, 0.0], "copy_s": [0.1, 0.1, 0.0],
                        "register_s": [0.0] * 3, "launch_s": [0.0] * 3})
    acc = accounting(pd.DataFrame(), {"iterations": its})
    assert acc["a"]["decode_iter_time_s"] == 2.0 and acc["a"]["decode_iter_exposed_comm_s"] == pytest.approx(0.3)
    ops = pd.DataFrame({"library": ["a", "a"], "size_bytes": [1, 2], "wire_s": [1.0, 2.0], "copy_s": [0.5, 0.5]})
    assert accounting(ops, {}) == {"a": {"op_wire_s": 3.0, "op_copy_s": 1.0}}


def test_one_number_format_and_units_in_the_table():
    assert fmt(201807.762) == "201,808" and fmt(0.002577) == "0.002577" and fmt(23.4352) == "23.44"
    assert fmt(None) == "–" and fmt(float("nan")) == "–" and fmt(0.0) == "0"
    assert "e" not in fmt(1234567.0)
    m = {"hccl": _serving(0.040, 31.5, 7000.0), "stratacl": _serving(0.028, 25.0, 7900.0)}
    lines = table_lines(m, "hccl", "llm_infer")
    assert lines[0].split()[:5] == ["metric", "unit", "better", "hccl", "stratacl"]
    first = lines[2].split()
    assert first[:3] == ["tpot_p99_s", "ms", "↓"] and first[3:5] == ["40.00", "28.00"] and first[5] == "0.700×"
    pinned = next(line for line in lines if line.startswith("throughput_tok_per_s"))
    assert "(load)" in pinned


def test_reference_column_is_display_only():
    m = {"cann_ep": {"decode_tok_per_s_per_npu": 1000.0}, "stratacl": {"decode_tok_per_s_per_npu": 1100.0}}
    ref = {"source": "paper §5", "values": {"cann_ep": {"decode_tok_per_s_per_npu": 1943}}}
    before = json.dumps(m)
    text = "\n".join(report_lines("llm_infer", {"libraries": m, "baseline": "cann_ep"}, reference=ref))
    assert json.dumps(m) == before  # nothing written back
    row = next(line for line in text.splitlines() if line.startswith("decode_tok_per_s_per_npu") and "1,943" in line)
    assert row.split()[1:] == ["cann_ep", "tok/s", "1,000", "1,943", "-49", "%"]
    assert "source: paper §5" in text
    # the verdict is the same with and without a reference
    plain = "\n".join(report_lines("llm_infer", {"libraries": m, "baseline": "cann_ep"}))
    assert plain.split("verdict vs")[1] == text.split("verdict vs")[1]


def test_merge_accounting_drops_renamed_duplicates_but_keeps_zeros_and_wholes():
    metrics = {"a": {"decode_step_s": 0.1, "decode_exposed_comm_s": 0.02}, "b": {"decode_step_s": 0.2,
                                                                               "decode_exposed_comm_s": 0.0}}
    acc = {"a": {"decode_iter_time_s": 0.1, "decode_iter_exposed_comm_s": 0.02, "decode_iter_register_s": 0.0},
           "b": {"decode_iter_time_s": 0.2, "decode_iter_exposed_comm_s": 0.0, "decode_iter_register_s": 0.0}}
    merged = merge_accounting(metrics, acc)
    assert "decode_iter_exposed_comm_s" not in merged["a"]  # the same numbers as decode_exposed_comm_s
    assert merged["a"]["decode_iter_time_s"] == 0.1  # a whole the mechanisms' shares refer to
    assert merged["b"]["decode_iter_register_s"] == 0.0  # zeros equal to other zeros are not duplicates


EXPERIMENTS = Path(__file__).resolve().parents[1] / "conf" / "experiment"


@pytest.mark.parametrize("path", sorted(EXPERIMENTS.glob("*.yaml")), ids=lambda p: p.stem)
def test_experiment_references_name_known_metrics_with_a_source(path: Path):
    ref = (yaml.safe_load(path.read_text()) or {}).get("reference")
    if ref is None:
        return
    assert ref.get("source"), f"{path.name}: a reference needs its source"
    for lib, values in (ref.get("values") or {}).items():
        for metric, value in values.items():
            assert d.info(metric).better is not None, f"{path.name}: {lib}.{metric} is not a known metric"
            assert float(value) > 0


def test_reference_values_never_enter_a_result(tmp_path: Path):
    """The same run with a different published value: identical metrics, ratios and verdict."""
    base = ["+experiment=moe_table", "workload.iters=1", "workload.warmup=1", "output.timeline=false"]
    a = run_cli([*base, f"hydra.run.dir={tmp_path / 'a'}"], tmp_path)
    b = run_cli([*base, "reference.values.stratacl.dispatch_ht_deepep_logical_GBps=1", f"hydra.run.dir={tmp_path / 'b'}"],
                tmp_path)
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    sa, sb = (json.loads((tmp_path / x / "summary.json").read_text()) for x in "ab")
    assert sa == sb and "verdict" in sa
    assert "harness  published  error" in a.stdout
    row = next(ln for ln in b.stdout.splitlines() if ln.startswith("dispatch_ht_deepep_logical_GBps") and " stratacl " in ln)
    assert row.split()[-3] == "1.000"  # the override shows, only in the display


def test_a_rate_is_never_judged_as_a_time() -> None:
    """`*_per_s` names are rates: never "s, lower is better" (a goodput of 0.6 req/s printed as
    600 ms and judged worse than 0.5); an unlisted rate (an offered rate, a search ceiling) is context."""
    from stratacl.directions import EXACT, info

    for name in [*EXACT, "slo_capacity_ceiling_req_per_s", "rate_req_per_s", "some_new_per_s"]:
        if name.endswith("_per_s"):
            assert info(name).unit != "s" and info(name).better != "lower", name
    assert info("slo_capacity_ceiling_req_per_s").better is None
    assert info("goodput_req_per_s").better == "higher"


# ------------------------------------------------------------------ collectives: size bands
def _bands(**cells: tuple[float, float]) -> dict[str, dict[str, float]]:
    """Two libraries' collectives metrics from {"<coll>_<band>": (baseline time, library time)};
    a band's own value is the geometric mean of its cells, as workloads/collectives.py computes it."""
    out: dict[str, dict[str, float]] = {"hccl": {}, "x": {}}
    for key, pair in cells.items():
        for lib, t in zip(out, pair, strict=True):
            out[lib][f"{key}_op_time_s"] = t
    for band in ("small", "medium", "large"):
        for k, lib in enumerate(out):
            vals = [p[k] for c, p in cells.items() if c.endswith(f"_{band}")]
            if vals:
                out[lib][f"{band}_op_time_s"] = float(pd.Series(vals).prod() ** (1 / len(vals)))
    # a mean busbw that favours x overall: context, never the verdict
    out["hccl"]["busbw_GBps_mean"], out["x"]["busbw_GBps_mean"] = 85.0, 106.0
    return out


def test_a_slower_band_makes_the_collectives_verdict_mixed_not_faster():
    m = _bands(allreduce_small=(1.0, 0.3), allgather_small=(1.0, 0.4), allreduce_medium=(1.0, 1.01),
               allgather_medium=(1.0, 0.99), allreduce_large=(1.0, 1.24), allgather_large=(1.0, 1.20))
    v = verdict("collectives", m, "hccl")["libraries"]["x"]
    assert v["outcome"] == "mixed"
    bands = {j["metric"]: j["outcome"] for j in v["headlines"]}
    assert bands == {"small_op_time_s": "better", "medium_op_time_s": "tie", "large_op_time_s": "worse"}
    assert [c["metric"] for c in v["headlines"][2]["parts"]] == ["allreduce_large_op_time_s", "allgather_large_op_time_s"]
    assert [c["metric"] for c in v["context"]] == ["busbw_GBps_mean"]  # shown, not judged
    head = verdict_lines(verdict("collectives", m, "hccl"))[1]
    assert head.startswith("  x: MIXED — faster on small (< 1 MiB) (2.89×), tie on medium (1 MiB – 16 MiB) (1.000×")
    assert "slower on large (≥ 16 MiB) (1.22×)" in head and "FASTER" not in head


def test_a_band_whose_collectives_disagree_is_mixed_and_names_the_slower_ones():
    m = _bands(allreduce_large=(1.0, 1.14), allgather_large=(1.0, 1.12), alltoall_large=(1.0, 0.66))
    v = verdict("collectives", m, "hccl")["libraries"]["x"]
    (large,) = v["headlines"]
    assert large["outcome"] == "mixed" and v["outcome"] == "mixed"
    assert large["ratio"] < 1  # faster over the band: the geometric mean hides the two slower collectives
    head = verdict_lines(verdict("collectives", m, "hccl"))[1]
    assert "mixed on large (≥ 16 MiB) (" in head
    assert "slower allreduce 1.14×, allgather 1.12×; faster alltoall 1.52×" in head


def test_every_band_within_its_tie_band_reads_tie_and_every_band_faster_reads_faster():
    tie = _bands(allreduce_small=(1.0, 1.015), allreduce_large=(1.0, 0.985))
    v = verdict("collectives", tie, "hccl")["libraries"]["x"]
    assert v["outcome"] == "tie" and {j["outcome"] for j in v["headlines"]} == {"tie"}
    assert verdict_lines(verdict("collectives", tie, "hccl"))[1].startswith("  x: TIE — small (< 1 MiB) (1.015×, within ±2%)")
    # just beyond the band: decisive
    assert judge("allreduce_small_op_time_s", 1.0, 1.021)["outcome"] == "worse"
    fast = _bands(allreduce_small=(1.0, 0.5), allreduce_large=(1.0, 0.9))
    assert verdict("collectives", fast, "hccl")["libraries"]["x"]["outcome"] == "faster"
    assert "faster on large (≥ 16 MiB) (1.11×)" in verdict_lines(verdict("collectives", fast, "hccl"))[1]


# ------------------------------------------------------------------ interference: the overlapped step
def _interference(step: float, slowdown: float) -> dict[str, float]:
    return {"overlapped_s": step, "concurrent_compute_slowdown": slowdown, "compute_slowdown": slowdown / 5,
            "comm_hbm_GB_per_die": 10.0}


def test_interference_headline_is_the_overlapped_step_and_slowdowns_are_context():
    # the step ties (0.996×) while the compute slowdown vanishes: a tie, not FASTER
    m = {"hccl": _interference(0.08428, 0.0202), "x": _interference(0.08398, 0.0)}
    block = verdict("interference", m, "hccl")
    v = block["libraries"]["x"]
    assert [j["metric"] for j in v["headlines"]] == ["overlapped_s"]
    assert v["outcome"] == "tie" and v["lead_metric"] == "overlapped_s"
    assert {j["outcome"] for j in v["context"]} == {"context"}
    lines = verdict_lines(block)
    assert lines[1] == "  x: TIE — overlapped step (0.996×, within ±2%)"
    assert any(ln.strip().startswith("context (not judged): concurrent compute slowdown 2.020 % → 0 %") for ln in lines)
    # a slower step is SLOWER whatever the slowdown does
    slow = {"hccl": _interference(0.080, 0.02), "x": _interference(0.090, 0.0)}
    assert verdict("interference", slow, "hccl")["libraries"]["x"]["outcome"] == "slower"


def test_an_overloaded_serving_run_carries_its_caveat_and_a_served_one_does_not() -> None:
    def serving(tpot: float, overloaded: float) -> dict[str, float]:
        return {"tpot_p99_s": tpot, "e2e_p99_s": 100 * tpot, "overloaded": overloaded}

    over = verdict("llm_infer", {"hccl": serving(0.05, 1.0), "x": serving(0.04, 0.0)}, "hccl")["libraries"]["x"]
    assert over["outcome"] == "faster"  # the verdict stands ...
    (caveat,) = over["caveats"]  # ... read with what it rests on: the baseline's queue grows
    assert caveat.startswith("hccl: overloaded (regime note)")
    lines = verdict_lines(verdict("llm_infer", {"hccl": serving(0.05, 1.0), "x": serving(0.04, 1.0)}, "hccl"))
    assert any(ln.strip().startswith("caveat: hccl and x: overloaded") for ln in lines)
    served = verdict("llm_infer", {"hccl": serving(0.05, 0.0), "x": serving(0.04, 0.0)}, "hccl")
    assert served["libraries"]["x"]["caveats"] == []
    assert not any("caveat" in ln for ln in verdict_lines(served))
