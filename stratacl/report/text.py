"""The main job's report, read at a glance: a verdict line per library against the baseline (on
the workload's headline metric, with its direction), the mechanisms behind it, then one table —
every metric with its unit and direction, one number format — and, for an experiment that
reproduces a published figure, the published value and the harness's error beside it.

Reference values (`reference:` in conf/experiment/*.yaml) are display-only: they are printed
here and never enter any computation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from stratacl import directions as d

# display scale per unit: seconds below 1 s print as ms, fractions as %
SCALE = {"fraction": (100.0, "%")}


def fmt(v: float | None) -> str:
    """One number format for every value: 4 significant digits, thousands separators, no
    exponent between 1e-4 and 1e9; "–" for an undefined value."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 1e9 or a < 1e-4:
        return f"{v:.3e}"
    digits = max(0, 3 - int(math.floor(math.log10(a))))
    return f"{v:,.{digits}f}"


def fmt_ratio(r: float | None) -> str:
    return "–" if r is None or not math.isfinite(r) else f"{r:.3f}×"


def display(metric: str, base: float | None) -> tuple[float, str]:
    """(scale, unit) a metric is shown in: seconds as ms when the baseline is under 1 s."""
    info = d.info(metric)
    if info.unit == "s" and base is not None and abs(base) < 1:
        return 1e3, "ms"
    return SCALE.get(info.unit, (1.0, info.unit))


def _scaled(metric: str, v: float | None, base: float | None) -> str:
    scale, unit = display(metric, base)
    return "–" if v is None else f"{fmt(v * scale)} {unit}".rstrip()


def _change(j: dict[str, Any]) -> str:
    if j["ratio"] is None:
        return f"{_scaled(j['metric'], j['baseline'], j['baseline'])} → {_scaled(j['metric'], j['value'], j['baseline'])}"
    pct = abs(j["change"]) * 100
    word = "higher" if j["change"] > 0 else "lower"
    return f"{fmt_ratio(j['ratio'])} ({pct:.0f} % {word})" if pct >= 0.5 else f"{fmt_ratio(j['ratio'])}"


def _tag(j: dict[str, Any]) -> str:
    info = d.info(j["metric"])
    outcome = str(j["outcome"])
    return {"tie": f"tie within ±{info.tie:.0%}"}.get(outcome, outcome)


def _word(j: dict[str, Any]) -> str:
    """better / worse, faster / slower for a time."""
    outcome = str(j["outcome"])
    if outcome not in ("better", "worse") or d.info(j["metric"]).unit not in ("s", "µs", "ms"):
        return outcome
    return {"better": "faster", "worse": "slower"}[outcome]


def _speedup(j: dict[str, Any]) -> float | None:
    """How many times better (> 1) or worse (< 1) a judged value is, whatever its direction."""
    r: float | None = j["ratio"]
    if r is None or not math.isfinite(r) or r == 0:
        return None
    return r if j["better"] == "higher" else 1 / r


def _factor(j: dict[str, Any]) -> str:
    """"2.41×" in the judgement's direction (better or worse), the raw ratio for a tie."""
    s = _speedup(j)
    if s is None:
        return ""
    if j["outcome"] == "tie":
        return f"{j['ratio']:.3f}×, within ±{d.info(j['metric']).tie:.0%}"
    return f"{max(s, 1 / s):.2f}×"


def _phrase(j: dict[str, Any]) -> str:
    """"faster on small (< 1 MiB) (3.30×)"; a mixed headline: its own value's factor, then its
    decisive parts grouped by outcome."""
    if j["outcome"] != "mixed":
        by = _factor(j)
        return f"{_word(j)} on {d.short(j['metric'])}" + (f" ({by})" if by else "")
    s, items = _speedup(j), []
    if s is not None:
        word = _word({**j, "outcome": "better" if s >= 1 else "worse"})
        items.append(f"{max(s, 1 / s):.2f}× {word} overall")
    groups: dict[str, list[str]] = {}
    for p in j.get("parts", []):
        if p["outcome"] in ("better", "worse"):
            groups.setdefault(_word(p), []).append(f"{d.short(p['metric'])} {_factor(p)}")
    items += [f"{w} {', '.join(names)}" for w, names in groups.items()]
    return f"mixed on {d.short(j['metric'])} ({'; '.join(items)})"


