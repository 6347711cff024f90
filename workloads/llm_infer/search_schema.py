"""Schema of the deployment search (`workload.mode=search`, +experiment=deployment_search):
workloads/llm_infer/search.py. SLO sources: docs/sources.md "Serving SLOs"."""

from __future__ import annotations

from dataclasses import dataclass, field

from stratacl.errors import ConfigError
from stratacl.workload_config import knob

# SLOs per trace class (docs/sources.md "Serving SLOs"): TTFT from DistServe's application classes
# (arXiv 2401.09670 Table 1: chatbot 2.5 s with OPT-66B, summarisation / long context 15 s, code
# completion 0.125 s); TPOT 50 ms for every class, CloudMatrix-Infer's decode SLO on this hardware
# (arXiv 2506.12708 §5). `slo_class: auto` picks the trace's class.
SLO_CLASSES = {"chatbot": (2.5, 0.05), "code": (0.125, 0.05), "long_context": (15.0, 0.05)}
TRACE_CLASS = {"azure_conv": "chatbot", "azure_code": "code", "mooncake_conv": "long_context"}


@dataclass
class SearchConfig:
    die_budget: int = knob(192, ge=2)  # dies the deployment may use (≤ the fabric's)
    prefill_dp: list[int] = knob(factory=lambda: [16, 32, 64], ge=1)  # dies per prefill instance (DP = EP)
    decode_dp: list[int] = knob(factory=lambda: [8, 16, 32], ge=1)
    tbo: list[bool] = field(default_factory=lambda: [True, False])
    # with TBO only; auto = the fabric's own (scheduler.decode_stream_layout)
    stream_layout: list[str] = field(default_factory=lambda: ["auto", "none"])
    mtp: list[bool] = field(default_factory=lambda: [True, False])
    decode_max_batch: list[int] = knob(factory=lambda: [0, 32], ge=0)  # 0 = KV / dispatch cap only
    prefill_token_budget: list[int] = knob(factory=lambda: [4096, 8192, 16384], ge=1)
    # SLO: a class from SLO_CLASSES, `auto` (the trace's class; chatbot for generated arrivals) or
    # `custom` (ttft_s / tpot_s below)
    slo_class: str = "auto"
    ttft_s: float = knob(15.0, gt=0)  # slo_class=custom only
    tpot_s: float = knob(0.05, gt=0)
    attainment: float = knob(0.9, gt=0, le=1)  # DistServe's SLO attainment target (arXiv 2401.09670 §2)
    slo_scales: list[float] = knob(factory=lambda: [0.5, 1.0, 2.0, 4.0], gt=0)  # the SLO-scale view
    finalists: int = knob(2, ge=1)  # best layouts by analytic capacity checked by serving, per library
    # the goodput of a checked layout: bisection on the served rate, as DistServe's simulator finds a
    # placement's goodput (LLMServe/DistServe simdistserve/benchmarks/search_binary.py): the first rate
    # is start_fraction × the layout's analytic capacity, raised × grid_extend while it meets the SLO
    # (at most max_extend times: then capped), ÷ grid_extend while it misses, then bisected until the bracket
    # [meets, misses] is within rate_tolerance (relative)
    start_fraction: float = knob(0.9, gt=0)
    rate_tolerance: float = knob(0.05, gt=0)
    grid_extend: float = knob(1.25, gt=1)
    max_extend: int = knob(4, ge=0)  # beyond this the goodput is reported as capped
    # bisect each SLO scale's analytic best at that scale too (false: other scales are judged on the
    # rates served for scale 1 only — a lower bound on their goodput, `capped` where the top rate met)
    scale_checks: bool = True
    # a served rate counts only if the run keeps up with it: it serves at least this share of the
    # arrival rate — of prompt tokens in prefill, of requests in decode — read from the rise of the
    # backlog's floor from the window's first third to its last (llm_infer/stability.py; a burst at
    # the window's end does not move it, the two-ends count it replaced reads it as a shortfall).
    # A finite window hides a slow overload (a backlog
    # growing at ε of the rate adds ε·t of TTFT: a 15 s TTFT SLO misses only from t ≈ 15/ε s), and a
    # steady-state attainment of an overloaded system is 0 (ASSUMPTION: 0.95, a backlog growing at
    # under 5 % of the rate is taken as noise of a finite window; knob)
    min_served_fraction: float = knob(0.95, ge=0, le=1)
    # branch and bound over the finalists (best analytic capacity first): a finalist is not served when
    # its analytic capacity × the largest served-goodput / capacity ratio measured so far (at least 1)
    # × (1 + prune_margin) is below the best goodput already served — it cannot win while capacity
    # bounds goodput that way (`checks.parquet` records the ratios); false: serve every finalist
    prune: bool = True
    prune_margin: float = knob(0.05, ge=0)
    serve_check: bool = True  # false: the analytic search alone (capacities, no goodput; benchmarks/bench_search.py)
    check_default: bool = True  # also check the configured (fixed) layout: today's comparison
    # the configured layout is also served, for every library, at these multiples of the baseline's
    # goodput on it: P99 TTFT and TPOT at the same offered rates (the regime map's latency panels;
    # ASSUMPTION: the four loads around the goodput, a measurement choice; knob)
    fixed_loads: list[float] = knob(factory=lambda: [0.8, 0.9, 1.0, 1.1], gt=0, le=10)

    def slo(self, trace: str | None) -> tuple[str, float, float]:
        """(class, TTFT, TPOT) of the run's trace (`trace` None: generated arrivals)."""
        if self.slo_class == "custom":
            return "custom", self.ttft_s, self.tpot_s
        cls = TRACE_CLASS.get(trace or "", "chatbot") if self.slo_class == "auto" else self.slo_class
        if cls not in SLO_CLASSES:
            raise ConfigError("workload.search.slo_class", f"'{self.slo_class}' is not a class",
                              f"one of auto, custom, {', '.join(SLO_CLASSES)}")
        return (cls, *SLO_CLASSES[cls])

    def check(self, prefix: str = "workload.search") -> None:
        for name in ("prefill_dp", "decode_dp", "prefill_token_budget", "slo_scales"):
            vals = getattr(self, name)
            if not vals or any(v <= 0 for v in vals):
                raise ConfigError(f"{prefix}.{name}", f"{list(vals)}: needs positive values", "a non-empty list of positive values")
        if any(v < 0 for v in self.decode_max_batch):
            raise ConfigError(f"{prefix}.decode_max_batch", "negative batch cap", "0 (no cap) or a positive cap")
        bad = [s for s in self.stream_layout if s not in ("none", "cloudmatrix_tbo", "auto")]
        if bad:
            raise ConfigError(f"{prefix}.stream_layout", f"unknown layout {bad}", "none, cloudmatrix_tbo or auto")
        self.slo(None)
