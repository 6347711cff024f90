"""Embedding tables from the config: Criteo-like cardinalities scaled to a total size."""

from __future__ import annotations

from dataclasses import dataclass

from stratacl.errors import ConfigError
from stratacl.schemas.dlrm_train import DlrmTrainConfig

TiB = 2**40


@dataclass(frozen=True)
class Table:
    index: int
    rows: int
    dim: int
    pooling: int  # lookups per sample (1 = one-hot)
    col_bytes: int  # bytes of one weight value
    state_bytes: int  # row-wise optimizer state per row (kept per shard, also per column shard)

    def row_bytes(self, width: int | None = None) -> int:
        return (self.dim if width is None else width) * self.col_bytes + self.state_bytes

    @property
    def bytes(self) -> float:
        return float(self.rows) * self.row_bytes()


def make_tables(cfg: DlrmTrainConfig) -> list[Table]:
    """One table per sparse feature; all cardinalities scaled by one factor so the weights total
    `total_table_TiB` (keeps Criteo's shape: a few huge tables and many small ones)."""
    rows = [int(r) for r in cfg.rows_per_feature]
    if not rows or min(rows) < 1:
        raise ConfigError("workload.rows_per_feature", f"need ≥ 1 positive cardinality, got {rows[:4]}")
    pool = [int(p) for p in cfg.pooling_factors]
    if len(pool) == 1:
        pool = pool * len(rows)
    if len(pool) != len(rows) or min(pool) < 1:
        raise ConfigError("workload.pooling_factors", f"{len(pool)} values for {len(rows)} features",
                          "give one value, or one positive value per feature")
    if cfg.embedding_dim < 1 or cfg.table_dtype_bytes < 1:
        raise ConfigError("workload.embedding_dim", "embedding_dim and table_dtype_bytes must be ≥ 1")
    if cfg.bottom_mlp[-1] != cfg.embedding_dim:
        raise ConfigError("workload.bottom_mlp", f"last bottom layer {cfg.bottom_mlp[-1]} ≠ embedding_dim "
                          f"{cfg.embedding_dim}", "the dot interaction needs them equal")
    if cfg.total_table_TiB <= 0:
        raise ConfigError("workload.total_table_TiB", f"must be positive, got {cfg.total_table_TiB}")
    weight_row = cfg.embedding_dim * cfg.table_dtype_bytes
    scale = cfg.total_table_TiB * TiB / (sum(rows) * weight_row)
    return [Table(i, max(1, round(r * scale)), cfg.embedding_dim, p, cfg.table_dtype_bytes,
                  cfg.optimizer_state_bytes_per_row)
            for i, (r, p) in enumerate(zip(rows, pool, strict=True))]
