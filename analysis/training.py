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
# # Training: LLM iteration time over training, DLRM iteration time vs cache and batch
#
# REFERENCE §6. **LLM training** (`workload=llm_train`, DeepSeek-V3.2 with FSDP × TP × EP):
# iteration time per sampled iteration per library, as expert load balance improves over
# training. **Recsys training** (`workload=dlrm_train`): iteration time vs HBM embedding-cache size
# and per-worker batch. Loads runs under `runs/` (or `$STRATACL_RUNS`); with none, runs
# `+experiment=llm_train_iterations` on a 16-die layout (the paper's 512-die layout takes minutes:
# run it yourself and re-run this notebook) and `--multirun +experiment=dlrm_cache_batch`.
# `STRATACL_NB_TINY=1` shrinks both for the tests.

# %%
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
sys.path.insert(0, str(HERE))

import matplotlib.pyplot as plt  # noqa: E402
from notebook_runs import SMALL_TRAIN, TINY, runs_for, save  # noqa: E402
from plots import metric_vs_param  # noqa: E402

# %% [markdown]
# ## LLM training: iteration time per iteration

# %%
train_args = ["+experiment=llm_train_iterations", *SMALL_TRAIN]
if TINY:
    train_args.append("workload.iterations=[0,500,2000]")
train = runs_for("llm_train_iterations", "llm_train", train_args)
rows = train.results.sort_values("iteration")

fig, axes = plt.subplots(1, 2, figsize=(12, 4))
metric_vs_param(rows.assign(t=rows["iteration_time_s"] * 1e3), "t", "iteration", ax=axes[0])
axes[0].set_ylabel("iteration time (ms)")
axes[0].set_title("iteration time over training")
metric_vs_param(rows.assign(t=rows["exposed_comm_s"] * 1e3), "t", "iteration", ax=axes[1])
axes[1].set_ylabel("exposed communication (ms)")
imb = rows.groupby("iteration")["ep_imbalance"].mean()
twin = axes[1].twinx()
twin.plot(imb.index, imb.to_numpy(), ls=":", color="grey", label="EP imbalance (max/mean)")
twin.set_ylabel("EP load imbalance (max / mean)", color="grey")
axes[1].set_title("exposed communication and expert imbalance")
for ax in axes:
    ax.set_xlabel("training iteration")
fig.tight_layout()
save(fig, "training_llm_iterations")

# %%
wide = rows.pivot_table(index="iteration", columns="library", values="iteration_time_s") * 1e3
print("iteration time (ms)\n", wide.to_string(float_format=lambda v: f"{v:,.2f}"))

# %% [markdown]
# ## DLRM: iteration time vs embedding-cache size and batch
# The x axis is the cache each library actually got (`cache_GB_per_die`; the knob value 0 means
# "all HBM left", which is less for a library that holds communication buffers). One panel per
# per-worker batch.

# %%
CACHE, BATCH = "workload.cache_GB_per_die", "workload.batch_per_worker"
dlrm_args = ["+experiment=dlrm_cache_batch"]
if TINY:  # 4 points on 32 dies with 1 TiB of tables
    dlrm_args += [f"{CACHE}=1,16", f"{BATCH}=256,1024", "workload.ranks=32", "workload.total_table_TiB=1"]
dlrm = runs_for("dlrm_cache_batch", "dlrm_train", dlrm_args, multirun=True)
s = dlrm.summary
batches = sorted(s[BATCH].unique())
fig, axes = plt.subplots(1, len(batches), figsize=(4.6 * len(batches), 3.9), squeeze=False)
for ax, batch in zip(axes[0], batches, strict=True):
    sub = s[s[BATCH] == batch]
    for lib, g in sub.groupby("library", sort=False):
        g = g.sort_values("cache_GB_per_die")
        ax.plot(g["cache_GB_per_die"], g["iteration_time_s"] * 1e3, marker="o", label=lib)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("embedding cache per die (GB)")
    ax.set_ylabel("iteration time (ms)")
    ax.set_title(f"batch {batch} per worker")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
fig.tight_layout()
save(fig, "training_dlrm_cache_batch")

# %%
cols = ["iteration_time_s", "cache_hit_rate", "exposed_comm_s"]
print(s.pivot_table(index=[BATCH, CACHE], columns="library", values=cols)
      .to_string(float_format=lambda v: f"{v:,.4g}"))
