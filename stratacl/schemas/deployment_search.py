"""Schema of the deployment search (`workload.mode=search`, +experiment=deployment_search):
workloads/llm_infer/search.py. SLO sources: docs/sources.md "Serving SLOs"."""

from __future__ import annotations

from dataclasses import dataclass, field

from stratacl.errors import ConfigError
from stratacl.schemas.base import knob

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
    stream_layout: list[str] = field(default_factory=lambda: ["cloudmatrix_tbo", "none"])  # with TBO only
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
    # rates served in a check, as fractions of the layout's analytic capacity; a check whose top rate
    # still meets the SLO (at the loosest scale) adds rates × grid_extend until one misses
    rate_fractions: list[float] = knob(factory=lambda: [0.4, 0.6, 0.75, 0.9, 1.0], gt=0)
    grid_extend: float = knob(1.25, gt=1)
    max_extend: int = knob(6, ge=0)  # beyond this the goodput is reported as capped
    serve_check: bool = True  # false: the analytic search alone (capacities, no goodput; benchmarks/bench_search.py)
    check_default: bool = True  # also check the configured (fixed) layout: today's comparison

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
        for name in ("prefill_dp", "decode_dp", "prefill_token_budget", "slo_scales", "rate_fractions"):
            vals = getattr(self, name)
            if not vals or any(v <= 0 for v in vals):
                raise ConfigError(f"{prefix}.{name}", f"{list(vals)}: needs positive values", "a non-empty list of positive values")
        if any(v < 0 for v in self.decode_max_batch):
            raise ConfigError(f"{prefix}.decode_max_batch", "negative batch cap", "0 (no cap) or a positive cap")
        bad = [s for s in self.stream_layout if s not in ("none", "cloudmatrix_tbo")]
        if bad:
            raise ConfigError(f"{prefix}.stream_layout", f"unknown layout {bad}", "none or cloudmatrix_tbo")
        self.slo(None)
