"""Plot helpers for notebooks: draw from `stratacl.report.results.load_runs` frames with matplotlib.

Each function takes a tidy frame, draws on a new figure (or the given axes) and returns the
Figure, so notebooks can `fig.savefig(...)`. Headless by default (Agg) unless a Jupyter kernel
or MPLBACKEND chose a backend.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import matplotlib

if "ipykernel" not in sys.modules and "MPLBACKEND" not in os.environ:
    matplotlib.use("Agg")  # scripts and CI have no display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter  # noqa: E402

TIME_PARTS = ("wire_s", "copy_s", "sync_s", "launch_s", "register_s", "compute_s")  # SimResult.op_frame


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:g} {unit}"
        n /= 1024
    return f"{n:g} TiB"


def _colors(libraries: Sequence[str]) -> dict[str, object]:
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {lib: cycle[i % len(cycle)] for i, lib in enumerate(libraries)}


def busbw_vs_size(results: pd.DataFrame, collectives: Sequence[str] | None = None,
                  libraries: Sequence[str] | None = None, targets: pd.DataFrame | None = None,
                  metric: str = "busbw_GBps", ncols: int = 2, hue: str = "library") -> Figure:
    """Operator bus bandwidth vs message size, one panel per collective, one line per library.

    `results`: rows with `library`, `collective`, `size_bytes` and `metric` (the collectives
    workload's results.parquet; several runs are averaged per point; `hue` names the column that
    tells lines apart, e.g. a library-and-configuration label). `targets`: optional paper points
    with the same columns, drawn as hollow markers in the library's colour. The y axis starts at 0.
    """
    collectives = list(collectives or dict.fromkeys(results["collective"]))
    libraries = list(libraries or dict.fromkeys(results[hue]))
    colors = _colors(libraries)
    nrows = -(-len(collectives) // ncols)
    fig, axes = plt.subplots(nrows, min(ncols, len(collectives)), squeeze=False,
                             figsize=(5.2 * min(ncols, len(collectives)), 3.6 * nrows))
    points = results.groupby(["collective", hue, "size_bytes"], sort=True)[metric].mean()
    for ax, coll in zip(axes.flat, collectives, strict=False):
        for lib in libraries:
            if (coll, lib) not in points.index.droplevel(2):
                continue
            p = points.loc[(coll, lib)]
            ax.plot(p.index, p.to_numpy(), marker="o", ms=3, label=lib, color=colors[lib])
        if targets is not None:
            for lib, t in targets[targets["collective"] == coll].groupby("library"):
                ax.scatter(t["size_bytes"], t[metric], marker="D", facecolors="none", s=40,
                           edgecolors=colors.get(lib, "k"), label=f"{lib} (paper)", zorder=3)
        sizes = sorted(results.loc[results["collective"] == coll, "size_bytes"].unique())
        _log2_size_axis(ax, sizes)
        ax.set_title(coll)
        ax.set_ylabel("busbw (GB/s, nccl-tests convention)" if metric == "busbw_GBps" else metric.replace("_", " "))
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(collectives):]:
        ax.set_visible(False)
    fig.tight_layout()
    return fig


def _log2_size_axis(ax: Axes, sizes: Sequence[float]) -> None:
    ax.set_xscale("log", base=2)
    if sizes:
        ticks = sizes[:: max(1, -(-len(sizes) // 6))]  # at most ~6 labels
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: human_bytes(v)))
    ax.set_xlabel("message size per rank")


def metric_vs_param(summary: pd.DataFrame, metric: str, param: str, hue: str = "library",
                    ax: Axes | None = None, logx: bool = False, ratio: bool = False,
                    band: bool = False, zero: bool = False) -> Figure:
    """A summary metric (or its `_ratio` vs the baseline with `ratio=True`) against a swept config
    column (e.g. `workload.ranks`), one line per `hue` value; repeated points (seeds) are
    averaged. `band`: shade the min–max over the repeated points and name their count in the
    legend (a single run per point is said so); `zero`: the y axis starts at 0."""
    col = f"{metric}_ratio" if ratio else metric
    if ax is None:
        fig, ax = plt.subplots(figsize=(6, 4))
    else:
        fig = ax.figure
    grouped = summary.groupby([hue, param], sort=True)[col]
    data, lo, hi, n = grouped.mean(), grouped.min(), grouped.max(), grouped.count()
    for key in dict.fromkeys(summary[hue]):
        line = data.loc[key]
        label = str(key)
        if band:
            k = int(n.loc[key].min())
            label += f" (mean of {k} seeds, min–max band)" if k > 1 else " (1 run per point: no band)"
        (drawn,) = ax.plot(line.index, line.to_numpy(), marker="o", label=label)
        if band:
            ax.fill_between(line.index, lo.loc[key].to_numpy(), hi.loc[key].to_numpy(), alpha=0.2,
                            color=drawn.get_color(), linewidth=0)
    if logx:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(sorted(summary[param].unique())))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel(param)
    ax.set_ylabel(col.replace("_", " ") + (" (vs baseline)" if ratio else ""))
    if zero:
        ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def stacked_bars(frame: pd.DataFrame, step: str, parts: Sequence[str], order: Sequence[str] | None = None,
                 ax: Axes | None = None, ylabel: str = "", scale: float = 1.0) -> Figure:
    """Stacked bars, one per `step` value in `order` (e.g. the ablation ladder hccl → … → stratacl),
    segments = the `parts` columns summed per step, times `scale`; each bar is labelled with its total."""
    order = list(order or dict.fromkeys(frame[step]))
    totals = frame.groupby(step)[list(parts)].sum().reindex(order) * scale
    if ax is None:
        fig, ax = plt.subplots(figsize=(1.3 * len(order) + 2.5, 4))
    else:
        fig = ax.figure
    bottom = np.zeros(len(order))
    x = np.arange(len(order))
    for part in parts:
        vals = totals[part].fillna(0).to_numpy()
        ax.bar(x, vals, bottom=bottom, label=part.removesuffix("_s"), width=0.6)
        bottom += vals
    for xi, total in zip(x, bottom, strict=True):
        ax.annotate(f"{total:.3g}", (xi, total), ha="center", va="bottom", fontsize="small")
    ax.set_xticks(x, order, rotation=20, ha="right")
    ax.margins(y=0.08)  # room for the total labels
    ax.set_ylabel(ylabel)
    ax.legend(fontsize="small")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def grouped_bars(values: pd.DataFrame, reference: pd.DataFrame | None = None, ax: Axes | None = None,
                 ylabel: str = "", reference_label: str = "paper") -> Figure:
    """Grouped bars: one group per row of `values` (e.g. dispatch HT), one bar per column (library).
    With `reference` (same index/columns, e.g. paper numbers) each bar gets a hatched twin to its
    right, so harness and reference read side by side; missing reference cells are left out."""
    series = list(values.columns)
    colors = _colors(series)
    per = len(series) * (2 if reference is not None else 1)
    width = 0.8 / per
    x = np.arange(len(values.index))
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(6.0, 1.9 * len(x) + 2), 4.2))
    else:
        fig = ax.figure
    for j, s in enumerate(series):
        k = j * (2 if reference is not None else 1)
        pos = x - 0.4 + width * (k + 0.5)
        ax.bar(pos, values[s].to_numpy(dtype=float), width, color=colors[s], label=s)
        if reference is not None and s in reference.columns:
            ref = reference.reindex(values.index)[s].to_numpy(dtype=float)
            ax.bar(pos + width, ref, width, facecolor="white", edgecolor=colors[s], hatch="///",
                   label=f"{s} ({reference_label})")
    ax.set_xticks(x, [str(i) for i in values.index])
    ax.set_ylabel(ylabel)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def cdf(frame: pd.DataFrame, column: str, hue: str = "library", ax: Axes | None = None,
        scale: float = 1.0, xlabel: str = "", logx: bool = False) -> Figure:
    """Empirical CDF of `column` (× `scale`) per `hue` value; NaNs (unfinished requests) dropped."""
    if ax is None:
        fig, ax = plt.subplots(figsize=(5.5, 4))
    else:
        fig = ax.figure
    for key, sub in frame.groupby(hue, sort=False):
        v = np.sort(sub[column].dropna().to_numpy(dtype=float)) * scale
        if len(v):
            ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", label=str(key))
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel or column)
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig
