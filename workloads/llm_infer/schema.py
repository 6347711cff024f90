"""Schema of `workload=llm_infer`: disaggregated MoE serving (conf/workload/llm_infer.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from stratacl.errors import ConfigError
from stratacl.workload_config import WorkloadConfig, knob
from workloads.common.expert_load import ExpertLoadConfig
from workloads.common.model_schema import (  # ModelRef re-exported: the shared model reference
    ModelRef,
    QuantPreset,
)
from workloads.llm_infer.search_schema import SearchConfig
from workloads.moe.schema import ExpertSkew


class Arrival(StrEnum):
    """Request arrival process (workloads/llm_infer/requests.py)."""

    poisson = "poisson"
    gamma = "gamma"  # renewal process with gamma gaps: CV² = burstiness
    csv = "csv"  # replay a user's request table (requests.csv)
    trace = "trace"  # a bundled public trace (requests.trace), time-scaled or as recorded


class PublicTrace(StrEnum):
    """Bundled request traces (workloads/llm_infer/traces/README.md: provenance and licences)."""

    azure_conv = "azure_conv"  # Azure LLM inference 2023, conversation: short prompts
    azure_code = "azure_code"  # Azure LLM inference 2023, coding
    mooncake_conv = "mooncake_conv"  # Kimi (Mooncake, FAST 2025): long context, mean 12K prompt tokens


class TraceTiming(StrEnum):
    scaled = "scaled"  # arrival times scaled so the trace's mean rate equals requests.rate
    recorded = "recorded"  # arrival times as recorded (requests.rate unused)


class CsvWindow(StrEnum):
    """The measured window of a user's request table (arrival=csv); it starts at warmup_s."""

    table = "table"  # to the table's last arrival: every row is served and measured after the warm-up
    duration = "duration"  # to requests.duration_s: rows arriving from duration_s on are not served


class LengthDist(StrEnum):
    """Distribution of prompt / output lengths, clipped to [min, max]."""

    fixed = "fixed"
    uniform = "uniform"
    lognormal = "lognormal"


# Expert popularity of the router (workloads/common/routing.py): the moe workload's skews but a
# per-expert histogram
RouterSkew = StrEnum("RouterSkew", {m.name: m.value for m in ExpertSkew if m != ExpertSkew.histogram})


@dataclass
class RequestsConfig:
    arrival: Arrival = Arrival.trace
    rate: float = knob(15.0, gt=0)  # requests/s
    burstiness: float = knob(1.0, gt=0)  # gamma shape⁻¹: 1 = Poisson, > 1 burstier
    csv: str = ""  # arrival_s,input_tokens,output_tokens (arrival=csv; README "Your own requests")
    csv_window: CsvWindow = CsvWindow.table  # arrival=csv: measure to the table's last arrival, or to duration_s
    trace: PublicTrace = PublicTrace.mooncake_conv  # arrival=trace: which bundled trace
    trace_timing: TraceTiming = TraceTiming.scaled  # arrival=trace: scale to `rate`, or as recorded
    duration_s: float = knob(60.0, gt=0)  # arrivals are generated over this window
    input_dist: LengthDist = LengthDist.lognormal
    input_mean: int = knob(2048, ge=1)
    input_min: int = knob(128, ge=1)
    input_max: int = knob(8192, ge=1)
    input_sigma: float = knob(0.6, ge=0)  # lognormal σ
    output_dist: LengthDist = LengthDist.lognormal
    output_mean: int = knob(512, ge=1)
    output_min: int = knob(16, ge=1)
    output_max: int = knob(2048, ge=1)
    output_sigma: float = knob(0.6, ge=0)


class ExpertPlacement(StrEnum):
    """How experts sit on EP dies (workloads/common/placement.py)."""

    contiguous = "contiguous"  # expert e on die e // (experts / ep); ep must divide the experts
    eplb = "eplb"  # EPLB-style: redundant replicas of hot experts, balanced packing, shared-expert replicas


@dataclass
class LayoutConfig:
    prefill_instances: int = knob(2, ge=1)
    prefill_dp: int = knob(32, ge=1)  # attention data parallel per prefill instance (= dies)
    prefill_ep: int = knob(32, ge=1)  # MoE expert parallel per prefill instance
    decode_instances: int = knob(8, ge=0)  # 0 with total_dies: the dies the prefill instances leave
    decode_dp: int = knob(16, ge=1)
    decode_ep: int = knob(16, ge=1)
    total_dies: int = knob(0, ge=0)  # > 0: decode_instances = (total - prefill dies) / decode_dp
    expert_placement: ExpertPlacement = ExpertPlacement.contiguous
    # slots per die = (routed + redundant + shared replicas) / EP (eplb placement only)
    prefill_redundant_experts: int = knob(0, ge=0)  # extra replicas of the hottest experts
    prefill_shared_expert_replicas: int = knob(0, ge=0)  # dies serving the shared expert (0 = every die, locally)
    decode_redundant_experts: int = knob(0, ge=0)
    decode_shared_expert_replicas: int = knob(0, ge=0)


