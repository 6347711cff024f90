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
# # Regime map: where the communication library matters in serving
#
# Reads deployment-search runs (`+experiment=deployment_search`, one per trace) under `runs/` (or
# `$STRATACL_RUNS`; `--runs DIR` reads others, `--run` runs the sweep below first) and draws, in one
# figure, the library ratio (each library ÷ the baseline) over
# - trace × SLO scale: goodput at each library's best layout (`slo_scale.parquet`), and beside it
#   the goodput at the configured layout (today's fixed-layout comparison);
# - trace × offered rate: P99 TTFT and P99 TPOT of the configured (fixed) layout at the same rate
#   (`checks.parquet`, rows `role == fixed`; each library's served rates interpolated in log-rate,
#   columns the rate as a fraction of the baseline's goodput on that layout, blank where a library
#   was not served on both sides of it).
# A ratio above 1 on goodput, below 1 on latency, favours the library. Then the SLO-scale curves:
# goodput per die at each library's best layout as both SLOs are scaled. The runs:
#
#     python -m stratacl.run --multirun +experiment=deployment_search \
#         workload.requests.trace=mooncake_conv,azure_conv,azure_code
#     python -m stratacl.run +experiment=deployment_search workload.requests.arrival=poisson \
#         workload.requests.input_mean=1024 workload.requests.output_mean=1024
#
# With none, it runs a tiny search first (`STRATACL_NB_TINY=1`: a tiny model on 4-die instances).

# %%
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
sys.path.insert(0, str(HERE))

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

pd.set_option("display.width", 200)
pd.set_option("display.max_columns", 20)
from notebook_runs import TINY, TINY_INFER, extra_table, runs_for, save  # noqa: E402

REQ = "workload.requests."
VARY = [f"{REQ}{k}" for k in ("trace", "arrival", "input_mean", "output_mean", "rate", "duration_s")]
TINY_SEARCH = [a for a in TINY_INFER if "layout." not in a and "duration_s" not in a and "warmup_s" not in a] + [
    "workload.search.die_budget=12", "workload.search.prefill_dp=[4]", "workload.search.decode_dp=[4]",
    "workload.search.tbo=[true]", "workload.search.stream_layout=[none]", "workload.search.mtp=[true]",
    "workload.search.decode_max_batch=[1]", "workload.scheduler.decode_max_batch=1",  # a slow tiny deployment "workload.search.prefill_token_budget=[2048]",
    "workload.search.slo_scales=[1.0,2.0]", "workload.search.finalists=1", "workload.search.rate_tolerance=0.25",
    "workload.search.max_extend=2", "workload.search.fixed_loads=[1.0]",  # one common rate keeps the test short
    "workload.layout.prefill_instances=1", "workload.layout.prefill_dp=4", "workload.layout.prefill_ep=4",
    "workload.layout.decode_instances=1", "workload.layout.decode_dp=4", "workload.layout.decode_ep=4",
    # two synthetic "traces" (the tiny model outruns a bundled trace's requests): prompt-heavy, decode-heavy
    # with fixed lengths (a serving check prices a prefill trace per distinct token count)
    f"{REQ}arrival=poisson", f"{REQ}input_dist=fixed", f"{REQ}output_dist=fixed", f"{REQ}input_mean=2048",
    f"{REQ}output_mean=64,256", f"{REQ}duration_s=2", "workload.warmup_s=0.4",
]
runs = runs_for("regimes", "llm_infer", ["+experiment=deployment_search", *(TINY_SEARCH if TINY else
                [f"{REQ}trace=mooncake_conv,azure_conv,azure_code"])],
                keep=lambda rows: (Path(rows["run_dir"].iloc[0]) / "slo_scale.parquet").is_file(),
                multirun=True, vary=VARY, mixed="label")


def trace_label(row: pd.Series) -> str:
    if row.get(f"{REQ}arrival", "trace") == "trace":
        return str(row[f"{REQ}trace"])
    return f"{row[f'{REQ}arrival']} in {row[f'{REQ}input_mean']} / out {row[f'{REQ}output_mean']}"


first = runs.summary.groupby("run", sort=False).first()
scale = extra_table(runs, "slo_scale")
# each row names its die budget: traces too small for a rate near 192 dies' capacity are searched on fewer
dies = scale.groupby("run")["die_budget"].first() if len(scale) else pd.Series(dtype=float)
label = {run: trace_label(row) + (f" · {int(dies[run])} dies" if run in dies else "") for run, row in first.iterrows()}
base = {run: row["baseline"] for run, row in first.iterrows()}
checks = extra_table(runs, "checks")
print("runs:", sorted(set(label.values())))

# %% goodput ratio over trace × SLO scale (each library at its own best layout)
def resolved(piv: pd.DataFrame, upper: pd.DataFrame | None, lib: str, b: str, k: float) -> bool:
    """Whether the two goodputs' brackets [goodput, lowest served rate missing) are disjoint."""
    if upper is None:
        return True

    def top(x: str) -> float:
        return float(upper.loc[k, x]) if np.isfinite(upper.loc[k, x]) else np.inf
    return bool(piv.loc[k, lib] >= top(b) or piv.loc[k, b] >= top(lib))


