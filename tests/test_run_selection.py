"""load_runs selects runs explicitly and refuses mixed configurations (stratacl/report/results.py), on run
directories written by hand in the CLI's layout (summary.json, .hydra/{config,overrides,hydra}.yaml)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from stratacl.report.results import MixedRunsError, load_runs


def _run(d: Path, cfg: dict, overrides: list[str], multirun: bool, busbw: float) -> None:
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (d / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"mode": "RunMode.MULTIRUN" if multirun
                                                                       else "RunMode.RUN"}}))
    metrics = {"hccl": {"busbw_GBps_mean": busbw}, "stratacl": {"busbw_GBps_mean": 2 * busbw}}
    (d / "summary.json").write_text(json.dumps({
        "workload": cfg["workload"]["name"], "fabric": "f", "baseline": "hccl", "seed": cfg["seed"],
        "libraries": metrics, "ratios": {lib: {"busbw_GBps_mean": m["busbw_GBps_mean"] / busbw}
                                         for lib, m in metrics.items()}}))


def _cfg(ranks: int, seed: int = 0, **workload: object) -> dict:
    return {"workload": {"name": "collectives", "ranks": ranks, **workload}, "seed": seed,
            "library": {"hccl": {"data_path": "staged"}, "stratacl": {"data_path": "on_alloc"}},
            "output": {"timeline": False}}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    # two sweeps over message size, one at 32 and one at 64 ranks, and a named experiment's run
    for ranks in (32, 64):
        for k, size in enumerate((1 << 20, 1 << 24)):
            _run(tmp_path / f"sweep{ranks}" / str(k), _cfg(ranks, max_bytes=size),
                 [f"workload.ranks={ranks}", f"workload.max_bytes={size}"], True, 10.0 * ranks + k)
    _run(tmp_path / "exp", _cfg(32, max_bytes=1 << 30), ["+experiment=operators"], False, 99.0)
    for seed in (0, 1):
        _run(tmp_path / f"seed{seed}", _cfg(32, seed=seed, max_bytes=1 << 30), ["+experiment=operators",
                                                                                 f"seed={seed}"], False, 98.0)
    return tmp_path


def test_pooling_two_sweeps_of_different_rank_counts_is_refused_naming_the_key(root: Path) -> None:
    with pytest.raises(MixedRunsError) as exc:
        load_runs([root / "sweep32", root / "sweep64"])
    msg = str(exc.value)
    assert "workload.ranks (32, 64)" in msg and "4 selected runs" in msg
    assert "max_bytes" not in msg  # swept within each sweep directory: meant to differ
    labelled = load_runs([root / "sweep32", root / "sweep64"], mixed="label")
    assert labelled.mixed == ["workload.ranks"]
    labels = labelled.summary.groupby("config")["run"].nunique()
    assert len(labels) == 4 and (labels == 1).all()
    assert "workload.max_bytes=1048576, workload.ranks=64" in labels.index
    # naming the key as meant to vary accepts the pool
    assert load_runs([root / "sweep32", root / "sweep64"], vary=["workload.ranks"]).mixed == []


def test_one_sweep_directory_loads_alone(root: Path) -> None:
    runs = load_runs(root / "sweep64")
    assert runs.mixed == [] and runs.varying == ["workload.max_bytes"]
    assert set(runs.summary["workload.ranks"]) == {64}


def test_selection_by_experiment_picks_only_that_experiments_runs(root: Path) -> None:
    runs = load_runs(root, experiment="operators")
    assert sorted(runs.summary["run"].unique()) == ["exp", "seed0", "seed1"]
    assert set(runs.summary["experiment"]) == {"operators"}
    assert runs.varying == [] and runs.mixed == []  # seeds are replicates, not a configuration
    assert load_runs(root, experiment="nosuch").summary.empty


def test_selection_by_config_filter(root: Path) -> None:
    runs = load_runs(root, where={"workload.ranks": 64, "workload.max_bytes": lambda b: b > 1 << 20})
    assert list(runs.summary["run"].unique()) == ["sweep64/1"]
    assert load_runs(root, workload="moe").summary.empty
    with pytest.raises(ValueError, match="mixed='x'"):
        load_runs(root, mixed="x")


def test_library_knobs_that_differ_across_runs_are_mixed(root: Path, tmp_path: Path) -> None:
    cfg = _cfg(32, max_bytes=1 << 30)
    cfg["library"]["hccl"]["data_path"] = "pool"
    _run(tmp_path / "pool", cfg, ["library.hccl.data_path=pool"], False, 50.0)
    with pytest.raises(MixedRunsError, match=r"library.hccl.data_path \('pool', 'staged'\)"):
        load_runs([root / "exp", tmp_path / "pool"])


def test_runs_whose_metric_names_meant_other_things_are_refused_together(tmp_path: Path) -> None:
    """A run from before a metric changed meaning (no `metrics_version`: version 1) and one from
    today differ in `harness.metrics_version`, as in a config key."""
    from stratacl.report.results import METRICS_VERSION

    _run(tmp_path / "old", _cfg(32), [], False, 10.0)
    _run(tmp_path / "new", _cfg(32), [], False, 10.0)
    new = json.loads((tmp_path / "new" / "summary.json").read_text())
    (tmp_path / "new" / "summary.json").write_text(json.dumps({**new, "metrics_version": METRICS_VERSION}))
    with pytest.raises(MixedRunsError, match=rf"harness.metrics_version \(1, {METRICS_VERSION}\)"):
        load_runs(tmp_path)
    assert set(load_runs(tmp_path / "new").summary["harness.metrics_version"]) == {METRICS_VERSION}
