"""Schema of `workload=moe`: MoE dispatch/combine operator benchmark (conf/workload/moe.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore

from stratacl.config import WorkloadConfig


@dataclass
class MoeConfig(WorkloadConfig):
    name: str = "moe"
    ep: int = 32  # expert-parallel ranks
    modes: list[str] = field(default_factory=lambda: ["ht", "ll"])  # high-throughput / low-latency
    tokens_ht: int = 4096  # tokens per rank in high-throughput mode
    tokens_ll: int = 128  # tokens per rank in low-latency mode
    hidden: int = 7168
    experts: int = 256
    top_k: int = 8
    dispatch_bytes_per_token: int = 7680  # INT8 hidden + FP32 scales
    combine_bytes_per_token: int = 14336  # BF16 hidden
    skew: str = "uniform"  # uniform | zipf | histogram
    zipf_s: float = 1.0  # Zipf exponent over experts (skew=zipf)
    histogram: list[float] = field(default_factory=list)  # per-expert weights (skew=histogram)
    iters: int = 4  # measured iterations, each with a fresh routing sample
    warmup: int = 1  # iterations before measuring (registration, first-use costs)


ConfigStore.instance().store(group="workload", name="moe_schema", node=MoeConfig)
