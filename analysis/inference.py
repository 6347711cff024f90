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
# the bundled public traces. Reads the runs of `+experiment=inference_rates` under `runs/` (or
# `$STRATACL_RUNS`; `--runs DIR` reads a sweep directory, `--run` runs the sweep below first) —
# only those: a quickstart run or a fixed-shape `cloudmatrix_infer` run is never pooled in, and
# runs that differ in a config key the sweep did not vary are refused with the keys named. With
# none, it first runs a small sweep on the default trace, three seeds per rate, with the
# closed-loop saturation measured:
#
#     python -m stratacl.run --multirun +experiment=inference_rates \
#         workload.requests.trace=mooncake_conv workload.requests.rate=2,5,10,15,30 seed=0,1,2 \
#         workload.requests.duration_s=20 workload.capacity.saturation=true
#
# (`STRATACL_NB_TINY=1`: a tiny model on 4-die instances, for the tests). Draws throughput, P99
# TTFT and P99 TPOT vs rate per library, the mean over seeds with a min–max band (a P99 over a
# short window moves between seeds), marks each library's closed-loop saturation rate (the run's
# `saturation_requests_per_s`, not a short-window open-loop artefact), the decode batch per die,
# the prefill dies' busy share and the load as a fraction of capacity per rate and trace, and the
# TTFT CDF per library.

# %%
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
sys.path.insert(0, str(HERE))

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from notebook_runs import SMALL_INFER, TINY, TINY_INFER, runs_for, save  # noqa: E402
from plots import cdf, metric_vs_param  # noqa: E402

from stratacl.metrics import LATENCY_DEFINITION, measured_requests  # noqa: E402

RATE = "workload.requests.rate"
TRACE = "workload.requests.trace"
RATES = "2,8" if TINY else "2,5,10,15,30"
SEEDS = "0,1" if TINY else "0,1,2"
SATURATION = ["workload.capacity.saturation=true"] + (
    ["workload.capacity.saturation_duration_s=6", "workload.capacity.saturation_warmup_s=2"] if TINY else [])
runs = runs_for("llm_infer_rates", "llm_infer",
                ["+experiment=inference_rates", f"{RATE}={RATES}", f"{TRACE}=mooncake_conv", f"seed={SEEDS}",
                 *[a for a in (TINY_INFER if TINY else SMALL_INFER) if "capacity.saturation" not in a], *SATURATION],
                multirun=True, vary=[RATE, TRACE])
runs.summary[RATE] = runs.summary[RATE].astype(float)
runs.results[RATE] = runs.results[RATE].astype(float)
if TRACE not in runs.summary:
    runs.summary[TRACE] = "default"
window = runs.summary["workload.requests.duration_s"] - runs.summary["workload.warmup_s"]
print(f"measurement window {window.min():g}–{window.max():g} s per run; "
      f"{runs.summary['seed'].nunique()} seed(s) per point")
print(f"latency percentiles: {LATENCY_DEFINITION}")

# %% [markdown]
# ## Throughput and tail latency vs request rate
# Throughput counts output tokens produced in the measured window (after the warm-up). The latency
# percentiles are each run's stored metrics (`ttft_p99_s`, ...: the CLI's and summary.json's, one
# definition, `stratacl.metrics.LATENCY_DEFINITION`, printed below): over the requests arriving in
# the measured window. Lines are means over seeds, bands their min–max; y axes start at 0.
# The dotted vertical line is each library's closed-loop saturation (requests/s a full deployment
# completes), measured by the run itself when `workload.capacity.saturation` is on.

# %%
panels = [("throughput_tok_per_s", "output tokens/s", 1.0), ("ttft_p99_s", "P99 TTFT (ms)", 1e3),
          ("tpot_p99_s", "P99 TPOT (ms)", 1e3)]
fig, axes = plt.subplots(1, len(panels), figsize=(15, 4.2))
for ax, (metric, label, scale) in zip(axes, panels, strict=True):
    frame = runs.summary.assign(**{metric: runs.summary[metric] * scale})
    metric_vs_param(frame, metric, RATE, ax=ax, band=True, zero=True)
    ax.set_ylabel(label)
    ax.set_xlabel("offered request rate (req/s)")
    ax.set_title(label.split(" (")[0] + f" vs request rate ({window.max():g} s window)")