def _head(v: Mapping[str, Any]) -> str:
    """The outcome and what it rests on: for a headline set with parts, a mixed or a tied verdict,
    every judged headline's phrase; otherwise the lead headline's factor and values."""
    head = str(v["outcome"]).upper()
    judged = [j for j in v["headlines"] if j["outcome"] != "missing"]
    if judged and v["outcome"] == "tie":
        return f"{head} — " + ", ".join(f"{d.short(j['metric'])} ({_factor(j)})" for j in judged)
    if judged and (v["outcome"] == "mixed" or any("parts" in j for j in judged)):
        return f"{head} — {', '.join(_phrase(j) for j in judged)}"
    if v["outcome"] in ("faster", "slower") and v["lead_speedup"]:
        s = v["lead_speedup"]
        by = f"{s:.2f}× better" if s >= 1 else f"{1 / s:.2f}× worse"
        lead = next(j for j in v["headlines"] if j["metric"] == v["lead_metric"])
        head += (f" — {by} on {d.info(lead['metric']).label} "
                 f"({_scaled(lead['metric'], lead['baseline'], lead['baseline'])} → "
                 f"{_scaled(lead['metric'], lead['value'], lead['baseline'])})")
    return head


def verdict_lines(block: Mapping[str, Any]) -> list[str]:
    """One line per library (who won, by how much, on which metric) and one `why:` line."""
    base = block["baseline"]
    lines = [f"verdict vs {base} (baseline):"]
    for lib, v in block["libraries"].items():
        parts = []
        for j in v["headlines"]:
            info = d.info(j["metric"])
            if j["outcome"] == "missing":
                continue
            parts.append(f"{info.label}: {_change(j)}, {info.better} is better → {_tag(j)}")
            cells = [f"{d.short(p['metric'])} {fmt_ratio(p['ratio'])} {_tag(p)}" for p in j.get("parts", [])
                     if p["outcome"] != "missing"]
            if cells:
                parts.append(f"    {', '.join(cells)}")
        lines.append(f"  {lib}: {_head(v)}")
        lines += [f"      caveat: {c}" for c in v.get("caveats", [])]
        lines += [f"      {p}" for p in parts]
        context = [f"{d.info(j['metric']).label} {_scaled(j['metric'], j['baseline'], j['baseline'])} → "
                   f"{_scaled(j['metric'], j['value'], j['baseline'])}" for j in v.get("context", [])
                   if j["value"] is not None]
        if context:
            lines.append(f"      context (not judged): {'; '.join(context)}")
        if v["missing"]:
            lines.append(f"      missing (not judged): {', '.join(v['missing'])}")
        why = why_text(v["mechanisms"])
        lines += [f"      {'why:' if k == 0 else '    '} {w}" for k, w in enumerate(why)]
        lines += [f"      {'split:' if k == 0 else '      '} {w}" for k, w in enumerate(split_text(v.get("counterfactual", [])))]
    return lines


def split_text(splits: list[dict[str, Any]], limit: int = 5) -> list[str]:
    """The counterfactual split of each whole's difference, largest terms first, the rest summed:
    "decode iteration 45.20 → 40.10 ms (−5.10): contention −2.00, exposed copies −1.50, … (terms sum to
    the difference; compute path = comm at zero cost, contention = as run − comm as plain delays)"."""
    out = []
    for s in splits:
        whole, base, value = s["whole"], s["baseline_s"], s["value_s"]
        diff = value - base
        scale, unit = display(whole, base)
        terms = [(t, v) for t, v in s["terms"].items() if abs(v) >= MATERIAL_SPLIT * max(abs(base), 1e-30)]
        rest = sum(v for t, v in s["terms"].items() if (t, v) not in terms[:limit])
        cells = [f"{d.CF_LABELS[t]} {v * scale:+.3g}" for t, v in terms[:limit]]
        if abs(rest) > 0:
            cells.append(f"other terms {rest * scale:+.3g}")
        out.append(f"{d.info(whole).label} {base * scale:.4g} → {value * scale:.4g} {unit} ({diff * scale:+.3g}): "
                   f"{', '.join(cells) or 'no term moves'}")
    if out:
        out.append("(counterfactual replays: compute path = communication at zero cost; exposed terms = comm as "
                   "plain delays minus that, by phase category; contention = as run minus plain delays; they sum "
                   "to the difference)")
    return out


