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
# # LLM serving: throughput and tail latency vs request rate
#
# REFERENCE §6 "LLM inference": DeepSeek-V4-Flash served with prefill/decode disaggregation on
# 192 dies (prefill DP32+EP32, decode EP16+DP16, TBO, MTP), from light load to beyond capacity, on
# the bundled public traces. Loads the `workload=llm_infer` runs under `runs/` (or
# `$STRATACL_RUNS`) that sweep `workload.requests.rate` (`+experiment=inference_rates` sweeps three
# traces × twelve rates); with none, first runs a small sweep on the default trace
#
#     python -m stratacl.run --multirun +experiment=inference_rates \
#         workload.requests.trace=mooncake_conv workload.requests.rate=2,5,10,15,30 workload.requests.duration_s=20
#
# (`STRATACL_NB_TINY=1`: a tiny model on 4-die instances, for the tests). Draws throughput, P99
# TTFT and P99 TPOT vs rate per library — marking where each library saturates (the first rate at
# which it completes under 90 % of the offered requests) — the decode batch per die and the
# prefill busy fraction per rate and trace, and the TTFT CDF per library.

# %%
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
sys.path.insert(0, str(HERE))

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from notebook_runs import SMALL_INFER, TINY, TINY_INFER, runs_for, save  # noqa: E402
from plots import cdf, metric_vs_param  # noqa: E402

RATE = "workload.requests.rate"
TRACE = "workload.requests.trace"
RATES = "2,8" if TINY else "2,5,10,15,30"
runs = runs_for("llm_infer_rates", "llm_infer",
                ["+experiment=inference_rates", f"{RATE}={RATES}", f"{TRACE}=mooncake_conv",
                 *(TINY_INFER if TINY else SMALL_INFER)],
                multirun=True)
runs.summary[RATE] = runs.summary[RATE].astype(float)
runs.results[RATE] = runs.results[RATE].astype(float)
if TRACE not in runs.summary:
    runs.summary[TRACE] = "default"


def saturation_rate(rows: pd.DataFrame) -> float:
    """The first rate at which the library completes under 90 % of the offered requests."""
    over = rows[rows["requests_per_s"] < 0.9 * rows[RATE]].sort_values(RATE)
    return float(over[RATE].iloc[0]) if len(over) else float("nan")

# %% [markdown]
# ## Throughput and tail latency vs request rate
# Throughput counts output tokens produced in the measured window (after the warm-up); P99 over the
# requests arriving in it. Points at one rate from several runs (seeds) are averaged.

# %%
panels = [("throughput_tok_per_s", "output tokens/s", 1.0), ("ttft_p99_s", "P99 TTFT (ms)", 1e3),
          ("tpot_p99_s", "P99 TPOT (ms)", 1e3)]
fig, axes = plt.subplots(1, len(panels), figsize=(15, 4))
for ax, (metric, label, scale) in zip(axes, panels, strict=True):
    frame = runs.summary.assign(**{metric: runs.summary[metric] * scale})
    metric_vs_param(frame, metric, RATE, ax=ax)
    ax.set_ylabel(label)
    ax.set_xlabel("request rate (req/s)")
    ax.set_title(label.split(" (")[0] + " vs request rate")
for (lib, trace), rows in runs.summary.groupby(["library", TRACE]):
    sat = saturation_rate(rows)
    if sat == sat:
        for ax in axes:
            ax.axvline(sat, ls=":", lw=1, color="grey")
        print(f"{lib} saturates at {sat:g} req/s on {trace}")
fig.tight_layout()
save(fig, "inference_vs_rate")

# %%
table = runs.summary.pivot_table(index=[TRACE, RATE], columns="library",
                                 values=["throughput_tok_per_s", "ttft_p99_s", "tpot_p99_s"])
print(table.to_string(float_format=lambda v: f"{v:,.4g}"))

# %% [markdown]
# ## Operating regime per rate and trace
# Decode sequences per die (time-weighted mean over decode steps) and the share of time a prefill
# instance is in an iteration: which side of the deployment the load reaches.

# %%
regime = runs.summary.pivot_table(index=[TRACE, RATE], columns="library",
                                  values=["mean_decode_batch_per_die", "prefill_busy_fraction", "kv_utilisation_mean"])
print(regime.to_string(float_format=lambda v: f"{v:,.3g}"))

# %% [markdown]
# ## TTFT distribution per library
# One panel per request rate (per-request `ttft_s` rows of results.parquet, all requests).

# %%
rates = sorted(runs.results[RATE].dropna().unique())
fig, axes = plt.subplots(1, len(rates), figsize=(4.6 * len(rates), 3.8), squeeze=False, sharey=True)
for ax, rate in zip(axes[0], rates, strict=True):
    cdf(runs.results[runs.results[RATE] == rate], "ttft_s", ax=ax, scale=1e3, xlabel="TTFT (ms)", logx=True)
    ax.set_title(f"{rate:g} req/s")
fig.tight_layout()
save(fig, "inference_ttft_cdf")

# %%
q = runs.results.groupby([RATE, "library"])["ttft_s"].quantile([0.5, 0.9, 0.99]).unstack() * 1e3
print("TTFT quantiles (ms)\n", pd.DataFrame(q).to_string(float_format=lambda v: f"{v:,.3f}"))