class StreamLayout(StrEnum):
    """How a decode die's cores are split between the streams (workloads/common/kernels.py)."""

    none = "none"  # SGLang-style TBO: compute + communication stream, every kernel may use the die
    # CloudMatrix-Infer (2506.12708 §4.2.3): attention-path / MoE-path streams of the two
    # micro-batches, 16 AIC + 32 AIV vs 8 AIC + 16 AIV
    cloudmatrix_tbo = "cloudmatrix_tbo"
    # the fabric's own: cloudmatrix_tbo on the die it was made for (24 AIC + 48 AIV), none elsewhere
    auto = "auto"


@dataclass
class SchedulerConfig:
    prefill_token_budget: int = knob(8192, ge=1)  # tokens per die per prefill iteration (chunked prefill)
    decode_max_batch: int = knob(0, ge=0)  # sequences per die (0 = limited by KV-cache memory only)
    tbo: bool = True  # two-batch overlap in prefill and decode
    tbo_min_tokens: int = knob(64, ge=0)  # per die: below this one micro-batch (splitting would re-read weights)
    mtp: bool = True  # multi-token prediction (one draft token per step)
    # streams and core split of a TBO decode step (two micro-batches); prefill and single-batch
    # decode always run the SGLang-style streams with no split
    decode_stream_layout: StreamLayout = StreamLayout.auto
    mtp_acceptance: float = knob(0.85, ge=0, le=1)  # DeepSeek-V3 report §5.4.3: 85-90 % second-token acceptance
    # decode steps run as captured graphs, as CloudMatrix-Infer runs them (2506.12708 §4.2.4): each
    # step pays the die's graph launch (REFERENCE §2: 0.6-0.8 ms), once more per host-synchronising
    # MoE operator, which splits the graph; false: eager decode (launches not modelled). Prefill is eager
    decode_graph_capture: bool = True
    # tokens per die one fused MoE dispatch may carry (the operator's maxBs); sizes the MC2 windows
    # of a buffer-centric library and caps the decode batch (CANN: Bs <= 512 on Atlas A3)
    moe_dispatch_max_tokens: int = knob(512, ge=1)


@dataclass
class AllocatorSettings:
    """The framework's setting of PyTorch's device allocator (a library may force it off)."""

    expandable_segments: bool = True  # PYTORCH_NPU_ALLOC_CONF=expandable_segments:True
    # share of HBM the serving engine plans for (weights, library, profiled activations, KV cache);
    # the rest is headroom for activations beyond the profiling forward (vLLM gpu_memory_utilization)
    memory_utilization: float = knob(0.9, gt=0, le=1)


@dataclass
class CapacityConfig:
    """Capacity per library (workloads/llm_infer/capacity.py)."""

    saturation: bool = True  # closed-loop saturation throughput
    saturation_duration_s: float = knob(60.0, gt=0)  # closed-loop run length
    saturation_warmup_s: float = knob(20.0, ge=0)  # excluded from the closed-loop measurement
    slo_search: bool = False  # bisection on the rate for the SLO capacity (several serving runs)
    ttft_p99_slo_s: float = knob(30.0, gt=0)
    tpot_p99_slo_s: float = knob(0.05, gt=0)
    rate_step: float = knob(0.5, gt=0)  # resolution of the SLO-capacity search (req/s)
    rate_max: float = knob(64.0, gt=0)  # first ceiling of the search; doubled (3 times at most) while it is met


@dataclass
class PrefixCacheConfig:
    """Prefix reuse from the trace's block ids (workloads/llm_infer/prefix.py): an HBM tier per
    prefill instance, then the DRAM pool over the fabric (CloudMatrix-Infer's EMS)."""

    enabled: bool = True  # only traces with block ids (mooncake_conv) reuse; others ignore it
    pool: bool = True  # the DRAM tier (EMS): write-through of new blocks, fetches of pool hits
    # share of the KV space a prefill die's allocator model leaves (after one longest prompt in
    # flight) that holds cached blocks (1 = all of it, vLLM: cached blocks fill free KV blocks)
    hbm_share: float = knob(1.0, ge=0, le=1)
    # ASSUMPTION: share of the deployment's nodes' host DRAM given to the pool (EMS pools the
    # supernode's DRAM; no public figure for its share); knob
    pool_dram_share: float = knob(0.5, ge=0, le=1)


class ServingMode(StrEnum):
    """What the serving workload measures."""

    serve = "serve"  # request-level serving: arrivals, scheduler, latency percentiles
    fixed = "fixed"  # one decode and one prefill iteration at fixed shapes (workloads/llm_infer/fixed.py)
    search = "search"  # goodput-optimal layouts per library under the SLO (workloads/llm_infer/search.py)