def cell(v: float, ok: bool, fmt: str, short: bool = False) -> str:
    """A ratio's text: – none served, ∞ the baseline meets none, ≈ inside the brackets."""
    if np.isnan(v):
        return "–"
    if np.isinf(v):
        return "∞" if short else "∞ (base 0)"
    return ("" if ok else "≈") + fmt.format(v)


rows = []
for run, sc in scale.groupby("run"):
    # a run without serving checks (search.serve_check=false) has the analytic capacities only: its
    # row says so
    served = "goodput_req_per_s" in sc and sc["goodput_req_per_s"].notna().any()
    piv = sc.pivot_table(index="slo_scale", columns="library",
                         values="goodput_req_per_s" if served else "analytic_capacity_req_per_s")
    # the bisection brackets each goodput in [goodput, the lowest served rate missing the SLO): a ratio
    # whose two brackets overlap is not resolved by the runs (marked ≈; rate_tolerance narrows them)
    upper = (sc.pivot_table(index="slo_scale", columns="library", values="goodput_upper_req_per_s", dropna=False)
             if served and "goodput_upper_req_per_s" in sc else None)

    b = base[run]
    rows += [{"trace": label[run] + ("" if served else " (analytic)"), "library": lib, "slo_scale": k,
              # the baseline meets no served rate where the library does: ∞ (drawn at the scale's top)
              "ratio": v / piv.loc[k, b] if piv.loc[k, b] > 0 else (np.inf if v > 0 else np.nan),
              "resolved": resolved(piv, upper, lib, b, k)}
             for lib in piv.columns if lib != b for k, v in piv[lib].items()]
good = pd.DataFrame(rows, columns=["trace", "library", "slo_scale", "ratio", "resolved"])
print("goodput at best layout, library ÷ baseline (≈: inside the bisection's brackets):")
print(good.assign(cell=[cell(v, ok, "{:.3f}") for v, ok in zip(good["ratio"], good["resolved"], strict=True)])
      .pivot_table(index="trace", columns="slo_scale", values="cell", aggfunc="first") if len(good) else "none")

# %% P99 TTFT / TPOT ratio of the configured layout over trace × offered rate
# offered rate ÷ the baseline's goodput on the layout (its measured capacity under the SLO): the
# bisection serves rates around each library's goodput, so these are inside what both were served at
LOADS = (0.8, 0.9, 1.0, 1.1)
fixed_goodput = runs.summary.set_index(["run", "library"]).get("fixed_layout_goodput_req_per_s")


def at_rate(g: pd.DataFrame, col: str, r: float) -> float:
    """The library's P99 at rate r, interpolated in log-rate between its served rates (NaN outside)."""
    g = g.dropna(subset=[col]).sort_values("rate_req_per_s")
    x = np.log(g["rate_req_per_s"].to_numpy())
    lr = np.log(r)  # served rates are rounded to 1e-3 req/s: a common rate sits within that of its load
    if not len(x) or not x[0] - 1e-4 <= lr <= x[-1] + 1e-4:
        return np.nan
    return float(np.interp(np.clip(lr, x[0], x[-1]), x, g[col].to_numpy()))


lat = []
fixed = checks[checks["role"] == "fixed"] if len(checks) else checks
for run, fx in fixed.groupby("run"):
    b = base[run]
    cap = fixed_goodput.get((run, b), np.nan) if fixed_goodput is not None else np.nan
    if not cap > 0:
        continue
    for metric in ("ttft_p99_s", "tpot_p99_s"):
        for load in LOADS:
            r = load * cap
            at = {lib: at_rate(g, metric, r) for lib, g in fx.groupby("library")}
            lat += [{"trace": label[run], "library": lib, "metric": metric, "load": load, "ratio": v / at[b]}
                    for lib, v in at.items() if lib != b and at[b] > 0]
lat = pd.DataFrame(lat, columns=["trace", "library", "metric", "load", "ratio"])
print("P99 ratios of the configured layout, library ÷ baseline, by offered load:")
print(lat.pivot_table(index=["metric", "trace"], columns="load", values="ratio").round(3) if len(lat) else "none")

# %% goodput at the configured layout (today's fixed-layout comparison), beside the best-to-best
def fixed_top(run: str, lib: str, g: float) -> float:
    """The configured layout's bracket top: its lowest served rate above the goodput (the first miss)."""
    rows = fixed[(fixed["run"] == run) & (fixed["library"] == lib)] if len(fixed) else fixed
    above = rows.loc[rows["rate_req_per_s"] > g, "rate_req_per_s"] if len(rows) else []
    return float(min(above)) if len(above) else np.inf


fixed_rows = []
for (run, lib), v in (fixed_goodput.dropna().items() if fixed_goodput is not None else []):
    b = base[run]
    gb = fixed_goodput.get((run, b), 0)
    if lib != b and gb > 0:
        ok = v >= fixed_top(run, b, gb) or gb >= fixed_top(run, lib, v)
        fixed_rows.append({"trace": label[run], "library": lib, "layout": "configured", "ratio": v / gb, "resolved": ok})
