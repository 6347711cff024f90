"""Schema of `workload=moe`: MoE dispatch/combine operator benchmark (conf/workload/moe.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from stratacl.vocab import MoeMode  # re-exported: ht runs tokens_ht per rank, ll tokens_ll
from stratacl.workload_config import WorkloadConfig, knob


class ExpertSkew(StrEnum):
    """Expert popularity (workloads/routing.py)."""

    uniform = "uniform"
    zipf = "zipf"  # Zipf over experts with exponent zipf_s
    histogram = "histogram"  # one weight per expert in `histogram`


@dataclass
class MoeConfig(WorkloadConfig):
    name: str = "moe"
    ep: int = knob(32, ge=1)  # expert-parallel ranks
    modes: list[MoeMode] = field(default_factory=lambda: [MoeMode.ht, MoeMode.ll])
    tokens_ht: int = knob(4096, ge=1)  # tokens per rank in high-throughput mode
    tokens_ll: int = knob(128, ge=1)  # tokens per rank in low-latency mode
    hidden: int = knob(7168, ge=1)
    experts: int = knob(256, ge=1)
    top_k: int = knob(8, ge=1)
    dispatch_bytes_per_token: int = knob(7680, ge=1)  # INT8 hidden + FP32 scales
    combine_bytes_per_token: int = knob(14336, ge=1)  # BF16 hidden
    # node-limited routing (DeepSeek-V3's n_group / topk_group; workloads/common/routing.py):
    # experts in n_group contiguous groups, each token's top_k inside topk_group of them. 0 = off
    n_group: int = knob(0, ge=0)
    topk_group: int = knob(0, ge=0)
    skew: ExpertSkew = ExpertSkew.uniform
    zipf_s: float = knob(1.0, ge=0)  # Zipf exponent over experts (skew=zipf)
    histogram: list[float] = knob(factory=list, ge=0)  # per-expert weights (skew=histogram)
    iters: int = knob(4, ge=1)  # measured iterations, each with a fresh routing sample
    warmup: int = knob(4, ge=0)  # iterations before measuring (registration, first-use costs)