MATERIAL_SPLIT = 0.005  # display: a term under 0.5 % of the baseline's whole is folded into "other terms"


def why_text(mechanisms: list[dict[str, Any]], limit: int = 4) -> list[str]:
    """Mechanisms grouped by name, most material group first: "copies: copies per prefill
    iteration 118.6 → 0 ms (−7.3 % of the prefill iteration)"."""
    if not mechanisms:
        return ["no accounted mechanism (exposed comm, copies, registration, launch, memory) differs materially "
                "(≥ 1 % of its step, or beyond its tie band), or the workload reports none"]
    groups: dict[str, list[str]] = {}
    for j in mechanisms:
        item = (f"{d.info(j['metric']).label} {_scaled(j['metric'], j['baseline'], j['baseline'])} → "
                f"{_scaled(j['metric'], j['value'], j['baseline'])}")
        if "share_of_whole" in j:
            item += f" ({j['share_of_whole'] * 100:+.1f} % of the {d.info(j['whole']).label})"
        groups.setdefault(j["mechanism"], []).append(item)
    return [f"{name}: {', '.join(items[:3])}" for name, items in list(groups.items())[:limit]]


def _times(v: float | None, scale: float) -> float | None:
    return None if v is None else v * scale


def table_lines(metrics: Mapping[str, Mapping[str, float | None]], baseline: str, workload: str) -> list[str]:
    """One table: metric, unit, direction, a value per library, ratio per library vs the baseline,
    headline and mechanism metrics first."""
    libs = list(metrics)
    others = [lib for lib in libs if lib != baseline]
    names = list(dict.fromkeys(m for lib in libs for m in metrics[lib]))
    heads = d.headlines(workload, names)
    mech = [m for m in names if d.info(m).mechanism and m not in heads]
    order = heads + mech + [m for m in names if m not in heads and m not in mech]
    header = ["metric", "unit", "better", *libs, *[f"{lib}/{baseline}" for lib in others]]
    rows = [header]
    for m in order:
        base = metrics[baseline].get(m)
        scale, unit = display(m, base)
        info = d.info(m)
        better = {"higher": "↑", "lower": "↓"}.get(info.better or "", "·") + (" (load)" if info.pinned else "")
        vals = [fmt(_times(metrics[lib].get(m), scale)) for lib in libs]
        ratios = []
        for lib in others:
            v = metrics[lib].get(m)
            ratios.append(fmt_ratio(v / base) if base is not None and base != 0 and v is not None else "–")
        rows.append([m, unit, better, *vals, *ratios])
    out = _aligned(rows)
    legend = ("better: ↑ higher is better, ↓ lower is better, · context (not judged); (load): set by the "
              "offered load in an open-loop run, not a comparison of libraries")
    return [*out, legend]


def _reference_values(reference: Mapping[str, Any] | None) -> dict[str, list[tuple[str, float, str]]]:
    """metric -> [(library, published value, source)] from an experiment's `reference:` block."""
    if not reference:
        return {}
    out: dict[str, list[tuple[str, float, str]]] = {}
    for lib, vals in (reference.get("values") or {}).items():
        for metric, item in (vals or {}).items():
            value, source = (item["value"], item.get("source", "")) if isinstance(item, Mapping) else (item, "")
            out.setdefault(metric, []).append((lib, float(value), source or reference.get("source", "")))
    return out


