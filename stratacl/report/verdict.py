"""Who won and why: a verdict per library against the baseline, from a run's metrics.

For each non-baseline library the workload's headline metrics (its spec's `headlines`, `directions.headlines`) are judged
with their direction: a change within the metric's tie band counts as a tie, a missing or
undefined value as missing. A headline with parts (a collectives size band: each collective's
operator time in it, `directions.parts`) takes its outcome from them: better or worse when every
decisive part agrees, mixed when they disagree, tie when none is decisive. The outcome is
"faster" or "slower" when every decisive headline agrees, "mixed" when they disagree (or one is
mixed), "tie" when none is decisive, "no verdict" when none is present. Context metrics
(the spec's `context`, `directions.context`) are shown beside the headlines, never judged.
The mechanisms are the metrics the accounting gives (exposed communication, copies, registration,
launch, memory → batch) that differ from the baseline beyond their tie band, largest change first.
Everything here is computed from the metrics alone: a verdict never feeds back into a result.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from stratacl import directions as d

Metrics = Mapping[str, Mapping[str, float | None]]

ACCOUNTED = ("time_s", "exposed_comm_s", "copy_s", "register_s", "launch_s",
             *(f"cf_{t}_s" for t in d.CF_TERMS))  # the counterfactual split (engine/counterfactual.py)
OP_ACCOUNTED = ("wire_s", "copy_s", "sync_s", "register_s", "launch_s")


def _num(v: object) -> float | None:
    try:
        x = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def judge(metric: str, base: float | None, value: float | None) -> dict[str, Any]:
    """One metric of one library vs the baseline: ratio, relative change and better/worse/tie."""
    info = d.info(metric)
    base, value = _num(base), _num(value)
    out: dict[str, Any] = {"metric": metric, "better": info.better, "unit": info.unit, "baseline": base,
                           "value": value, "ratio": None, "change": None, "outcome": "missing"}
    if base is None or value is None:
        return out
    if base == 0:
        out["outcome"] = "tie" if value == 0 else ("better" if (value > 0) == (info.better == "higher")
                                                    else "worse")
        return out if info.better else {**out, "outcome": "context"}
    change = value / base - 1
    out["ratio"] = value / base
    out["change"] = change
    if info.better is None:
        out["outcome"] = "context"
    elif abs(change) <= info.tie:
        out["outcome"] = "tie"
    else:
        out["outcome"] = "better" if (change > 0) == (info.better == "higher") else "worse"
    return out


def _speedup(j: dict[str, Any]) -> float | None:
    """How many times better (>1) or worse (<1) a judged metric is, whatever its direction (None
    when a value is 0: no finite factor)."""
    r: float | None = j["ratio"]
    if not r:
        return None
    return r if j["better"] == "higher" else 1 / r


MATERIAL = 0.01  # ASSUMPTION (display): a mechanism's time change under 1 % of its whole (step, iteration) is not listed


def _mechanisms(metrics: Metrics, lib: str, baseline: str) -> list[dict[str, Any]]:
    """Accounted mechanisms that differ from the baseline, most material first: a time by its
    change as a share of its whole (`MetricInfo.per`), anything else by its relative change."""
    out = []
    for metric, base in metrics[baseline].items():
        info = d.info(metric)
        if info.mechanism is None or metric not in metrics[lib]:
            continue
        j = judge(metric, base, metrics[lib][metric])
        if j["baseline"] is None or j["value"] is None or j["baseline"] == j["value"]:
            continue
        whole = _num(metrics[baseline].get(info.per)) if info.per else None
        if whole:
            j["share_of_whole"] = (j["value"] - j["baseline"]) / whole
            j["whole"] = info.per
            if abs(j["share_of_whole"]) < MATERIAL:
                continue
        elif j["change"] is not None and abs(j["change"]) <= info.tie:
            continue
        j["mechanism"] = info.mechanism
        out.append(j)
    return sorted(out, key=_weight, reverse=True)


def _weight(j: dict[str, Any]) -> tuple[int, float]:
    """Time first (its change as a share of the step, or a share's own change), then the rest
    (memory, by relative change)."""
    if "share_of_whole" in j:
        return 1, abs(j["share_of_whole"])
    if j["unit"] == "fraction":
        return 1, abs(j["value"] - j["baseline"])
    return 0, min(abs(j["change"]), 1.0) if j["change"] is not None else 1.0


DECISIVE = ("better", "worse", "mixed")


def _agreement(judged: list[dict[str, Any]]) -> str:
    """better / worse when every decisive judgement agrees, mixed when they disagree, tie when
    none is decisive (missing when none is judged)."""
    outcomes = {j["outcome"] for j in judged if j["outcome"] != "missing"}
    decisive = outcomes & set(DECISIVE)
    if not outcomes:
        return "missing"
    if not decisive:
        return "tie" if "tie" in outcomes else "context"
    return decisive.pop() if len(decisive) == 1 else "mixed"


def judge_headline(metric: str, base: Mapping[str, float | None], lib: Mapping[str, float | None],
                   present: set[str] | list[str]) -> dict[str, Any]:
    """A headline judged on its value, or — with parts — its value shown and its outcome theirs."""
    j = judge(metric, base.get(metric), lib.get(metric))
    names = d.parts(metric, present)
    if not names or j["outcome"] == "missing":
        return j
    j["parts"] = [judge(m, base.get(m), lib.get(m)) for m in names]
    return {**j, "outcome": _agreement(j["parts"])}


def verdict(workload: str, metrics: Metrics, baseline: str) -> dict[str, Any]:
    """The verdict block (JSON-safe) for every non-baseline library."""
    if baseline not in metrics:
        return {"baseline": baseline, "libraries": {}}
    libs = {}
    for lib in metrics:
        if lib == baseline:
            continue
        present = list(dict.fromkeys([*metrics[baseline], *metrics[lib]]))
        heads = [judge_headline(m, metrics[baseline], metrics[lib], present) for m in d.headlines(workload, present)]
        decisive = [j for j in heads if j["outcome"] in DECISIVE]
        judged = [j for j in heads if j["outcome"] != "missing"]
        agreed = _agreement(heads)
        if not judged:
            outcome, lead = "no verdict", None
        elif not decisive:
            outcome, lead = "tie", judged[0]
        else:
            outcome, lead = {"better": "faster", "worse": "slower"}.get(agreed, "mixed"), decisive[0]
        libs[lib] = {"outcome": outcome,
                     "lead_metric": lead["metric"] if lead else None,
                     "lead_speedup": _speedup(lead) if lead else None,
                     "headlines": heads,
                     "missing": [j["metric"] for j in heads if j["outcome"] == "missing"],
                     "context": [{**judge(m, metrics[baseline].get(m), metrics[lib].get(m)), "outcome": "context"}
                                 for m in d.context(workload, present)],
                     "caveats": _caveats(workload, metrics, (baseline, lib)),
                     "mechanisms": _mechanisms(metrics, lib, baseline),
                     "counterfactual": counterfactual_split(metrics, lib, baseline)}
    return {"baseline": baseline, "libraries": libs}


def counterfactual_split(metrics: Metrics, lib: str, baseline: str) -> list[dict[str, Any]]:
    """Per whole (decode / prefill iteration, training iteration) whose counterfactual terms
    (`<whole>_cf_<term>_s`, stratacl/engine/counterfactual.py) both libraries report: the
    difference of the wholes and of each term (they sum to it), largest term first."""
    out = []
    for whole, metric in d.CF_WHOLES.items():
        names = {t: d.cf_metric(whole, t) for t in d.CF_TERMS}
        base_t, lib_t = _num(metrics[baseline].get(metric)), _num(metrics[lib].get(metric))
        if base_t is None or lib_t is None:
            continue
        base_v = {t: _num(metrics[baseline].get(n)) for t, n in names.items()}
        lib_v = {t: _num(metrics[lib].get(n)) for t, n in names.items()}
        if any(v is None for v in (*base_v.values(), *lib_v.values())):
            continue
        terms: dict[str, float] = {t: float(lib_v[t] or 0.0) - float(base_v[t] or 0.0) for t in d.CF_TERMS}
        out.append({"whole": metric, "baseline_s": base_t, "value_s": lib_t, "baseline_terms": base_v,
                    "terms": dict(sorted(terms.items(), key=lambda kv: -abs(kv[1])))})
    return out


def _caveats(workload: str, metrics: Metrics, libs: tuple[str, ...]) -> list[str]:
    """"<libraries>: <meaning>" for each caveat flag (directions.CAVEATS) raised by the baseline or the
    judged library: the verdict stands, read with what it rests on."""
    out = []
    for flag, meaning in d.caveats(workload).items():
        raised = [lib for lib in libs if _num(metrics[lib].get(flag)) == 1.0]
        if raised:
            out.append(f"{' and '.join(raised)}: {meaning}")
    return out


def merge_accounting(metrics: Metrics, accounted: Mapping[str, Mapping[str, float]] | None) -> dict[str, dict[str, Any]]:
    """The run's metrics plus the accounting means that are not already among them (a mean equal,
    for every library, to an existing metric is the same quantity under another name)."""
    out = {lib: dict(m) for lib, m in metrics.items()}
    if not out:
        return out
    names = list(dict.fromkeys(k for extra in (accounted or {}).values() for k in extra))
    for name in names:
        if any(name in out[lib] for lib in out):
            continue
        values = {lib: (accounted or {}).get(lib, {}).get(name) for lib in out}
        same = any(all(values[lib] == m.get(other) for lib, m in out.items()) for other in next(iter(out.values())))
        if same and any(values.values()) and not name.endswith("_iter_time_s"):  # the wholes mechanisms refer to stay
            continue
        for lib, v in values.items():
            if v is not None:
                out[lib][name] = v
    return out


def accounting(rows: pd.DataFrame, extra: Mapping[str, pd.DataFrame]) -> dict[str, dict[str, float]]:
    """Per-library means of the exposure accounting a run's rows carry (stratacl/engine/accounting.py):
    per decode / prefill iteration for serving, summed over operators for operator sweeps.
    Metric names are those of `directions.EXACT` (decode_iter_copy_s, op_wire_s, ...)."""
    out: dict[str, dict[str, float]] = {}
    its = extra.get("iterations")
    if its is None and "phase" in rows.columns:
        its = rows
    if its is not None and {"phase", "library"} <= set(its.columns):
        cols = [c for c in ACCOUNTED if c in its.columns and its[c].notna().any()]
        for (lib, phase), g in its.groupby(["library", "phase"], sort=False):
            for c in cols:
                out.setdefault(str(lib), {})[f"{phase}_iter_{c}"] = float(g[c].mean())
    elif {"library", "size_bytes"} <= set(rows.columns):
        cols = [c for c in OP_ACCOUNTED if c in rows.columns]
        for lib, g in rows.groupby("library", sort=False):
            out[str(lib)] = {f"op_{c}": float(g[c].sum()) for c in cols}
    return out
