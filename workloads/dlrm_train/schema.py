"""Schema of `workload=dlrm_train` (conf/workload/dlrm_train.yaml extends it; values cite sources there)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from stratacl.workload_config import WorkloadConfig, knob

# Criteo Terabyte raw categorical cardinalities, 26 features (see conf/workload/dlrm_train.yaml).
CRITEO_TB_ROWS = [
    227605432, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 130229467, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 292775614, 40790948, 187188510, 590152, 12973, 108, 36,
]
# Criteo Kaggle cardinalities, 26 features: the data set of the skew figure (workloads/dlrm_train/access.py).
CRITEO_KAGGLE_ROWS = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992,
    5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
]


class Sharding(StrEnum):
    """TorchRec sharding types (workloads/dlrm_train/planner.py)."""

    auto = "auto"  # table-wise where a table fits one die, row-wise otherwise
    table_wise = "table_wise"
    row_wise = "row_wise"
    column_wise = "column_wise"


class CachePolicy(StrEnum):
    """Replacement policy of the HBM embedding cache (workloads/dlrm_train/cache.py)."""

    lru = "lru"  # FBGEMM's default CacheAlgorithm.LRU (Che's approximation)
    lfu = "lfu"  # ideal LFU: the hottest rows per byte


@dataclass
class DlrmTrainConfig(WorkloadConfig):
    """DLRM trained TorchRec-style: model-parallel embeddings, data-parallel dense part."""

    name: str = "dlrm_train"
    ranks: int = knob(128, ge=1)
    batch_per_worker: int = knob(1024, ge=1)
    iterations: int = knob(3, ge=1)  # simulated back to back; the first is reported but metrics use the rest
    # model
    dense_features: int = knob(13, ge=1)
    rows_per_feature: list[int] = knob(factory=lambda: list(CRITEO_TB_ROWS), ge=1)
    total_table_TiB: float = knob(7.0, gt=0)  # rows are scaled so the tables' weights total this
    embedding_dim: int = knob(128, ge=1)
    pooling_factors: list[int] = knob(factory=lambda: [1], ge=1)  # one value or one per feature
    bottom_mlp: list[int] = knob(factory=lambda: [512, 256, 128], ge=1)
    top_mlp: list[int] = knob(factory=lambda: [1024, 1024, 512, 256, 1], ge=1)
    # dtypes (bytes)
    table_dtype_bytes: int = knob(4, ge=1)
    optimizer_state_bytes_per_row: int = knob(4, ge=0)  # row-wise Adagrad: one fp32 per row
    compute_dtype_bytes: int = knob(2, ge=1)  # dense activations
    param_dtype_bytes: int = knob(4, ge=1)  # dense parameters and gradients (the all-reduce)
    dense_optimizer_states: int = knob(2, ge=0)  # Adam: two fp32 states per dense parameter
    comm_dtype_bytes: int = knob(4, ge=1)  # pooled embeddings and their gradients on the wire
    index_bytes: int = knob(8, ge=1)
    length_bytes: int = knob(4, ge=1)
    # sharding
    sharding: Sharding = Sharding.auto
    column_shards: int = knob(4, ge=1)  # column_wise: shards per table
    # memory and cache
    zipf_exponent: float = knob(0.0, ge=0)  # 0 = derived from the skew figure below (access.py)
    skew_top_fraction: float = knob(0.01, gt=0, lt=1)  # the hottest fraction of all rows ...
    skew_top_share: float = knob(0.92, gt=0, lt=1)  # ... gets this share of the lookups ...
    skew_rows: list[int] = knob(factory=lambda: list(CRITEO_KAGGLE_ROWS), ge=1)  # ... over these tables
    cache_policy: CachePolicy = CachePolicy.lru
    cache_GB_per_die: float = knob(0.0, ge=0)  # 0 = all HBM left after reserves; > 0 caps the cache
    runtime_reserve_GB: float = knob(2.0, ge=0)
    expandable_segments: bool = True  # PyTorch allocator setting (a pool library forces it off)
    host_dram_GB_per_die: float = knob(0.0, ge=0)  # 0 = the fabric's DRAM per die (fabric.host)
    prefetch_pipeline: bool = True  # TorchRec PrefetchTrainPipelineSparseDist (else inline in the TBE forward)
    # DDP gradient buckets
    ddp_first_bucket_MB: float = knob(1.0, gt=0)
    ddp_bucket_MB: float = knob(25.0, gt=0)

