"""What each metric means for a verdict: which way is better, its unit, a short label, and the
mechanism it measures. Defined once; the run report (`stratacl/report.py`), the verdict
(`stratacl/verdict.py`) and the analysis notebooks read it.

A metric is found by exact name first, then by the first matching pattern (metric families such
as `<collective>_busbw_GBps_mean`). `better=None` marks a context metric (a load, a shape, a
setting): it is shown, never judged. `pinned` marks a throughput the offered load fixes in an
open-loop run (it tracks the request rate, not the library).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Literal

from stratacl.metrics import SIZE_BANDS, band_range

Better = Literal["higher", "lower"] | None

# Mechanism names the report groups metrics under (the accounting's categories, stratacl/accounting.py)
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


def _m(better: Better, unit: str, label: str, **kw: object) -> MetricInfo:
    return MetricInfo(better, unit, label, **kw)  # type: ignore[arg-type]


# A P99 over a short measurement window moves by a few per cent between seeds (ASSUMPTION: ±5 %,
# from repeated seeds of the default llm_infer window; run seeds to measure it for your window).
P99_TIE = 0.05

ITER = "iteration_time_s"

EXACT: dict[str, MetricInfo] = {
    # llm_infer, request mode
    "throughput_tok_per_s": _m("higher", "tok/s", "output throughput", pinned=True),
    "total_throughput_tok_per_s": _m("higher", "tok/s", "total throughput", pinned=True),
    "requests_per_s": _m("higher", "req/s", "completed requests", pinned=True),
    "saturation_throughput_tok_per_s": _m("higher", "tok/s", "saturation throughput (closed loop)"),
    "saturation_requests_per_s": _m("higher", "req/s", "saturation request rate (closed loop)"),
    "saturation_population": _m("higher", "requests", "closed-loop population (KV-bound)", mechanism=MEMORY),
    "saturation_mean_decode_batch_per_die": _m(None, "seq", "decode batch/die at saturation"),
    "saturation_kv_utilisation": _m(None, "fraction", "KV use at saturation"),
    "saturation_prefill_die_busy_fraction": _m(None, "fraction", "prefill die busy at saturation"),
    "slo_capacity_req_per_s": _m("higher", "req/s", "SLO capacity"),
    "slo_capacity_capped": _m(None, "flag", "SLO search capped"),
    "mean_decode_batch_per_die": _m(None, "seq", "decode batch/die"),
    "max_decode_batch_per_die": _m(None, "seq", "max decode batch/die"),
    "kv_utilisation_mean": _m(None, "fraction", "KV cache use"),
    "decode_step_s_mean": _m("lower", "s", "decode step"),
    "decode_exposed_comm_share": _m("lower", "fraction", "exposed comm share of a decode step", mechanism=EXPOSED),
    # utilisation and load (workload.py summarise, deployment.py load_metrics): context, not judged
    "prefill_die_busy_fraction": _m(None, "fraction", "prefill die busy (its own tokens)"),
    "decode_die_busy_fraction": _m(None, "fraction", "decode die stepping (time, not load)"),
    "decode_batch_fraction": _m(None, "fraction", "decode batch / TPOT-feasible batch"),
    "load_fraction": _m(None, "fraction", "served rate / layout's analytic capacity"),
    "offered_load_fraction": _m(None, "fraction", "offered rate / layout's analytic capacity"),
    "overloaded": _m(None, "flag", "overloaded (regime note)"),
    "offered_req_per_s": _m(None, "req/s", "offered rate (arrivals in the window)"),
    "served_fraction": _m(None, "fraction", "share of the arrival rate served (backlog floor)"),
    "prefill_served_fraction": _m(None, "fraction", "share of the prompt-token arrival rate prefilled"),
    "decode_served_fraction": _m(None, "fraction", "share of decode arrivals admitted"),
    "backlog_growth_req_per_s": _m(None, "req/s", "backlog growth (arrival rate not served)"),
    "prefill_load_fraction": _m(None, "fraction", "served rate / prefill capacity"),
    "decode_load_fraction": _m(None, "fraction", "served rate / decode capacity"),
    "prefill_capacity_req_per_s": _m("higher", "req/s", "prefill capacity (analytic)"),
    "decode_capacity_req_per_s": _m("higher", "req/s", "decode capacity at the TPOT SLO (analytic)"),
    "decode_slo_batch_per_die": _m("higher", "seq", "TPOT-feasible decode batch/die"),
    # llm_infer, deployment search (mode=search): DistServe goodput at each library's best layout
    "goodput_req_per_s": _m("higher", "req/s", "goodput at the best layout"),
    "goodput_per_die": _m("higher", "req/s/die", "goodput/die at the best layout"),
    "goodput_capped": _m(None, "flag", "goodput capped (top served rate met the SLO)"),
    "analytic_capacity_req_per_s": _m("higher", "req/s", "best analytic capacity"),
    "best_layout_analytic_req_per_s": _m(None, "req/s", "analytic capacity of the goodput-best layout"),
    "goodput_over_analytic": _m(None, "ratio", "served goodput / analytic capacity"),
    "fixed_layout_goodput_req_per_s": _m("higher", "req/s", "goodput at the configured layout"),
    "fixed_layout_goodput_per_die": _m("higher", "req/s/die", "goodput/die at the configured layout"),
    "fixed_layout_analytic_req_per_s": _m("higher", "req/s", "configured layout's analytic capacity"),
    "fixed_layout_capped": _m(None, "flag", "configured layout's goodput capped"),
    "slo_ttft_s": _m(None, "s", "TTFT SLO"),
    "slo_tpot_s": _m(None, "s", "TPOT SLO"),
    "candidates": _m(None, "layouts", "candidate layouts priced"),
    "iteration_traces_simulated": _m(None, "traces", "iteration traces simulated"),
    "weights_GiB_per_die": _m(None, "GiB", "weights/die"),
    "activations_GiB_per_die": _m(None, "GiB", "activations/die"),
    "comm_buffers_GiB_per_die": _m("lower", "GiB", "comm buffers/die"),
    "pool_GiB_per_die": _m("lower", "GiB", "registered pool/die"),
    "library_GiB_per_die": _m("lower", "GiB", "library memory/die", mechanism=MEMORY),
    "kv_cache_GiB_per_die": _m("higher", "GiB", "KV cache/die", mechanism=MEMORY),
    "reserved_GiB_per_die": _m(None, "GiB", "allocator reserved/die"),
    "fragmentation_GiB_per_die": _m("lower", "GiB", "fragmentation/die", mechanism=MEMORY),
    "startup_fragmentation_GiB_per_die": _m("lower", "GiB", "start-up fragmentation/die"),
    "expandable_segments": _m(None, "flag", "expandable segments on"),
    "remap_fraction": _m("lower", "fraction", "decode iterations remapping"),
    "prefill_remap_fraction": _m("lower", "fraction", "prefill iterations remapping"),
    "jit_hit_rate": _m("higher", "fraction", "JIT registration hit rate"),
    "prefill_jit_hit_rate": _m("higher", "fraction", "prefill JIT hit rate"),
    "register_ms_per_decode_iter": _m("lower", "ms", "registration per decode iteration"),
    "register_ms_per_prefill_iter": _m("lower", "ms", "registration per prefill iteration"),
    # llm_infer, fixed mode
    "decode_tok_per_s_per_npu": _m("higher", "tok/s", "decode throughput/NPU"),
    "decode_tpot_s": _m("lower", "s", "decode TPOT"),
    "decode_step_s": _m("lower", "s", "decode step"),
    "decode_exposed_comm_s": _m("lower", "s", "exposed comm per decode step", mechanism=EXPOSED, per="decode_step_s"),
    "prefill_tok_per_s_per_npu": _m("higher", "tok/s", "prefill throughput/NPU"),
    "prefill_iter_s": _m("lower", "s", "prefill iteration"),
    "prefill_exposed_comm_s": _m("lower", "s", "exposed comm per prefill iteration", mechanism=EXPOSED,
                                 per="prefill_iter_s"),
    "decode_weights_GB_per_die": _m(None, "GB", "decode weights/die"),
    "decode_kv_GB_per_die": _m("higher", "GB", "decode KV cache/die", mechanism=MEMORY),
    "prefill_weights_GB_per_die": _m(None, "GB", "prefill weights/die"),
    # training (llm_train, dlrm_train)
    "iteration_time_s": _m("lower", "s", "iteration time"),
    "iteration_time_s_first": _m("lower", "s", "first iteration"),
    "iteration_time_s_last": _m("lower", "s", "last iteration"),
    "compute_s": _m(None, "s", "compute"),
    "exposed_comm_s": _m("lower", "s", "exposed communication", mechanism=EXPOSED, per=ITER),
    "tokens_per_s": _m("higher", "tok/s", "training throughput"),
    "samples_per_s": _m("higher", "samples/s", "training throughput"),
    "comm_wire_s": _m("lower", "s", "comm wire time", mechanism=WIRE, per=ITER),
    "comm_copy_s": _m("lower", "s", "comm copies", mechanism=COPY, per=ITER),
    "comm_sync_s": _m("lower", "s", "comm sync", mechanism=SYNC, per=ITER),
    "comm_register_s": _m("lower", "s", "comm registration", mechanism=REGISTER, per=ITER),
    "comm_launch_s": _m("lower", "s", "comm launch", mechanism=LAUNCH, per=ITER),
    "peak_mem_GB_per_die": _m("lower", "GB", "peak memory/die", mechanism=MEMORY),
    "reserved_GB_per_die": _m(None, "GB", "allocator reserved/die"),
    "fragmentation_GB_per_die": _m("lower", "GB", "fragmentation/die", mechanism=MEMORY),
    "recompute_forced": _m("lower", "flag", "recompute forced by memory"),
    "exposed_cache_miss_s": _m("lower", "s", "exposed cache-miss fetch"),
    "cache_traffic_s": _m("lower", "s", "cache traffic"),
    "cache_hit_rate": _m("higher", "fraction", "cache hit rate"),
    "cache_hit_rate_min": _m("higher", "fraction", "min cache hit rate"),
    "cache_GB_per_die": _m("higher", "GB", "embedding cache/die", mechanism=MEMORY),
    "table_GB_per_die_max": _m(None, "GB", "tables/die (max)"),
    "library_memory_GB_per_die": _m("lower", "GB", "library memory/die", mechanism=MEMORY),
    "reserved_GB_per_die_max": _m(None, "GB", "allocator reserved/die (max)"),
    "fragmentation_GB_per_die_max": _m("lower", "GB", "fragmentation/die (max)", mechanism=MEMORY),
    "cache_miss_GB_per_iter_max_die": _m("lower", "GB", "cache misses/iteration (max die)"),
    "dense_allreduce_MB": _m(None, "MB", "dense all-reduce"),
    # interference
    "compute_alone_s": _m(None, "s", "compute alone"),
    "comm_alone_s": _m("lower", "s", "communication alone"),
    "back_to_back_s": _m("lower", "s", "compute then comm"),
    "overlapped_s": _m("lower", "s", "overlapped step"),
    "compute_overlapped_s": _m("lower", "s", "compute under overlap"),
    "overlap_s": _m(None, "s", "overlap window"),
    "compute_slowdown": _m("lower", "fraction", "compute slowdown"),
    "concurrent_compute_slowdown": _m("lower", "fraction", "concurrent compute slowdown"),
    "step_vs_back_to_back": _m("lower", "ratio", "step / back-to-back"),
    "comm_vector_core_s": _m("lower", "core·s", "vector cores held by comm"),
    "comm_hbm_GB_per_die": _m("lower", "GB", "comm HBM traffic/die", mechanism=COPY),
    "fwd_compute_slowdown": _m("lower", "fraction", "forward compute slowdown"),
    "bwd_compute_slowdown": _m("lower", "fraction", "backward compute slowdown"),
    # collectives
    "busbw_GBps_mean": _m("higher", "GB/s", "busbw, mean over sizes"),
    "time_s_total": _m("lower", "s", "operator time, summed over sizes"),
    # the collectives verdict: operator time per size band, geometric mean over the band's sizes
    **{f"{band}_op_time_s": _m("lower", "s", f"operator time, {band} ({band_range(band)}), geomean over sizes",
                               short=f"{band} ({band_range(band)})")
       for band, _, _ in SIZE_BANDS},
    # per-iteration accounting the report adds from a run's rows (stratacl/verdict.py accounting)
    **{f"{phase}_iter_time_s": _m("lower", "s", f"{phase} iteration") for phase in ("decode", "prefill")},
    **{f"{phase}_iter_{key}": _m("lower", "s", f"{what} per {phase} iteration", mechanism=mech,
                                  per=f"{phase}_iter_time_s")
       for phase in ("decode", "prefill")
       for key, what, mech in (("exposed_comm_s", "exposed comm", EXPOSED), ("copy_s", "copies", COPY),
                               ("register_s", "registration", REGISTER), ("launch_s", "launch", LAUNCH))},
    **{f"op_{key}": _m("lower", "s", f"operator {key[:-2]}, summed over sizes", mechanism=mech, per="time_s_total")
       for key, mech in (("wire_s", WIRE), ("copy_s", COPY), ("sync_s", SYNC), ("register_s", REGISTER),
                         ("launch_s", LAUNCH))},
}

BANDS = "|".join(band for band, _, _ in SIZE_BANDS)
BAND_PART = re.compile(rf"^(\w+)_({BANDS})_op_time_s$")  # one collective's operator time in a band

PATTERNS: list[tuple[re.Pattern[str], MetricInfo]] = [
    (re.compile(r"_p\d+_s$"), _m("lower", "s", "", tie=P99_TIE)),  # latency percentiles
    (re.compile(r"_busbw_GBps(_mean|_peak)?$"), _m("higher", "GB/s", "")),
    (re.compile(r"(^|_)time_us$"), _m("lower", "µs", "")),
    (re.compile(r"_time_s(_total)?$"), _m("lower", "s", "")),
    (re.compile(r"_tok_per_s"), _m("higher", "tok/s", "")),
    (re.compile(r"_GBps"), _m("higher", "GB/s", "")),
    # a rate is not a time: an offered rate or a search ceiling is context, a capacity says so by name
    (re.compile(r"_req_per_s$"), _m(None, "req/s", "")),
    (re.compile(r"_per_s$"), _m(None, "1/s", "")),
    (re.compile(r"(_s|_s_mean)$"), _m("lower", "s", "")),
    (re.compile(r"_Gi?B(_per_die)?$"), _m(None, "GB", "")),
]

UNKNOWN = MetricInfo(None, "", "")

# The metrics a verdict leads with, per workload, in order: the first present one is the lead.
# llm_infer: a deployment search (mode=search) leads with goodput per die at each library's best
# layout; at a fixed request rate with tail latency and closed-loop saturation, not the
# output throughput (the offered load pins it).
HEADLINES: dict[str, tuple[str, ...]] = {
    "llm_infer": ("goodput_per_die", "fixed_layout_goodput_per_die", "tpot_p99_s", "e2e_p99_s",
                  "saturation_throughput_tok_per_s", "slo_capacity_req_per_s",
                  "ttft_p99_s", "decode_tok_per_s_per_npu", "decode_tpot_s", "prefill_tok_per_s_per_npu"),
    "collectives": tuple(f"{band}_op_time_s" for band, _, _ in SIZE_BANDS),
    "moe": ("dispatch_ht_time_us", "combine_ht_time_us", "dispatch_ll_time_us", "combine_ll_time_us"),
    "llm_train": ("iteration_time_s", "iteration_time_s_last"),
    "dlrm_train": ("iteration_time_s",),
    "interference": ("overlapped_s",),
}
DEFAULT_HEADLINES = ("iteration_time_s", "time_s", "makespan_s", "time_s_total")

# Metrics a verdict shows beside its headlines, never judged: what explains or qualifies them
# (interference: how much the compute itself slowed under the overlap; collectives: the
# whole-sweep aggregates, which hide the size regimes the bands separate).
HEADLINE_CONTEXT: dict[str, tuple[str, ...]] = {
    "collectives": ("time_s_total", "busbw_GBps_mean"),
    "interference": ("concurrent_compute_slowdown", "compute_slowdown", "fwd_compute_slowdown",
                     "bwd_compute_slowdown"),
}


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
    found = EXACT.get(metric)
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


def headlines(workload: str, available: set[str] | list[str]) -> list[str]:
    """The workload's headline metrics present in `available`, lead first."""
    names = HEADLINES.get(workload, DEFAULT_HEADLINES)
    return [m for m in names if m in available]


