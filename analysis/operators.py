# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Operator micro-benchmarks: bus bandwidth vs message size
#
# Loads every `workload=collectives` run under `runs/` (or `$STRATACL_RUNS`) with
# `stratacl.results.load_runs` and draws busbw vs per-rank message size, one panel per
# collective, one line per library (nccl-tests convention, REFERENCE §5). With no such run,
# it first runs a small one (64 KiB – 64 MiB, 32 ranks) into a temporary directory.
# Figures go to `analysis/figures/` (or `$STRATACL_FIGURES`).
#
# Run headless: `MPLBACKEND=Agg python analysis/operators.py`; open as a notebook through
# jupytext (`analysis/operators.ipynb` is the paired copy).

# %%
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
sys.path.insert(0, str(HERE))

from plots import busbw_vs_size, stacked_bars  # noqa: E402

from stratacl.results import Runs, load_runs  # noqa: E402

RUNS = Path(os.environ.get("STRATACL_RUNS", HERE.parent / "runs"))
FIGURES = Path(os.environ.get("STRATACL_FIGURES", HERE / "figures"))
FIGURES.mkdir(parents=True, exist_ok=True)


# %%
def collectives_runs(root: Path) -> Runs | None:
    """The collectives runs below `root`, or None when there are none."""
    if not root.exists() or not any(root.rglob("summary.json")):
        return None
    runs = load_runs(root)
    keep = runs.summary["workload"] == "collectives"
    if not keep.any():
        return None
    return Runs(summary=runs.summary[keep], results=runs.results[runs.results["workload"] == "collectives"],
                skipped=runs.skipped)


runs = collectives_runs(RUNS)
if runs is None:  # nothing to plot yet: simulate a small sweep point so the notebook always runs
    tmp = Path(tempfile.mkdtemp(prefix="stratacl-runs-"))
    subprocess.run([sys.executable, "-m", "stratacl.run", "workload=collectives",
                    "workload.max_bytes=67108864", "output.timeline=false", "output.progress=false",
                    f"hydra.run.dir={tmp / 'operators'}"], check=True, cwd=tmp, stdout=subprocess.DEVNULL)
    runs = collectives_runs(tmp)
    assert runs is not None, f"the small run in {tmp} wrote no summary.json"
print(runs)

# %% [markdown]
# ## Bus bandwidth per library
# Mean over runs at each (collective, library, size). To overlay paper numbers, pass
# `targets=` a frame with `library, collective, size_bytes, busbw_GBps` columns.

# %%
fig = busbw_vs_size(runs.results)
fig.savefig(FIGURES / "operators_busbw.png", dpi=120)

# %% [markdown]
# ## Where the time goes
# Operator time split (wire / copy / sync / launch / register) summed over all sizes, per library.

# %%
parts = [c for c in ("wire_s", "copy_s", "sync_s", "launch_s", "register_s") if c in runs.results]
fig = stacked_bars(runs.results, step="library", parts=parts, ylabel="time summed over sizes (ms)",
                   scale=1e3)
fig.savefig(FIGURES / "operators_time_split.png", dpi=120)

# %%
ratios = runs.summary.pivot_table(index="library", values=[m for m in runs.metrics if "busbw" in m])
print(ratios.T.to_string(float_format=lambda v: f"{v:,.2f}"))