fixed_ratio = pd.DataFrame(fixed_rows, columns=["trace", "library", "layout", "ratio", "resolved"])
print("goodput at the configured layout, library ÷ baseline (≈: inside the brackets):")
print(fixed_ratio.assign(cell=[cell(v, ok, "{:.3f}") for v, ok in zip(fixed_ratio["ratio"], fixed_ratio["resolved"], strict=True)])
      .set_index("trace")["cell"].to_string() if len(fixed_ratio) else "none")

# %% the regime map: one figure
n_scales = max(1, good["slo_scale"].nunique())  # the goodput panel widens with its SLO scales
fig, axes = plt.subplots(1, 4, figsize=(16 + 0.9 * n_scales, 0.8 * max(3, len(set(label.values()))) + 2.5),
                         gridspec_kw={"width_ratios": [max(4, 0.9 * n_scales), 1.2, 3, 3]})


def _one(values: pd.Series) -> float:
    if len(values) > 1:
        raise ValueError(f"{len(values)} runs give one cell of the regime map: select one run per trace and library")
    return float(values.iloc[0]) if len(values) else np.nan


def heat(ax, df: pd.DataFrame, col: str, title: str, fmt: str, lower_better: bool) -> None:  # noqa: ANN001
    if df.empty:
        ax.set_axis_off()
        return
    # one row per (trace, library): several non-baseline libraries get rows of their own, never a
    # mean; two runs of one trace and library in the selection are refused (select them apart)
    rows = df["trace"] + (" · " + df["library"] if df["library"].nunique() > 1 else "")
    p = df.assign(row=rows).pivot_table(index="row", columns=col, values="ratio", dropna=False,
                                        aggfunc=_one)
    ok = (df.assign(row=rows).pivot_table(index="row", columns=col, values="resolved", dropna=False,
                                          aggfunc="all").reindex_like(p).fillna(True)
          if "resolved" in df else p.notna() | p.isna())
    im = ax.imshow(np.clip(p.to_numpy(dtype=float), 0.7, 1.3), cmap="RdBu_r" if lower_better else "RdBu", vmin=0.7, vmax=1.3,
                   aspect="auto")
    ax.set_xticks(range(len(p.columns)), [fmt.format(c) for c in p.columns], rotation=45, ha="right")
    ax.set_yticks(range(len(p.index)), p.index)
    for (i, j), v in np.ndenumerate(p.to_numpy(dtype=float)):
        ax.text(j, i, cell(v, bool(ok.iloc[i, j]), "{:.2f}", short=True), ha="center", va="center", fontsize=8)
    ax.set_title(title)
    ax.set_xlabel("offered rate ÷ baseline's goodput" if col == "load" else col.replace("_", " "))
    fig.colorbar(im, ax=ax, shrink=0.8)


libs = sorted(set(good["library"]) | set(lat["library"])) or ["library"]
lib = libs[0] if len(libs) == 1 else "library"  # several: each row names its library
heat(axes[0], good, "slo_scale", f"goodput at each one's best layout\n{lib} ÷ baseline (>1: {lib} better; ≈ unresolved)",
     "SLO ×{:g}", False)
heat(axes[1], fixed_ratio, "layout", "goodput at the\nconfigured layout", "{}", False)
heat(axes[2], lat[lat["metric"] == "ttft_p99_s"], "load", "P99 TTFT, configured layout\n(<1: better)",
     "{:.1f}×", True)
heat(axes[3], lat[lat["metric"] == "tpot_p99_s"], "load", "P99 TPOT, configured layout\n(<1: better)",
     "{:.1f}×", True)
fig.suptitle("Regime map: the library ratio over trace, SLO scale and offered rate")
fig.tight_layout()
save(fig, "regime_map")

# %% [markdown]
# ## SLO-scale curves: goodput per die at each library's best layout as both SLOs scale

# %%
groups = list(scale.groupby("run")) if len(scale) else []
fig2, axs = plt.subplots(1, max(1, len(groups)), figsize=(4.5 * max(1, len(groups)), 3.6), squeeze=False)
for ax, (run, sc) in zip(axs[0], groups, strict=False):
    served = "goodput_req_per_s_per_die" in sc and sc["goodput_req_per_s_per_die"].notna().any()
    for name, g in sc.groupby("library"):
        g = g.sort_values("slo_scale")
        y = g["goodput_req_per_s_per_die"] if served else g["analytic_capacity_req_per_s"] / g["die_budget"]
        ax.plot(g["slo_scale"], y, marker="o", label=name if served else f"{name} (analytic)")
        if not served:
            continue
        capped = g[g["capped"].astype(bool)]
        ax.scatter(capped["slo_scale"], capped["goodput_req_per_s_per_die"], marker="^", s=80, facecolors="none",
                   edgecolors="k", label="capped" if name == base[run] and len(capped) else None)
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("SLO scale (TTFT and TPOT × k)")
    ax.set_ylabel("goodput (req/s per die)")
    ax.set_title(label[run])
    ax.legend(fontsize=8)
fig2.tight_layout()
save(fig2, "regime_slo_scale")
