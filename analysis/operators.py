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
# `stratacl.report.results.load_runs` and draws busbw vs per-rank message size, one panel per
# collective, one line per library (nccl-tests convention, REFERENCE §5). With no such run,
# it first runs a small one (64 KiB – 64 MiB, 32 ranks) into a temporary directory.
# Figures go to `analysis/figures/` (or `$STRATACL_FIGURES`).
#
# Run headless: `MPLBACKEND=Agg python analysis/operators.py`; open as a notebook through
# jupytext (`analysis/operators.ipynb` is the paired copy).

# %%
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
sys.path.insert(0, str(HERE))

from notebook_runs import runs_for, save  # noqa: E402
from plots import busbw_vs_size, stacked_bars  # noqa: E402

# %% [markdown]
# ## Which runs
# Every `workload=collectives` run under the runs root (or `--runs DIR`, `--experiment NAME`,
# `--where key=value`; `--run` runs the small configuration below first). Runs that differ in a
# config key no sweep varied (e.g. a 32-rank and a 64-rank sweep) are not pooled: each
# configuration is its own curve, labelled with the keys that tell them apart.

# %%
runs = runs_for("operators", "collectives", ["workload=collectives", "workload.max_bytes=67108864"],
                vary=["workload.min_bytes", "workload.max_bytes"], mixed="label")  # sizes: the x axis
results = runs.results.assign(series=runs.results["library"] + runs.results["config"].map(
    lambda c: f" [{c}]" if c else ""))
if runs.mixed:
    print(f"MIXED configurations, drawn apart: {runs.mixed}")

# %% [markdown]
# ## Bus bandwidth per library
# Mean over the runs of one configuration (seeds) at each (collective, library, size). To overlay
# paper numbers, pass `targets=` a frame with `library, collective, size_bytes, busbw_GBps` columns.

# %%
fig = busbw_vs_size(results, hue="series")
fig.suptitle(f"busbw vs message size — {results['n_ranks'].iloc[0] if results['n_ranks'].nunique() == 1 else 'several'}"
             " ranks; y axis from 0", fontsize="medium")
fig.tight_layout()
save(fig, "operators_busbw")

# %% [markdown]
# ## Where the time goes
# Operator time split (wire / copy / sync / launch / register) summed over the sizes of one run,
# per library and configuration (mean over that configuration's runs: seeds are not summed).

# %%
parts = [c for c in ("wire_s", "copy_s", "sync_s", "launch_s", "register_s") if c in results]
per_run = results.groupby(["series", "run"], sort=False)[parts].sum().groupby("series", sort=False).mean()
fig = stacked_bars(per_run.reset_index(), step="series", parts=parts,
                   ylabel="time summed over one run's sizes (ms)", scale=1e3)
save(fig, "operators_time_split")

# %% [markdown]
# Mean busbw over the sizes measured, each size counted once (runs of one configuration that
# cover different size ranges are not averaged run by run).

# %%
per_size = results.groupby(["config", "library", "collective", "size_bytes"], sort=False)["busbw_GBps"].mean()
table = per_size.groupby(["config", "library", "collective"], sort=False).mean().unstack(["config", "library"])
print("mean busbw over sizes (GB/s)\n" + table.to_string(float_format=lambda v: f"{v:,.2f}"))
