"""What each metric means for a verdict: which way is better, its unit, a short label, and the
mechanism it measures. The core's metrics are here; a workload's own are in its spec
(`workloads/<name>/metrics.py`, `stratacl/workload_spec.py`). The run report (`stratacl/report/text.py`), the verdict
(`stratacl/report/verdict.py`) and the analysis notebooks read it.

A metric is found by exact name first, then by the first matching pattern (metric families such
as `<collective>_busbw_GBps_mean`). `better=None` marks a context metric (a load, a shape, a
setting): it is shown, never judged. `pinned` marks a throughput the offered load fixes in an
open-loop run (it tracks the request rate, not the library).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from stratacl.metrics import SIZE_BANDS, band_range

if TYPE_CHECKING:
    from stratacl.workload_spec import WorkloadSpec

Better = Literal["higher", "lower"] | None

# Mechanism names the report groups metrics under (the accounting's categories, stratacl/engine/accounting.py)
EXPOSED, COPY, REGISTER, LAUNCH, SYNC, WIRE, MEMORY = (
    "exposed communication", "copies", "registration", "launch", "sync", "wire", "memory → batch")


@dataclass(frozen=True)
class MetricInfo:
    better: Better
    unit: str  # "s", "GB/s", "tok/s", "GiB", "fraction", ...
    label: str
    mechanism: str | None = None
    pinned: bool = False  # fixed by the offered load in an open-loop run
    tie: float = 0.02  # relative change within which two libraries tie (ASSUMPTION: run noise)
    per: str | None = None  # the whole a mechanism's time is part of (its change as a share of it)
    short: str = ""  # the name a verdict line gives the metric (default: label)


def metric(better: Better, unit: str, label: str, **kw: object) -> MetricInfo:
    """A metric-table entry: `metric("lower", "s", "decode step", mechanism=EXPOSED)`."""
    return MetricInfo(better, unit, label, **kw)  # type: ignore[arg-type]


# A P99 over a short measurement window moves by a few per cent between seeds (ASSUMPTION: ±5 %,
# from repeated seeds of the default llm_infer window; run seeds to measure it for your window).
P99_TIE = 0.05

ITER = "iteration_time_s"

EXACT: dict[str, MetricInfo] = {
    # a training step (llm_train, dlrm_train and any training workload)
    "iteration_time_s": metric("lower", "s", "iteration time"),
    "iteration_time_s_first": metric("lower", "s", "first iteration"),
    "iteration_time_s_last": metric("lower", "s", "last iteration"),
    "compute_s": metric(None, "s", "compute"),
    "exposed_comm_s": metric("lower", "s", "exposed communication", mechanism=EXPOSED, per=ITER),
    "tokens_per_s": metric("higher", "tok/s", "training throughput"),
    "samples_per_s": metric("higher", "samples/s", "training throughput"),
    "comm_wire_s": metric("lower", "s", "comm wire time", mechanism=WIRE, per=ITER),
    "comm_copy_s": metric("lower", "s", "comm copies", mechanism=COPY, per=ITER),
    "comm_sync_s": metric("lower", "s", "comm sync", mechanism=SYNC, per=ITER),
    "comm_register_s": metric("lower", "s", "comm registration", mechanism=REGISTER, per=ITER),
    "comm_launch_s": metric("lower", "s", "comm launch", mechanism=LAUNCH, per=ITER),
    "peak_mem_GB_per_die": metric("lower", "GB", "peak memory/die", mechanism=MEMORY),
    "reserved_GB_per_die": metric(None, "GB", "allocator reserved/die"),
    "fragmentation_GB_per_die": metric("lower", "GB", "fragmentation/die", mechanism=MEMORY),
    "recompute_forced": metric("lower", "flag", "recompute forced by memory"),
    # per-iteration accounting the report adds from a run's rows (stratacl/report/verdict.py accounting)
    **{f"{phase}_iter_time_s": metric("lower", "s", f"{phase} iteration") for phase in ("decode", "prefill")},
    **{f"{phase}_iter_{key}": metric("lower", "s", f"{what} per {phase} iteration", mechanism=mech,
                                  per=f"{phase}_iter_time_s")
       for phase in ("decode", "prefill")
       for key, what, mech in (("exposed_comm_s", "exposed comm", EXPOSED), ("copy_s", "copies", COPY),
                               ("register_s", "registration", REGISTER), ("launch_s", "launch", LAUNCH))},
    **{f"op_{key}": metric("lower", "s", f"operator {key[:-2]}, summed over sizes", mechanism=mech, per="time_s_total")
       for key, mech in (("wire_s", WIRE), ("copy_s", COPY), ("sync_s", SYNC), ("register_s", REGISTER),
                         ("launch_s", LAUNCH))},
}

# The counterfactual split of a whole's time (stratacl/engine/counterfactual.py): per whole, its
# metric and one `<whole>_cf_<term>_s` metric per term, the terms summing to the whole's time.
CF_WHOLES = {"decode_iter": "decode_iter_time_s", "prefill_iter": "prefill_iter_time_s",
             "iteration": "iteration_time_s"}
CF_TERMS = ("compute", "wire", "sync", "copy", "register", "launch", "host", "contention")
CF_LABELS = {"compute": "compute path", "wire": "exposed wire", "sync": "exposed sync",
             "copy": "exposed copies", "register": "exposed registration", "launch": "exposed launch",
             "host": "host round trips", "contention": "contention (ports / HBM / cores)"}


def cf_metric(whole: str, term: str) -> str:
    return f"{whole}_cf_{term}_s"


EXACT.update({cf_metric(w, t): metric("lower", "s", f"{CF_LABELS[t]} in the {w.replace('_iter', ' iteration')} "
                                      "(counterfactual split)")
              for w in CF_WHOLES for t in CF_TERMS})

BANDS = "|".join(band for band, _, _ in SIZE_BANDS)
BAND_PART = re.compile(rf"^(\w+)_({BANDS})_op_time_s$")  # one collective's operator time in a band

PATTERNS: list[tuple[re.Pattern[str], MetricInfo]] = [
    (re.compile(r"_p\d+_s$"), metric("lower", "s", "", tie=P99_TIE)),  # latency percentiles
    (re.compile(r"_busbw_GBps(_mean|_peak)?$"), metric("higher", "GB/s", "")),
    (re.compile(r"(^|_)time_us$"), metric("lower", "µs", "")),
    (re.compile(r"_time_s(_total)?$"), metric("lower", "s", "")),
    (re.compile(r"_tok_per_s"), metric("higher", "tok/s", "")),
    (re.compile(r"_GBps"), metric("higher", "GB/s", "")),
    # a rate is not a time: an offered rate or a search ceiling is context, a capacity says so by name
    (re.compile(r"_req_per_s$"), metric(None, "req/s", "")),
    (re.compile(r"_per_s$"), metric(None, "1/s", "")),
    (re.compile(r"(_s|_s_mean)$"), metric("lower", "s", "")),
    (re.compile(r"_Gi?B(_per_die)?$"), metric(None, "GB", "")),
]

UNKNOWN = MetricInfo(None, "", "")

# The metrics a verdict leads with when the workload's spec names none (a replayed trace).
DEFAULT_HEADLINES = ("iteration_time_s", "time_s", "makespan_s", "time_s_total")


# The unit of a metric no entry above names, read off its name (first match); a name with none of
# these is a dimensionless count or ratio: unit "1". Every printed table shows a unit.
NAME_UNITS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"(fraction|share|_hit_rate|_hit_rate_(blocks|tokens)|_utilisation)$"), "fraction"),
    (re.compile(r"_ms$"), "ms"), (re.compile(r"_us$"), "µs"), (re.compile(r"_s$"), "s"),
    (re.compile(r"_GiB(_per_die)?$"), "GiB"), (re.compile(r"_GB(_per_die)?$"), "GB"),
    (re.compile(r"_bytes$"), "B"), (re.compile(r"_GBps"), "GB/s"), (re.compile(r"_per_s$"), "1/s"),
    (re.compile(r"tokens?(_budget)?$"), "tokens"), (re.compile(r"batch(_per_die)?$"), "seq"),
    (re.compile(r"^(mtp|tbo|cloudmatrix_streams|expandable_segments)$"), "flag"),
    (re.compile(r"(_dp|_ep|_tp|^dies_used|^die_budget)$"), "dies"), (re.compile(r"_instances$"), "instances"),
]


def info(metric: str) -> MetricInfo:
    """The metric's direction, unit and label (label defaults to the name, unit to `NAME_UNITS`)."""
    found = EXACT.get(metric) or _workload_metric(metric)
    if found is None:
        found = next((m for pat, m in PATTERNS if pat.search(metric)), UNKNOWN)
    if not found.label:
        found = replace(found, label=_label(metric))
    part = BAND_PART.fullmatch(metric)
    if part and not found.short:
        found = replace(found, short=part.group(1))
    if not found.unit:
        found = replace(found, unit=next((u for pat, u in NAME_UNITS if pat.search(metric)), "1"))
    return found