def parts(metric: str, available: set[str] | list[str]) -> list[str]:
    """The metrics whose judgements decide a headline's outcome (a size band: each collective's
    operator time in it), in `available`'s order; [] for a headline judged on its own value."""
    m = re.fullmatch(rf"({BANDS})_op_time_s", metric)
    if not m:
        return []
    return [a for a in available if (p := BAND_PART.fullmatch(a)) and p.group(2) == m.group(1)]


# Flags (metric = 1) under which a workload's headlines do not mean what they say on their own: the
# verdict names the libraries that raise one and why.
CAVEATS: dict[str, dict[str, str]] = {
    "llm_infer": {"overloaded": "overloaded (regime note): the queue grows, so latency P99s grow with "
                                "the run's length, not only with the library; "
                                "compare at a rate both serve (workload.requests.rate below both capacities, "
                                "or +experiment=deployment_search)"},
}


def caveats(workload: str) -> dict[str, str]:
    """The workload's caveat flags and what each means for its verdict."""
    return CAVEATS.get(workload, {})


def context(workload: str, available: set[str] | list[str]) -> list[str]:
    """The workload's context metrics present in `available`."""
    return [m for m in HEADLINE_CONTEXT.get(workload, ()) if m in available]


def short(metric: str) -> str:
    """What a verdict line calls the metric."""
    i = info(metric)
    return i.short or i.label