saturated = {}
if "saturation_requests_per_s" in runs.summary:
    sat = runs.summary.groupby(["library", TRACE])["saturation_requests_per_s"].agg(["mean", "min", "max"])
    colors = {ln.get_label().split(" (")[0]: ln.get_color() for ln in axes[0].get_lines()}
    top = runs.summary[RATE].max()
    for k, ((lib, trace), row) in enumerate(sat.iterrows()):
        saturated[(lib, trace)] = row["mean"]
        for ax in axes:
            if row["mean"] <= 1.2 * top:
                ax.axvline(row["mean"], ls=":", lw=1.2, color=colors.get(lib, "grey"))
            else:  # beyond the swept rates: say so at the right edge instead of stretching the axis
                ax.annotate(f"{lib} saturates at {row['mean']:.0f} req/s →", xy=(0.98, 0.04 + 0.07 * k),
                            xycoords="axes fraction", ha="right", fontsize="small", color=colors.get(lib, "grey"))
        print(f"{lib}: closed-loop saturation {row['mean']:.1f} req/s on {trace} "
              f"(min–max over runs {row['min']:.1f}–{row['max']:.1f})")
else:
    print("closed-loop saturation not measured in these runs (workload.capacity.saturation=false): "
          "no saturation is marked; re-run with workload.capacity.saturation=true")
fig.tight_layout()
save(fig, "inference_vs_rate")

# %%
table = runs.summary.pivot_table(index=[TRACE, RATE], columns="library",
                                 values=["throughput_tok_per_s", "ttft_p99_s", "tpot_p99_s"], aggfunc="mean")
print("means over seeds\n" + table.to_string(float_format=lambda v: f"{v:,.4g}"))
spread = runs.summary.groupby([TRACE, RATE, "library"])[["ttft_p99_s", "tpot_p99_s"]].agg(lambda v: v.max() - v.min())
print("P99 spread over seeds (max − min, s)\n" + spread.unstack("library").to_string(float_format=lambda v: f"{v:,.3g}"))

# %% [markdown]
# ## Operating regime per rate and trace
# Decode sequences per die (time-weighted mean over decode steps), the share of time a prefill die
# computes its own tokens, and the served rate as a fraction of the layout's analytic capacity:
# which side of the deployment the load reaches.

# %%
regime = runs.summary.pivot_table(index=[TRACE, RATE], columns="library",
                                  values=["mean_decode_batch_per_die", "prefill_die_busy_fraction", "load_fraction", "kv_utilisation_mean"])
print(regime.to_string(float_format=lambda v: f"{v:,.3g}"))

# %% [markdown]
# ## TTFT distribution per library
# One panel per request rate: the per-request `ttft_s` rows of results.parquet that the percentiles
# count (`measured_requests`: arriving in each run's measured window), all seeds pooled.

# %%
measured = pd.concat([measured_requests(g, g["workload.warmup_s"].iloc[0], g["workload.requests.duration_s"].iloc[0])
                      for _, g in runs.results.groupby(["run", "library"])])
rates = sorted(measured[RATE].dropna().unique())
fig, axes = plt.subplots(1, len(rates), figsize=(4.6 * len(rates), 3.8), squeeze=False, sharey=True)
for ax, rate in zip(axes[0], rates, strict=True):
    cdf(measured[measured[RATE] == rate], "ttft_s", ax=ax, scale=1e3, xlabel="TTFT (ms, log scale)", logx=True)
    ax.set_title(f"{rate:g} req/s (after warm-up)")
fig.tight_layout()
save(fig, "inference_ttft_cdf")

# %%
# the runs' stored percentiles (what the CLI printed), mean over seeds
cols = ["ttft_p50_s", "ttft_p90_s", "ttft_p99_s"]
q = runs.summary.groupby([RATE, "library"])[cols].mean().rename(columns=lambda c: c.replace("_s", "_ms")) * 1e3
print(f"TTFT quantiles (ms, mean over seeds; {LATENCY_DEFINITION})\n" + q.to_string(float_format=lambda v: f"{v:,.3f}"))
