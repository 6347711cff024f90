"""`python -m stratacl.run workload=llm_train` on a small layout writes the run directory."""

from __future__ import annotations

import json

import pandas as pd
from helpers import merged, run_cli

SMALL = ["workload=llm_train", "workload.num_layers=4", "workload.dies=16", "workload.fsdp=4",
         "workload.ep=8", "workload.global_batch=4", "workload.seq_len=512", "workload.iterations=[0,1000]",
         "output.timeline=false"]


def test_cli_small_layout(tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "run"
    proc = run_cli([*SMALL, f"hydra.run.dir={out}"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workload"] == "llm_train" and summary["baseline"] == "hccl"
    for lib in ("hccl", "stratacl"):
        m = summary["libraries"][lib]
        assert m["iteration_time_s"] >= m["compute_s"] > 0
        assert m["peak_mem_GB_per_die"] > 0 and m["tokens_per_s"] > 0
    assert summary["ratios"]["hccl"]["iteration_time_s"] == 1.0
    rows = pd.read_parquet(out / "results.parquet")
    assert len(rows) == 4 and set(rows["iteration"]) == {0, 1000}


def test_cli_layout_that_does_not_fit(tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "run"
    proc = run_cli([*SMALL, "fabric.die.hbm_GB=4", f"hydra.run.dir={out}"], tmp_path)
    assert proc.returncode == 2
    assert "GB per die" in proc.stderr and "Traceback" not in proc.stderr
    assert not (out / "summary.json").exists()


def test_cli_bad_pipeline_layouts_name_the_field(tmp_path) -> None:  # noqa: ANN001
    pipe = ["workload.dies=16", "workload.fsdp=2", "workload.tp=4", "workload.ep=8", "workload.global_batch=8",
            "workload.pp=2", "workload.microbatches=4"]
    for n, (extra, field) in enumerate([
            (["workload.pp_virtual_stages=4", "workload.pp_schedule=interleaved_1f1b"], "workload.pp"),  # 8 stages, 4 layers
            (["workload.pp_schedule=dualpipev", "workload.microbatches=2", "workload.global_batch=4"],
             "workload.microbatches"),  # DualPipeV: 4 stages need ≥ 4 micro-batches
            (["workload.saved_activations=deepseek_v3"], "workload.saved_activations")]):  # tp 4
        out = tmp_path / f"run{n}"
        proc = run_cli([*merged(SMALL, pipe, extra), f"hydra.run.dir={out}"], tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert f"'{field}'" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert not (out / "summary.json").exists()
