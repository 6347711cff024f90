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
# # Ablation ladder: what each StrataCL mechanism buys
#
# REFERENCE §6: hccl → + JIT user-buffer registration (`hccl_jit`) → + registration-on-allocation
# and one-step full-mesh (`stratacl_no_partition`) → + balanced core partitioning
# (`stratacl_no_sdma`) → + SDMA offload (`stratacl`). Two levels:
# - **serving** (`+experiment=ablation_inference`): decode-step and prefill-iteration time split
#   into compute and exposed communication (iterations.parquet), and P99 TTFT / TPOT / throughput;
# - **operators** (`+experiment=ablation_operators`): operator time split per library.
#
# Loads matching runs under `runs/` (or `$STRATACL_RUNS`); with none, simulates them first
# (serving over a 20 s window; `STRATACL_NB_TINY=1`: tiny model, for the tests).

# %%
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
sys.path.insert(0, str(HERE))

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from notebook_runs import SMALL_INFER, TINY, TINY_INFER, extra_table, has_libraries, runs_for, save  # noqa: E402
from plots import grouped_bars, human_bytes, stacked_bars  # noqa: E402

LADDER = ["hccl", "hccl_jit", "stratacl_no_partition", "stratacl_no_sdma", "stratacl"]

# %% [markdown]
# ## Serving: where a step's time goes
# Mean over the run's iterations of each phase: `compute_s` (some kernel computes) and
# `exposed_comm_s` (communication nothing overlaps), which add up to the step time.

# %%
infer = runs_for("ablation_inference", "llm_infer",
                 ["+experiment=ablation_inference", *(TINY_INFER if TINY else SMALL_INFER)],
                 keep=has_libraries(*LADDER))
its = extra_table(infer, "iterations")
fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
for ax, phase in zip(axes, ("decode", "prefill"), strict=True):
    mean = its[its["phase"] == phase].groupby("library")[["compute_s", "exposed_comm_s"]].mean().reset_index()
    stacked_bars(mean, "library", ["compute_s", "exposed_comm_s"], order=LADDER, ax=ax,
                 ylabel=f"{phase} iteration (ms)", scale=1e3)
    ax.set_title(f"{phase}: compute vs exposed communication")
fig.tight_layout()
save(fig, "ablation_inference_step_split")

# %% [markdown]
# ## Serving: latency and throughput relative to hccl

# %%
metrics = {"P99 TTFT": "ttft_p99_s", "P99 TPOT": "tpot_p99_s", "throughput": "throughput_tok_per_s",
           "decode step": "decode_step_s_mean"}
ratios = infer.summary.groupby("library")[[f"{m}_ratio" for m in metrics.values()]].mean()
rel = pd.DataFrame({lib: [ratios.at[lib, f"{m}_ratio"] for m in metrics.values()] for lib in LADDER},
                   index=list(metrics))
fig = grouped_bars(rel, ylabel="relative to hccl")
fig.axes[0].axhline(1.0, color="k", lw=0.8)
fig.axes[0].set_title("serving metrics along the ladder (lower is better except throughput)")
save(fig, "ablation_inference_metrics")
print(rel.to_string(float_format=lambda v: f"{v:.3f}"))

# %% [markdown]
# ## Operators: time split along the ladder
# Per-operator time (µs) split into wire / copy / sync / launch / register, averaged over the
# collectives, at a small and a large message size.

# %%
op_args = ["+experiment=ablation_operators"] + (["workload.max_bytes=16777216"] if TINY else [])
ops = runs_for("ablation_operators", "collectives", op_args, keep=has_libraries(*LADDER)).results
sizes = sorted(ops["size_bytes"].unique())
picked = [s for s in (1 << 20, 64 << 20) if s in sizes] or [sizes[0], sizes[-1]]
parts = ["wire_s", "copy_s", "sync_s", "launch_s", "register_s"]
fig, axes = plt.subplots(1, len(picked), figsize=(6.5 * len(picked), 4.2), squeeze=False)
for ax, size in zip(axes[0], picked, strict=True):
    mean = ops[ops["size_bytes"] == size].groupby("library")[parts].mean().reset_index()
    stacked_bars(mean, "library", parts, order=LADDER, ax=ax, ylabel="operator time (µs)", scale=1e6)
    ax.set_title(f"{human_bytes(size)} per rank, mean over collectives")
fig.tight_layout()
save(fig, "ablation_operators_split")

# %%
busbw = ops.pivot_table(index="size_bytes", columns="library", values="busbw_GBps")[LADDER]
print((busbw.div(busbw["hccl"], axis=0)).rename(index=human_bytes).to_string(float_format=lambda v: f"{v:.2f}"))
