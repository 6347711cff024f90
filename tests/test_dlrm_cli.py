"""`python -m stratacl.run workload=dlrm_train` end to end, and its clear failure."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from helpers import run_cli

DLRM = ["workload=dlrm_train"]


def test_default_dlrm_run_compares_both_libraries(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_cli([*DLRM, f"hydra.run.dir={out}", "output.timeline=false"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workload"] == "dlrm_train" and list(summary["libraries"]) == ["hccl", "stratacl"]
    for lib, m in summary["libraries"].items():
        assert m["iteration_time_s"] >= m["compute_s"] > 0, lib
        assert 0 < m["cache_hit_rate"] <= 1
    assert summary["ratios"]["hccl"]["iteration_time_s"] == 1.0
    # hccl's two 200 MB staging buffers come out of the cache
    assert summary["libraries"]["hccl"]["cache_GB_per_die"] < summary["libraries"]["stratacl"]["cache_GB_per_die"]
    rows = pd.read_parquet(out / "results.parquet")
    assert len(rows) == 2 * 3  # libraries × iterations
    assert {"iteration_time_s", "compute_s", "exposed_comm_s", "exposed_cache_miss_s"} <= set(rows.columns)
    assert "stratacl/hccl" in proc.stdout  # the side-by-side ratio column


def test_bad_sharding_exits_2_without_summary(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_cli([*DLRM, f"hydra.run.dir={out}", "workload.sharding=table_wise"], tmp_path)
    assert proc.returncode == 2
    assert "workload.sharding" in proc.stderr and "Traceback" not in proc.stderr
    assert not (out / "summary.json").exists()
