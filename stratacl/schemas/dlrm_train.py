"""Schema of `workload=dlrm_train` (conf/workload/dlrm_train.yaml extends it; values cite sources there)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore

from stratacl.config import WorkloadConfig

# Criteo Terabyte raw categorical cardinalities, 26 features (see conf/workload/dlrm_train.yaml).
CRITEO_TB_ROWS = [
    227605432, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 130229467, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 292775614, 40790948, 187188510, 590152, 12973, 108, 36,
]


@dataclass
class DlrmTrainConfig(WorkloadConfig):
    """DLRM trained TorchRec-style: model-parallel embeddings, data-parallel dense part."""

    name: str = "dlrm_train"
    ranks: int = 128
    batch_per_worker: int = 1024
    iterations: int = 3  # simulated back to back; the first is reported but metrics use the rest
    # model
    dense_features: int = 13
    rows_per_feature: list[int] = field(default_factory=lambda: list(CRITEO_TB_ROWS))
    total_table_TiB: float = 7.0  # rows are scaled so the tables' weights total this
    embedding_dim: int = 128
    pooling_factors: list[int] = field(default_factory=lambda: [1])  # one value or one per feature
    bottom_mlp: list[int] = field(default_factory=lambda: [512, 256, 128])
    top_mlp: list[int] = field(default_factory=lambda: [1024, 1024, 512, 256, 1])
    # dtypes (bytes)
    table_dtype_bytes: int = 4
    optimizer_state_bytes_per_row: int = 4  # row-wise Adagrad: one fp32 per row
    compute_dtype_bytes: int = 2  # dense activations
    param_dtype_bytes: int = 4  # dense parameters and gradients (the all-reduce)
    dense_optimizer_states: int = 2  # Adam: two fp32 states per dense parameter
    comm_dtype_bytes: int = 4  # pooled embeddings and their gradients on the wire
    index_bytes: int = 8
    length_bytes: int = 4
    # sharding
    sharding: str = "auto"  # auto | table_wise | row_wise | column_wise
    column_shards: int = 4  # column_wise: shards per table
    # memory and cache
    zipf_exponent: float = 1.05
    cache_GB_per_die: float = 0.0  # 0 = all HBM left after reserves; > 0 caps the cache
    runtime_reserve_GB: float = 2.0
    host_dram_GB_per_die: float = 96.0
    # DDP gradient buckets
    ddp_first_bucket_MB: float = 1.0
    ddp_bucket_MB: float = 25.0


ConfigStore.instance().store(group="workload", name="dlrm_train_schema", node=DlrmTrainConfig)
