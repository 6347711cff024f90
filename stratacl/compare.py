"""Side-by-side comparison of libraries: one table helper for the CLI and every workload.

A side-by-side table has one value column per library (in the run's order) and one ratio column
`<lib>/<baseline>` per non-baseline library; the rows are whatever the caller compares (metrics,
or message sizes, or iterations). `ratios` is the summary.json form of the same comparison.
"""

from __future__ import annotations

import math

import pandas as pd


def ratios(metrics: dict[str, dict[str, float]], baseline: str) -> dict[str, dict[str, float | None]]:
    """value / baseline value per library and metric; None (JSON null) where undefined (baseline
    0, missing or non-finite)."""
    base = metrics[baseline]
    out: dict[str, dict[str, float | None]] = {}
    for lib, m in metrics.items():
        out[lib] = {}
        for key, v in m.items():
            b = base.get(key)
            if b is None or b == 0 or not (math.isfinite(float(b)) and math.isfinite(float(v))):
                out[lib][key] = None
            else:
                out[lib][key] = float(v) / float(b)
    return out


def side_by_side(wide: pd.DataFrame, libraries: list[str], baseline: str) -> pd.DataFrame:
    """`wide` holds one column per library (and any key columns); appends `<lib>/<baseline>`,
    undefined (NaN, printed "–") where the baseline is 0 or not finite, as `ratios` gives null."""
    out = wide.copy()
    base = out[baseline].astype(float)
    base = base.where((base != 0) & base.map(math.isfinite))
    for lib in libraries:
        if lib != baseline:
            out[f"{lib}/{baseline}"] = out[lib].astype(float) / base
    return out


def metric_table(metrics: dict[str, dict[str, float]], baseline: str,
                 keys: list[str] | None = None) -> pd.DataFrame:
    """Metrics as rows (column `metric`), libraries as columns, ratios vs the baseline."""
    libs = list(metrics)
    keys = keys if keys is not None else list(metrics[baseline])
    keys = [k for k in keys if all(k in metrics[lib] for lib in libs)]
    wide = pd.DataFrame({"metric": keys, **{lib: [metrics[lib][k] for k in keys] for lib in libs}})
    return side_by_side(wide, libs, baseline)


def pivot_table(rows: pd.DataFrame, index: list[str], value: str, libraries: list[str],
                baseline: str) -> pd.DataFrame:
    """Long rows (one per key × library) → one `value` column per library plus ratios."""
    wide = rows.pivot_table(index=index, columns="library", values=value, sort=False)[libraries]
    wide.columns.name = None
    out = side_by_side(wide.reset_index(), libraries, baseline)
    out.attrs["value"] = value  # what the library columns hold: the report prints its unit (report.py)
    return out
