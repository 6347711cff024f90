"""The CLI as users run it: run directory, determinism, clear failures, multirun."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from helpers import run_cli

SMALL = ["workload.max_bytes=4194304"]  # keep CLI tests quick: 64 KiB – 4 MiB


def test_default_run_writes_the_run_directory(tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "run"
    proc = run_cli([f"hydra.run.dir={out}", *SMALL], tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workload"] == "collectives" and summary["fabric"] == "cloudmatrix384"
    assert summary["baseline"] == "hccl" and list(summary["libraries"]) == ["hccl", "stratacl"]
    assert summary["ratios"]["hccl"]["busbw_GBps_mean"] == pytest.approx(1.0)
    rows = pd.read_parquet(out / "results.parquet")
    assert set(rows["library"]) == {"hccl", "stratacl"}
    assert len(rows) == 2 * 4 * 7  # libraries × collectives × sizes 64 KiB..4 MiB
    # busbw = algbw × nccl-tests factor on every row
    ar = rows[rows["collective"] == "allreduce"]
    assert (ar["busbw_GBps"] / ar["algbw_GBps"]).round(9).eq(round(2 * 31 / 32, 9)).all()
    timeline = json.loads((out / "timeline.json").read_text())
    xs = [e for e in timeline["traceEvents"] if e["ph"] == "X"]
    assert xs and all(e["dur"] >= 0 for e in xs)
    assert (out / ".hydra" / "config.yaml").exists()
    assert "stratacl/hccl" in proc.stdout  # side-by-side table printed


def test_same_seed_gives_byte_identical_summary(tmp_path) -> None:  # noqa: ANN001
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        assert run_cli([f"hydra.run.dir={d}", "seed=7", *SMALL], tmp_path).returncode == 0
    assert (a / "summary.json").read_bytes() == (b / "summary.json").read_bytes()


@pytest.mark.parametrize("override, field", [
    ("workload.ranks=abc", "workload.ranks"),                       # wrong type (compose time)
    ("fabric.tiers.node.beta_GBps=-5", "fabric.tiers.node.beta_GBps"),  # negative bandwidth
    ("library=[hccl,nosuchlib]", "unknown library 'nosuchlib'"),    # unknown preset
    ("fabric=nosuchfabric", "unknown fabric 'nosuchfabric'"),       # unknown preset
    ("workload.ranks=1000", "workload.ranks"),                      # beyond 768 dies
    ("workload.group_size=5", "workload.group_size"),               # does not divide 32
    ("baseline=nccl", "baseline"),                                  # baseline not selected
    ("library.hccl.mover=dma", "library.hccl.mover"),               # not an enum value
])
def test_bad_config_fails_clearly(tmp_path, override, field) -> None:  # noqa: ANN001
    out = tmp_path / "run"
    proc = run_cli([f"hydra.run.dir={out}", override], tmp_path)
    assert proc.returncode == 2
    assert field in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr  # one line, no traceback
    assert "_schema" not in proc.stderr
    assert not (out / "summary.json").exists()
    assert not (out / "results.parquet").exists()


@pytest.mark.parametrize("override, field", [
    ("library.hccl.launch_us=nan", "library.hccl.launch_us"),
    ("fabric.die.sdma.engine_GBps=inf", "fabric.die.sdma.engine_GBps"),
    ("workload.min_bytes=-1", "workload.min_bytes"),
])
def test_out_of_range_value_writes_nothing(tmp_path, override, field) -> None:  # noqa: ANN001
    """Ranges and cross-field checks run before Hydra creates the run directory."""
    out = tmp_path / "run"
    proc = run_cli([f"hydra.run.dir={out}", override], tmp_path)
    assert proc.returncode == 2 and field in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not out.exists()


def test_multirun_with_joblib(tmp_path) -> None:  # noqa: ANN001
    sweep = tmp_path / "sweep"
    proc = run_cli(["--multirun", "workload.ranks=16,32", f"hydra.sweep.dir={sweep}", *SMALL], tmp_path)
    assert proc.returncode == 0, proc.stderr
    summaries = sorted(sweep.glob("*/summary.json"))
    assert len(summaries) == 2
    assert "Joblib" in proc.stdout + proc.stderr
    names = {p.parent.name for p in summaries}
    assert any("workload.ranks=16" in n for n in names)


def test_utilisation_series_written_on_request(tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "run"
    proc = run_cli([f"hydra.run.dir={out}", "output.utilisation=true", "workload.collectives=[allgather]",
                    *SMALL], tmp_path)
    assert proc.returncode == 0, proc.stderr
    util = pd.read_parquet(out / "utilisation.parquet")
    assert {"time_s", "resource", "utilisation", "library"} <= set(util.columns)
    assert set(util["library"]) == {"hccl", "stratacl"}
    assert util["utilisation"].max() <= 1 + 1e-9 and util["utilisation"].max() > 0.5  # ports get busy