@dataclass
class FixedShapeConfig:
    """Shapes of `mode=fixed` (per die); `workload.requests` plays no part in fixed mode."""

    decode_batch_per_die: int = knob(48, ge=1)  # sequences per die in a decode step
    context: int = knob(4096, ge=1)  # cached tokens per decoding sequence
    prefill_tokens_per_die: int = knob(4096, ge=1)  # prompt tokens per die in a prefill iteration
    # tokens of one prompt (each prompt's attention spans it); prefill_tokens_per_die holds whole prompts
    prompt_tokens: int = knob(4096, ge=1)


# fewer expected arrivals in the measured window than this cannot give a latency percentile or a rate
MIN_MEASURED_ARRIVALS = 1


@dataclass
class LlmInferConfig(WorkloadConfig):
    name: str = "llm_infer"
    mode: ServingMode = ServingMode.serve
    fixed: FixedShapeConfig = field(default_factory=FixedShapeConfig)
    # served W8A8 as on Ascend (conf/workload/llm_infer.yaml; workloads/common/quant.py)
    model: ModelRef = field(default_factory=lambda: ModelRef(quant=QuantPreset.w8a8))
    layout: LayoutConfig = field(default_factory=LayoutConfig)
    requests: RequestsConfig = field(default_factory=RequestsConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    allocator: AllocatorSettings = field(default_factory=AllocatorSettings)
    capacity: CapacityConfig = field(default_factory=CapacityConfig)
    prefix_cache: PrefixCacheConfig = field(default_factory=PrefixCacheConfig)
    search: SearchConfig = field(default_factory=SearchConfig)  # mode=search only
    skew: RouterSkew = RouterSkew.zipf  # expert popularity
    # the router's Zipf exponent: > 0 sets it; 0 derives it from the measured load figure below
    # (workloads/common/expert_load.py: UltraEP 2606.04101); skew=uniform for no skew
    zipf_s: float = knob(0.0, ge=0)
    expert_load: ExpertLoadConfig = field(default_factory=ExpertLoadConfig)
    # dispatch: INT8 + scales = hidden·(1 + 512/7168) (REFERENCE §5)
    dispatch_scale_ratio: float = knob(0.0714, ge=0)
    warmup_s: float = knob(10.0, ge=0)  # requests arriving before this are excluded from the statistics
    cache_dir: str = "runs/.cache/modelcost"  # disk cache of measured model costs ("" = off)

    def check(self, prefix: str = "workload") -> None:
        """Measurement windows: statistics cover requests arriving in [warmup_s, duration_s), the
        closed loop [saturation_warmup_s, saturation_duration_s); an empty window is refused."""
        if self.capacity.saturation and self.capacity.saturation_warmup_s >= self.capacity.saturation_duration_s:
            c = self.capacity
            raise ConfigError(f"{prefix}.capacity.saturation_warmup_s",
                              f"{c.saturation_warmup_s:g} s is not shorter than saturation_duration_s "
                              f"({c.saturation_duration_s:g} s): the closed-loop window would be empty",
                              "a saturation_warmup_s below saturation_duration_s")
        if self.mode == ServingMode.search:
            self.search.check(f"{prefix}.search")

    def check_inputs(self, prefix: str = "workload") -> None:
        self.model.check(f"{prefix}.model")  # loads, and is of a family the cost model measures
        if self.mode == ServingMode.fixed:
            return  # fixed shapes: no arrivals, no window
        r = self.requests
        if r.csv and r.arrival != Arrival.csv:
            raise ConfigError(f"{prefix}.requests.csv", f"a request table is given but requests.arrival is "
                              f"'{r.arrival}', so the table would not be read",
                              f"add {prefix}.requests.arrival=csv (or drop {prefix}.requests.csv)")
        if r.arrival == Arrival.csv and r.csv_window == CsvWindow.table:
            from workloads.llm_infer.requests import (
                check_table,  # reads the table: before anything is written
            )

            check_table(r, self.warmup_s, prefix)
            return  # the table's own arrivals bound the window (duration_s is not read)
        if self.warmup_s >= r.duration_s:
            raise ConfigError(f"{prefix}.warmup_s",
                              f"{self.warmup_s:g} s is not shorter than requests.duration_s ({r.duration_s:g} s): "
                              "no request would arrive inside the measured window",
                              f"a warmup_s below {r.duration_s:g} s (or a longer {prefix}.requests.duration_s)")
        timed = r.arrival != Arrival.csv and not (r.arrival == Arrival.trace and r.trace_timing == TraceTiming.recorded)
        expected = r.rate * (r.duration_s - self.warmup_s)
        if timed and expected < MIN_MEASURED_ARRIVALS:
            raise ConfigError(f"{prefix}.requests.duration_s",
                              f"the measured window [{self.warmup_s:g}, {r.duration_s:g}) s at {r.rate:g} req/s "
                              f"expects {expected:.3g} arrivals, fewer than {MIN_MEASURED_ARRIVALS}",
                              f"a duration_s of at least {self.warmup_s + MIN_MEASURED_ARRIVALS / r.rate:.3g} s")
        if r.arrival == Arrival.csv:
            from workloads.llm_infer.requests import check_table

            check_table(r, self.warmup_s, prefix)

