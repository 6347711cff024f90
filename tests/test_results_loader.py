"""stratacl.report.results: run directories (single runs, sweeps, failed runs) into tidy frames."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from helpers import load_script, run_cli

from stratacl.report.results import MixedRunsError, flatten, load_runs

SMALL = ["workload.max_bytes=262144", "output.timeline=false"]  # 64–256 KiB: 3 sizes


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory) -> Path:  # noqa: ANN001
    root = tmp_path_factory.mktemp("runs")
    sweep = run_cli(["--multirun", *SMALL, "workload.ranks=16,32",
                     f"hydra.sweep.dir={root / 'sweep'}"], root)
    assert sweep.returncode == 0, sweep.stderr
    single = run_cli([*SMALL, "workload.collectives=[allgather]", f"hydra.run.dir={root / 'single'}"], root)
    assert single.returncode == 0, single.stderr
    # a run killed before it wrote summary.json (an out-of-memory kill, a lost node) leaves its
    # config and log; a config error, by contrast, leaves nothing (tests/test_cli.py)
    failed = run_cli([*SMALL, "workload.ranks=1000", f"hydra.run.dir={root / 'failed'}"], root)
    assert failed.returncode == 2 and not (root / "failed").exists()
    shutil.copytree(root / "single" / ".hydra", root / "failed" / ".hydra")
    (root / "failed" / "run.log").write_text("killed\n")
    return root


def test_loads_sweeps_and_single_runs_and_counts_failed_ones(runs_root, caplog) -> None:  # noqa: ANN001
    with caplog.at_level(logging.WARNING, logger="stratacl.report.results"):
        runs = load_runs(runs_root, mixed="label")  # the single run lists other collectives
    assert runs.mixed == ["workload.collectives"] and runs.varying == ["workload.ranks", "workload.collectives"]
    assert runs.summary.drop_duplicates("run").set_index("run")["config"]["single"] == \
        "workload.ranks=32, workload.collectives=('allgather',)"
    assert runs.skipped == [(runs_root / "failed").resolve()]
    assert "skipped 1 without summary.json" in caplog.text
    s = runs.summary
    assert len(s) == 3 * 2 and set(s["library"]) == {"hccl", "stratacl"}
    assert sorted(s["run"].unique()) == ["single", "sweep/workload.max_bytes=262144,workload.ranks=16",
                                         "sweep/workload.max_bytes=262144,workload.ranks=32"]
    # values are the summary.json values, keyed by the swept parameter
    by = s.groupby(["library", "workload.ranks"])["allgather_busbw_GBps_mean"].mean()
    point = json.loads((runs_root / "sweep" / "workload.max_bytes=262144,workload.ranks=16" /
                        "summary.json").read_text())
    assert by[("stratacl", 16)] == pytest.approx(point["libraries"]["stratacl"]["allgather_busbw_GBps_mean"])
    assert (s.loc[s["library"] == "hccl", "busbw_GBps_mean_ratio"] == 1.0).all()
    ratio = s.loc[s["library"] == "stratacl", "busbw_GBps_mean_ratio"].to_numpy()
    base = s.loc[s["library"] == "hccl", "busbw_GBps_mean"].to_numpy()
    assert ratio == pytest.approx(s.loc[s["library"] == "stratacl", "busbw_GBps_mean"].to_numpy() / base)
    # each row carries its own library's knobs, and lists stay hashable
    knobs = s.drop_duplicates("library").set_index("library")["lib.data_path"].to_dict()
    assert knobs == {"hccl": "staged", "stratacl": "on_alloc"}
    assert s.loc[s["run"] == "single", "workload.collectives"].iloc[0] == ("allgather",)
    assert "allreduce_busbw_GBps_mean" in runs.metrics and "lib.data_path" not in runs.metrics


def test_refuses_runs_mixed_in_an_unswept_key_and_names_it(runs_root) -> None:  # noqa: ANN001
    with pytest.raises(MixedRunsError, match=r"differ in config keys no sweep varied: workload.collectives "
                                             r"\(\('allgather',\), \('allreduce'"):
        load_runs(runs_root)
    # within one sweep directory the swept key may differ; the config column names it
    sweep = load_runs(runs_root / "sweep")
    assert sweep.mixed == [] and sweep.varying == ["workload.ranks"]
    assert set(sweep.summary["config"]) == {"workload.ranks=16", "workload.ranks=32"}
    # a where= filter selects one configuration out of the mixed root
    only = load_runs(runs_root, where={"workload.collectives": ("allgather",)})
    assert list(only.summary["run"].unique()) == ["single"]


def test_results_rows_carry_the_run_config(runs_root) -> None:  # noqa: ANN001
    runs = load_runs(runs_root, mixed="allow")
    r = runs.results
    expected = sum(len(pd.read_parquet(p)) for p in runs_root.rglob("results.parquet"))
    assert len(r) == expected == 2 * (2 * 4 * 3) + 2 * 3  # sweep: 2 points × libs × colls × sizes
    # the joined config agrees with what the workload wrote (group_size = ranks for one group)
    assert (r["workload.ranks"] == r["group_size"]).all()
    assert set(r.groupby("run")["workload.ranks"].first()) == {16, 32}
    busbw = r.groupby(["library", "workload.ranks", "collective"])["busbw_GBps"].mean()
    assert busbw[("stratacl", 16, "allgather")] > 0


def test_globs_summary_files_and_long_form(runs_root) -> None:  # noqa: ANN001
    runs = load_runs(str(runs_root / "sweep" / "*"))
    assert runs.summary["run"].nunique() == 2 and runs.skipped == []
    one = load_runs(runs_root / "single" / "summary.json")
    assert list(one.summary["run"].unique()) == ["single"]
    long = one.long()
    assert len(long) == 2 * len(one.metrics)
    assert set(long.columns) >= {"run", "library", "metric", "value", "ratio"}
    row = long[(long["library"] == "stratacl") & (long["metric"] == "busbw_GBps_mean")].iloc[0]
    assert row["ratio"] == pytest.approx(row["value"] / long[(long["library"] == "hccl") & (
        long["metric"] == "busbw_GBps_mean")]["value"].iloc[0])
    with pytest.raises(FileNotFoundError, match="no run directory"):
        load_runs(runs_root / "nope")


def test_flatten() -> None:
    assert flatten({"a": {"b": 1, "c": [1, [2, 3]]}, "d": {}}) == {"a.b": 1, "a.c": (1, (2, 3)), "d": {}}


# --------------------------------------------------------------------------- analysis/ on top

ANALYSIS = Path(__file__).resolve().parents[1] / "analysis"


@pytest.fixture(scope="module")
def plots():  # noqa: ANN201
    pytest.importorskip("matplotlib")
    return load_script(ANALYSIS / "plots.py")


def test_busbw_plot_draws_every_library_and_paper_targets(runs_root, plots) -> None:  # noqa: ANN001
    runs = load_runs(runs_root / "single")
    targets = pd.DataFrame({"library": ["stratacl"], "collective": ["allgather"],
                            "size_bytes": [131072], "busbw_GBps": [50.0]})
    fig = plots.busbw_vs_size(runs.results, targets=targets)
    (ax,) = [a for a in fig.axes if a.get_visible()]
    assert ax.get_title() == "allgather" and ax.get_xscale() == "log"
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert set(lines) == {"hccl", "stratacl"}
    rows = runs.results[runs.results["library"] == "stratacl"].sort_values("size_bytes")
    assert list(lines["stratacl"].get_xdata()) == list(rows["size_bytes"])
    assert list(lines["stratacl"].get_ydata()) == pytest.approx(list(rows["busbw_GBps"]))
    assert ax.collections[0].get_offsets().tolist() == [[131072.0, 50.0]]
    assert "64 KiB" in [t.get_text() for t in ax.get_xticklabels()]


def test_metric_vs_param_and_stacked_bars(runs_root, plots) -> None:  # noqa: ANN001
    runs = load_runs(runs_root / "sweep")
    fig = plots.metric_vs_param(runs.summary, "busbw_GBps_mean", "workload.ranks", ratio=True)
    lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    assert list(lines["hccl"].get_xdata()) == [16, 32] and list(lines["hccl"].get_ydata()) == [1.0, 1.0]
    fig = plots.stacked_bars(runs.results, "library", ["wire_s", "copy_s", "sync_s"],
                             order=["hccl", "stratacl"], scale=1e3)
    heights = {}
    for bar in fig.axes[0].patches:
        heights[bar.get_x()] = heights.get(bar.get_x(), 0.0) + bar.get_height()
    expected = runs.results.groupby("library")[["wire_s", "copy_s", "sync_s"]].sum().sum(axis=1) * 1e3
    assert sorted(heights.values()) == pytest.approx(sorted(expected))


@pytest.mark.parametrize("existing", [False, True], ids=["no-runs-yet", "existing-runs"])
def test_operators_notebook_runs_headless(tmp_path, runs_root, existing) -> None:  # noqa: ANN001
    pytest.importorskip("matplotlib")
    figures = tmp_path / "figures"
    env = {**os.environ, "MPLBACKEND": "Agg", "STRATACL_FIGURES": str(figures),
           "STRATACL_RUNS": str(runs_root if existing else tmp_path / "empty")}
    proc = subprocess.run([sys.executable, str(ANALYSIS / "operators.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    png = figures / "operators_busbw.png"
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (figures / "operators_time_split.png").stat().st_size > 0
    assert ("Runs(3 runs" in proc.stdout) == existing  # used the runs it found, else made one
    # the single run lists other collectives than the sweep: drawn apart, not averaged in
    assert ("MIXED configurations, drawn apart: ['workload.collectives']" in proc.stdout) == existing
