"""analysis/ notebooks run headless end to end: with no runs they simulate tiny configurations
(`STRATACL_NB_TINY=1`), load them with `load_runs` and write non-empty PNG figures; their .ipynb
twins stay in sync with the percent scripts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_cli

from stratacl.metrics import LATENCY_DEFINITION

ANALYSIS = Path(__file__).resolve().parents[1] / "analysis"
REPO = ANALYSIS.parent
PNG = b"\x89PNG\r\n\x1a\n"

NOTEBOOKS = {
    "moe": (["moe_busbw_vs_paper"], ["dispatch HT", "harness/paper"]),
    "inference": (["inference_vs_rate", "inference_ttft_cdf"],
                  ["throughput_tok_per_s", "TTFT quantiles", "closed-loop saturation", "2 seed(s) per point",
                   "experiment ['inference_rates']", f"latency percentiles: {LATENCY_DEFINITION}",
                   "ttft_p99_ms"]),
    "training": (["training_llm_iterations", "training_dlrm_cache_batch"], ["iteration time (ms)"]),
    "ablation": (["ablation_inference_step_split", "ablation_inference_metrics", "ablation_operators_split"],
                 ["stratacl_no_partition", "P99 TTFT"]),
    # two tiny deployment searches (prompt- and decode-heavy arrivals): goodput ratios per SLO scale
    # and the configured layout's P99 ratios per offered load, from the runs' own tables
    "regimes": (["regime_map", "regime_slo_scale"],
                ["poisson in 2048 / out 64", "poisson in 2048 / out 256", "goodput at best layout, library ÷ baseline",
                 # every library is served on the configured layout at the baseline's goodput × fixed_loads
                 "P99 ratios of the configured layout", "tpot_p99_s", "ttft_p99_s"]),
}


def run_notebook(name: str, tmp_path: Path, runs: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "MPLBACKEND": "Agg", "STRATACL_FIGURES": str(tmp_path / "figures"),
           "STRATACL_RUNS": str(runs), "STRATACL_NB_TINY": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(ANALYSIS / f"{name}.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("name", list(NOTEBOOKS))
def test_notebook_runs_headless_from_scratch(name: str, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    proc = run_notebook(name, tmp_path, tmp_path / "no-runs-yet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "simulating:" in proc.stdout  # nothing to load: it made its own runs
    figures, texts = NOTEBOOKS[name]
    for fig in figures:
        png = tmp_path / "figures" / f"{fig}.png"
        assert png.is_file(), f"{fig}.png missing; wrote {sorted(p.name for p in (tmp_path / 'figures').glob('*'))}"
        data = png.read_bytes()
        assert data[:8] == PNG and len(data) > 20_000  # a drawn figure, not an empty canvas
    for text in texts:
        assert text in proc.stdout


def test_moe_notebook_uses_existing_runs(tmp_path: Path) -> None:
    """With a matching run under STRATACL_RUNS it loads that instead of simulating."""
    runs = tmp_path / "runs"
    made = run_cli(["+experiment=moe_table", "workload.iters=1", "workload.warmup=1", "output.timeline=false",
                    f"hydra.run.dir={runs / 'moe'}"], tmp_path, timeout=240)
    assert made.returncode == 0, made.stderr
    summary = json.loads((runs / "moe" / "summary.json").read_text())
    proc = run_notebook("moe", tmp_path, runs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "simulating:" not in proc.stdout and "Runs(1 runs, 4 run×library rows" in proc.stdout
    # the printed side-by-side table shows this run's StrataCL dispatch-HT value
    value = summary["libraries"]["stratacl"]["dispatch_ht_deepep_logical_GBps"]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("dispatch HT"))
    assert f"{value:,.2f}" in line and "130.00" in line  # harness and paper side by side


def test_notebook_refuses_runs_of_mixed_configurations(tmp_path: Path) -> None:
    """Two moe_table runs at different EP sizes are not pooled into one table: exit 2, key named."""
    runs = tmp_path / "runs"
    for ep in (16, 32):
        made = run_cli(["+experiment=moe_table", f"workload.ep={ep}", "workload.iters=1",
                        "workload.warmup=1", "output.timeline=false", f"hydra.run.dir={runs / f'ep{ep}'}"],
                       tmp_path, timeout=240)
        assert made.returncode == 0, made.stderr
    proc = run_notebook("moe", tmp_path, runs)
    assert proc.returncode == 2 and "simulating:" not in proc.stdout
    assert "refused" in proc.stderr and "workload.ep (16, 32)" in proc.stderr
    # naming one sweep directory reads it alone
    env_args = [sys.executable, str(ANALYSIS / "moe.py"), "--runs", str(runs / "ep32")]
    one = subprocess.run(env_args, cwd=tmp_path, capture_output=True, text=True, timeout=240,
                         env={**os.environ, "MPLBACKEND": "Agg", "STRATACL_FIGURES": str(tmp_path / "f")})
    assert one.returncode == 0, one.stderr[-2000:]
    assert "Runs(1 runs" in one.stdout


@pytest.mark.parametrize("name", list(NOTEBOOKS))
def test_ipynb_twin_matches_the_script(name: str) -> None:
    jupytext = pytest.importorskip("jupytext")
    script = jupytext.read(ANALYSIS / f"{name}.py")
    twin = jupytext.read(ANALYSIS / f"{name}.ipynb")
    assert [c.source for c in script.cells] == [c.source for c in twin.cells]