def _aligned(rows: list[list[str]]) -> list[str]:
    """Text columns: the first left-aligned, the rest right-aligned, a rule under the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for k, r in enumerate(rows):
        out.append("  ".join([r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]))
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def reference_lines(reference: Mapping[str, Any] | None, metrics: Mapping[str, Mapping[str, float | None]]) -> list[str]:
    """Published values beside the harness's, with the error; their sources and notes. Display
    only: `metrics` is read, nothing is written back or computed from the published values."""
    if not reference:
        return []
    refs = _reference_values(reference)
    sources = list(dict.fromkeys([*(src for items in refs.values() for _, _, src in items if src),
                                  *([reference["source"]] if reference.get("source") else [])]))
    lines = []
    if refs:
        rows = [["reference (published, display only)", "library", "unit", "harness", "published", "error"]]
        for metric, items in refs.items():
            for lib, value, _ in items:
                v = (metrics.get(lib) or {}).get(metric)
                scale, unit = display(metric, value)
                err = "–" if v is None or value == 0 else f"{(v - value) / abs(value) * 100:+.0f} %"
                rows.append([metric, lib, unit, fmt(None if v is None else v * scale), fmt(value * scale), err])
        lines += [*_aligned(rows), "error = (harness − published) / published"]
    else:
        lines.append("reference: the published figure this experiment reproduces (display only)")
    note = reference.get("note")
    return [*lines, *[f"  source: {s}" for s in sources], *([f"  note: {note}"] if note else [])]


def with_units(detail: pd.DataFrame, libraries: list[str]) -> pd.DataFrame:
    """A workload's side-by-side table (compare.pivot_table) with units in its headers: each
    library's column as `<lib> [<unit>]` of the value it holds (`attrs["value"]`, e.g. busbw_GBps →
    GB/s), ratio columns `<lib>/<baseline> [×]`, key columns by their name's unit suffix."""
    value = detail.attrs.get("value")
    names = {}
    for col in detail.columns:
        if col in libraries and value:
            names[col] = f"{col} [{_unit_label(value)}]"
        elif "/" in col and col.split("/")[0] in libraries:
            names[col] = f"{col} [×]"
        elif col not in libraries and d.info(col).unit not in ("1", ""):
            names[col] = f"{col} [{_unit_label(col)}]"
    return detail.rename(columns=names)


def _unit_label(metric: str) -> str:
    return d.info(metric).unit  # the table's values are not rescaled (a fraction stays 0–1)


def report_lines(workload: str, summary: Mapping[str, Any], accounted: Mapping[str, Mapping[str, float]] | None = None,
                 reference: Mapping[str, Any] | None = None, detail: pd.DataFrame | None = None) -> list[str]:
    """The whole main-job report: verdict, why, the one table, reference sources.

    `accounted` adds per-library accounting means (verdict.accounting) to the table and the
    mechanisms; `detail` is a workload's per-size or per-iteration table (a DataFrame) printed
    first, in the same number format."""
    from stratacl.report.verdict import merge_accounting, verdict

    metrics = merge_accounting(summary["libraries"], accounted)
    lines = []
    if detail is not None and not detail.empty and "metric" not in detail.columns:
        if detail.attrs.get("value"):
            lines.append(f"{detail.attrs['value']} per library [{_unit_label(detail.attrs['value'])}], "
                         "ratio vs the baseline [×]:")
        lines += [with_units(detail, list(summary["libraries"])).to_string(index=False, float_format=fmt, na_rep="–"),
                  ""]
    lines += table_lines(metrics, summary["baseline"], workload)
    if reference:
        lines += ["", *reference_lines(reference, metrics)]
    lines += ["", *verdict_lines(verdict(workload, metrics, summary["baseline"]))]
    if len(summary["libraries"]) > 1 and summary.get("fabric"):  # a verdict was judged: how far to trust it
        from stratacl.report.trust import trust_lines

        lines += trust_lines(str(summary["fabric"]), workload)
    return lines
