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
# # MoE dispatch / combine: harness vs paper
#
# The MoE table of REFERENCE §5: EP32, 4096 tokens per rank in high-throughput (HT) mode and
# 128 in low-latency (LL) mode, hidden 7168, top-8; bus bandwidth in DeepEP's convention (bytes of
# token copies a rank receives ÷ kernel time). Loads the `workload=moe` runs under `runs/` (or
# `$STRATACL_RUNS`) that compare DeepEP, CANN EP, CANN EP zerocopy and StrataCL; with none, runs
# `+experiment=moe_table` first (a few seconds). Figures go to `analysis/figures/`
# (or `$STRATACL_FIGURES`). Headless: `MPLBACKEND=Agg python analysis/moe.py`.

# %%
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
sys.path.insert(0, str(HERE))

import pandas as pd  # noqa: E402
import yaml  # noqa: E402
from notebook_runs import has_libraries, runs_for, save  # noqa: E402
from plots import grouped_bars  # noqa: E402

LIBRARIES = ["deepep", "cann_ep", "cann_ep_zerocopy", "stratacl"]
METRIC = {"dispatch HT": "dispatch_ht_deepep_logical_GBps", "combine HT": "combine_ht_deepep_logical_GBps",
          "dispatch LL": "dispatch_ll_deepep_logical_GBps", "combine LL": "combine_ll_deepep_logical_GBps"}
# REFERENCE §5 MoE table (StrataCL paper), DeepEP's logical bandwidth convention, GB/s: the experiment's own `reference:` block
# (display only), so the published numbers live in one place
REF = yaml.safe_load((HERE.parent / "conf" / "experiment" / "moe_table.yaml").read_text())["reference"]
PAPER = pd.DataFrame({lib: [float(REF["values"][lib][METRIC[row]]) for row in METRIC] for lib in LIBRARIES},
                     index=pd.Index(list(METRIC), name="operator"))
print("paper:", REF["source"])

runs = runs_for("moe_table", "moe", ["+experiment=moe_table"], keep=has_libraries(*LIBRARIES))

# %% [markdown]
# ## The table, side by side
# Harness values are means over the matching runs (one per seed, typically).

# %%
means = runs.summary.groupby("library")[list(METRIC.values())].mean()
harness = pd.DataFrame({lib: [means.at[lib, METRIC[row]] for row in PAPER.index] for lib in LIBRARIES},
                       index=PAPER.index)
side = pd.concat({"harness": harness, "paper": PAPER.astype(float), "harness/paper": harness / PAPER}, axis=1)
side = side.swaplevel(axis=1)[LIBRARIES]
with pd.option_context("display.width", 200):
    print(side.to_string(float_format=lambda v: f"{v:,.2f}"))

# %% [markdown]
# Speedup of each library over CANN EP, harness vs paper (the ratio is what the mechanisms predict;
# absolute numbers depend on the calibrated port rates).

# %%
speedup = pd.concat({"harness": harness.div(harness["cann_ep"], axis=0),
                     "paper": PAPER.div(PAPER["cann_ep"], axis=0)}, axis=1)
print(speedup.to_string(float_format=lambda v: f"{v:.2f}"))

# %%
fig = grouped_bars(harness, reference=PAPER, ylabel="busbw (GB/s, DeepEP convention)")
fig.axes[0].set_title("MoE dispatch / combine, EP32 — harness (solid) vs paper (hatched)")
save(fig, "moe_busbw_vs_paper")