def _label(metric: str) -> str:
    """`tpot_p99_s` -> "TPOT p99"; `allreduce_large_op_time_s` -> "allreduce, large (≥ 16 MiB)";
    other names with underscores as spaces, unit suffix dropped."""
    m = re.fullmatch(r"(ttft|tpot|e2e)_p(\d+)_s", metric)
    if m:
        return f"{m.group(1).upper()} p{m.group(2)}"
    m = BAND_PART.fullmatch(metric)
    if m:
        return f"{m.group(1)}, {m.group(2)} ({band_range(m.group(2))})"
    return re.sub(r"_(s|us|GBps)$", "", metric).replace("_", " ")


def _workload_metric(metric: str) -> MetricInfo | None:
    """A workload's own metric (its spec's table; names are unique across workloads)."""
    from stratacl.workload_registry import specs

    return next((sp.metrics[metric] for sp in specs().values() if metric in sp.metrics), None)


def _spec(workload: str) -> WorkloadSpec | None:
    from stratacl.workload_registry import specs

    return specs().get(workload)


def headlines(workload: str, available: set[str] | list[str]) -> list[str]:
    """The workload's headline metrics present in `available`, lead first."""
    sp = _spec(workload)
    names = sp.headlines if sp is not None and sp.headlines else DEFAULT_HEADLINES
    return [m for m in names if m in available]


def parts(metric: str, available: set[str] | list[str]) -> list[str]:
    """The metrics whose judgements decide a headline's outcome (a size band: each collective's
    operator time in it), in `available`'s order; [] for a headline judged on its own value."""
    m = re.fullmatch(rf"({BANDS})_op_time_s", metric)
    if not m:
        return []
    return [a for a in available if (p := BAND_PART.fullmatch(a)) and p.group(2) == m.group(1)]


def caveats(workload: str) -> dict[str, str]:
    """The workload's caveat flags (metric = 1) under which its headlines do not mean what they
    say on their own, and what each means for its verdict (the spec's `caveats`)."""
    sp = _spec(workload)
    return dict(sp.caveats) if sp is not None else {}


def context(workload: str, available: set[str] | list[str]) -> list[str]:
    """The workload's context metrics (its spec's, shown beside the headlines, never judged)
    present in `available`."""
    sp = _spec(workload)
    return [m for m in (sp.context if sp is not None else ()) if m in available]


def short(metric: str) -> str:
    """What a verdict line calls the metric."""
    i = info(metric)
    return i.short or i.label
