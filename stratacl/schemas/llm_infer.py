"""Schema of `workload=llm_infer`: disaggregated MoE serving (conf/workload/llm_infer.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore

from stratacl.config import WorkloadConfig
from stratacl.schemas.model import ModelRef  # re-exported: the shared model reference


@dataclass
class RequestsConfig:
    arrival: str = "poisson"  # poisson | gamma | csv
    rate: float = 10.0  # requests/s
    burstiness: float = 1.0  # gamma shape⁻¹: 1 = Poisson, > 1 burstier
    csv: str = ""  # arrival_s,input_tokens,output_tokens (arrival=csv)
    duration_s: float = 60.0  # arrivals are generated over this window
    input_dist: str = "lognormal"  # fixed | uniform | lognormal
    input_mean: int = 2048
    input_min: int = 128
    input_max: int = 8192
    input_sigma: float = 0.6  # lognormal σ
    output_dist: str = "lognormal"
    output_mean: int = 512
    output_min: int = 16
    output_max: int = 2048
    output_sigma: float = 0.6


@dataclass
class LayoutConfig:
    prefill_instances: int = 2
    prefill_dp: int = 32  # attention data parallel per prefill instance (= dies)
    prefill_ep: int = 32  # MoE expert parallel per prefill instance
    decode_instances: int = 8
    decode_dp: int = 16
    decode_ep: int = 16


@dataclass
class SchedulerConfig:
    prefill_token_budget: int = 8192  # tokens per die per prefill iteration (chunked prefill)
    decode_max_batch: int = 256  # sequences per die, before the KV-memory cap
    activation_reserve_tokens: int = 16384  # tokens per die whose activations stay reserved
    tbo: bool = True  # two-batch overlap in prefill and decode
    tbo_min_tokens: int = 64  # per die: below this one micro-batch (splitting would re-read weights)
    mtp: bool = True  # multi-token prediction (one draft token per step)
    mtp_acceptance: float = 0.85  # DeepSeek-V3 report §5.4.3: 85-90 % second-token acceptance


@dataclass
class LlmInferConfig(WorkloadConfig):
    name: str = "llm_infer"
    model: ModelRef = field(default_factory=ModelRef)
    layout: LayoutConfig = field(default_factory=LayoutConfig)
    requests: RequestsConfig = field(default_factory=RequestsConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    skew: str = "zipf"  # expert popularity: uniform | zipf
    zipf_s: float = 0.6  # mild routing skew of a trained router (ASSUMPTION, knob)
    dispatch_scale_ratio: float = 0.0714  # dispatch: INT8 + scales = hidden·(1 + 512/7168) (REFERENCE §5)
    remap_fraction: float = 0.04  # iterations whose MoE buffers outgrow their mapping (StrataCL §4.1: < 4 %)
    saturation_rate: float = 0.0  # > 0: also run at this rate and report saturation throughput
    warmup_s: float = 10.0  # requests arriving before this are excluded from the statistics
    cache_dir: str = "runs/.cache/modelcost"  # disk cache of measured model costs ("" = off)


ConfigStore.instance().store(group="workload", name="llm_infer_schema", node=LlmInferConfig)
