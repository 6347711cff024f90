"""Embedding tables from the config: Criteo-like cardinalities scaled to a total size."""

from __future__ import annotations

from dataclasses import dataclass

from stratacl.errors import ConfigError
from workloads.dlrm_train.schema import DlrmTrainConfig

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
    if not rows:  # each cardinality's bound is the schema's
        raise ConfigError("workload.rows_per_feature", "empty", "give one positive cardinality per feature")
    pool = [int(p) for p in cfg.pooling_factors]
    if len(pool) == 1:
        pool = pool * len(rows)
    if len(pool) != len(rows):
        raise ConfigError("workload.pooling_factors", f"{len(pool)} values for {len(rows)} features",
                          "give one value, or one positive value per feature")
    if cfg.bottom_mlp[-1] != cfg.embedding_dim:
        raise ConfigError("workload.bottom_mlp", f"last bottom layer {cfg.bottom_mlp[-1]} ≠ embedding_dim "
                          f"{cfg.embedding_dim}", "the dot interaction needs them equal")
    weight_row = cfg.embedding_dim * cfg.table_dtype_bytes
    scale = cfg.total_table_TiB * TiB / (sum(rows) * weight_row)
    return [Table(i, max(1, round(r * scale)), cfg.embedding_dim, p, cfg.table_dtype_bytes,
                  cfg.optimizer_state_bytes_per_row)
            for i, (r, p) in enumerate(zip(rows, pool, strict=True))]
