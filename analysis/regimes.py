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
# Reads deployment-search runs (`+experiment=deployment_search`, one per trace) and draws the
# library ratio (each library against the baseline) over
# - trace × SLO scale: goodput at each library's best layout (`slo_scale.parquet`);
# - trace × rate: P99 TTFT and P99 TPOT of the configured (fixed) layout at the same offered rate
#   (`checks.parquet`, rows `role == fixed`; each library's rates interpolated onto a common grid).
#
#     python analysis/regimes.py --runs /tmp/s24/runs      # a directory holding search runs
#
# A ratio above 1 on goodput, below 1 on latency, favours the library.

# %%
import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
sys.path.insert(0, str(HERE))

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import yaml  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--runs", default="runs", help="directory searched for deployment-search runs")
ap.add_argument("--out", default=str(HERE / "figures" / "regime_map.png"))
args, _ = ap.parse_known_args()


def trace_label(w: dict) -> str:
    r = w["requests"]
    if r["arrival"] == "trace":
        return r["trace"]
    return f"{r['arrival']} in {r['input_mean']} / out {r['output_mean']}"


runs = []
for s in sorted(Path(args.runs).rglob("summary.json")):
    summ = json.loads(s.read_text())
    hy = s.parent / ".hydra" / "config.yaml"
    w = yaml.safe_load(hy.read_text()).get("workload", {}) if hy.exists() else {}
    if w.get("mode") != "search" or not (s.parent / "slo_scale.parquet").exists():
        continue
    runs.append((trace_label(w), summ["baseline"], s.parent))
print(f"{len(runs)} search runs:", [r[0] for r in runs])

# %% goodput ratio over trace × SLO scale
rows, lat = [], []
for trace, base, d in runs:
    sc = pd.read_parquet(d / "slo_scale.parquet")
    if "goodput_req_per_s" not in sc:
        continue
    piv = sc.pivot_table(index="slo_scale", columns="library", values="goodput_req_per_s")
    for lib in piv.columns:
        if lib != base:
            rows += [{"trace": trace, "library": lib, "slo_scale": k,
                      "ratio": v / piv.loc[k, base] if piv.loc[k, base] > 0 else np.nan}
                     for k, v in piv[lib].items()]
    ch = pd.read_parquet(d / "checks.parquet")
    fx = ch[ch["role"] == "fixed"]
    if fx.empty:
        continue
    grid = np.linspace(fx["rate_req_per_s"].min(), fx.groupby("library")["rate_req_per_s"].max().min(), 6)
    for metric in ("ttft_p99_s", "tpot_p99_s"):
        curves = {lib: np.interp(grid, g["rate_req_per_s"], g[metric]) for lib, g in fx.groupby("library")}
        for lib, c in curves.items():
            if lib != base:
                lat += [{"trace": trace, "library": lib, "metric": metric, "rate": r, "ratio": v / b}
                        for r, v, b in zip(grid, c, curves[base], strict=True)]
good, lat = pd.DataFrame(rows), pd.DataFrame(lat)
print(good.pivot_table(index="trace", columns="slo_scale", values="ratio").round(3) if len(good) else "no goodput rows")

# %% the figure
fig, axes = plt.subplots(1, 3, figsize=(16, 0.9 * max(3, len(runs)) + 1.5))


def heat(ax, df: pd.DataFrame, col: str, title: str, fmt: str) -> None:  # noqa: ANN001
    if df.empty:
        ax.set_axis_off()
        return
    p = df.pivot_table(index="trace", columns=col, values="ratio")
    im = ax.imshow(p.to_numpy(), cmap="RdBu_r" if "TTFT" in title or "TPOT" in title else "RdBu",
                   vmin=0.8, vmax=1.2, aspect="auto")
    ax.set_xticks(range(len(p.columns)), [fmt.format(c) for c in p.columns])
    ax.set_yticks(range(len(p.index)), p.index)
    for (i, j), v in np.ndenumerate(p.to_numpy()):
        ax.text(j, i, "–" if np.isnan(v) else f"{v:.2f}", ha="center", va="center", fontsize=9)
    ax.set_title(title)
    ax.set_xlabel(col.replace("_", " "))
    fig.colorbar(im, ax=ax, shrink=0.8)


lib = good["library"].iloc[0] if len(good) else ""
heat(axes[0], good, "slo_scale", f"goodput at best layout, {lib} ÷ baseline", "×{:g}")
heat(axes[1], lat[lat["metric"] == "ttft_p99_s"] if len(lat) else lat, "rate", "P99 TTFT, fixed layout (ratio)", "{:.0f}")
heat(axes[2], lat[lat["metric"] == "tpot_p99_s"] if len(lat) else lat, "rate", "P99 TPOT, fixed layout (ratio)", "{:.0f}")
fig.suptitle("Regime map: library ratio over trace, SLO scale and offered rate (req/s)")
fig.tight_layout()
Path(args.out).parent.mkdir(parents=True, exist_ok=True)
fig.savefig(args.out, dpi=110)
print("figure:", args.out)

# %% [markdown]
# ## SLO-scale curves: goodput per die at each library's best layout as both SLOs scale

# %%
fig2, axs = plt.subplots(1, max(1, len(runs)), figsize=(5 * max(1, len(runs)), 3.6), squeeze=False)
for ax, (trace, base, d) in zip(axs[0], runs, strict=False):
    sc = pd.read_parquet(d / "slo_scale.parquet")
    if "goodput_req_per_s_per_die" not in sc:
        ax.set_axis_off()
        continue
    for lib, g in sc.groupby("library"):
        g = g.sort_values("slo_scale")
        ax.plot(g["slo_scale"], g["goodput_req_per_s_per_die"], marker="o", label=lib)
        capped = g[g["capped"]]
        ax.scatter(capped["slo_scale"], capped["goodput_req_per_s_per_die"], marker="^", s=80, facecolors="none",
                   edgecolors="k", label="capped (grid top met)" if lib == base else None)
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("SLO scale (TTFT and TPOT × k)")
    ax.set_ylabel("goodput (req/s per die)")
    ax.set_title(trace)
    ax.legend(fontsize=8)
fig2.tight_layout()
out2 = Path(args.out).with_name("slo_scale.png")
fig2.savefig(out2, dpi=110)
print("figure:", out2)
