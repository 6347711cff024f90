"""Per-iteration volumes of TorchRec's sparse data distribution, from the sharding plan.

Input distribution (KJT all-to-all): every rank sends each TW/CW shard owner the lengths and
indices of its local batch for that feature (a CW table's indices go to each of its shards);
for row-wise tables it sends every rank the full lengths vector and the indices that hash to that
rank's rows (multinomial, seeded). Output distribution: TW/CW owners send each rank its B pooled
rows of the shard's width (all-to-all; gradients come back transposed); row-wise tables
reduce-scatter the global batch's partial sums and all-gather their gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workloads.dlrm_train.schema import DlrmTrainConfig

from .cache import Segment
from .planner import Plan


@dataclass(frozen=True)
class IterationTraffic:
    lengths: np.ndarray  # W×W bytes, row = sender (input dist, lengths)
    indices: np.ndarray  # W×W bytes (input dist, values)
    pooled: np.ndarray  # W×W bytes, pooled embeddings forward (TW/CW); backward is its transpose
    rw_bytes: float  # nccl-tests size of the RW reduce-scatter (= RW all-gather): W·B·D·e·n_rw
    lookups: list[np.ndarray]  # per die: lookups per segment this iteration (order of `segments`)


def segments(plan: Plan, cfg: DlrmTrainConfig) -> list[list[Segment]]:
    """Per die, the shards it serves with their expected lookups per iteration."""
    w, b = plan.world, cfg.batch_per_worker
    out: list[list[Segment]] = []
    for d in range(w):
        segs = [Segment(s.rows, s.row_bytes, w * b * s.pooling) for s in plan.shards_of(d)]
        segs += [Segment(t.rows / w, t.row_bytes(), b * t.pooling) for t in plan.rw_tables]
        out.append(segs)
    return out


def pooled_matrix(plan: Plan, cfg: DlrmTrainConfig) -> np.ndarray:
    w = plan.world
    per_owner = np.zeros(w)
    for s in plan.shards:
        per_owner[s.owner] += cfg.batch_per_worker * s.width * cfg.comm_dtype_bytes
    return np.repeat(per_owner[:, None], w, axis=1)


def iteration_traffic(plan: Plan, cfg: DlrmTrainConfig, rng: np.random.Generator) -> IterationTraffic:
    w, b = plan.world, cfg.batch_per_worker
    to_owner_len = np.zeros(w)
    to_owner_idx = np.zeros(w)
    for s in plan.shards:
        to_owner_len[s.owner] += b * cfg.length_bytes
        to_owner_idx[s.owner] += b * s.pooling * cfg.index_bytes
    lengths = np.repeat(to_owner_len[None, :], w, axis=0) + len(plan.rw_tables) * b * cfg.length_bytes
    indices = np.repeat(to_owner_idx[None, :], w, axis=0)
    rw_counts = []
    for t in plan.rw_tables:  # rows hash uniformly to dies: each rank's B·L indices split W ways
        counts = rng.multinomial(b * t.pooling, np.full(w, 1.0 / w), size=w).astype(float)
        indices += counts * cfg.index_bytes
        rw_counts.append(counts.sum(axis=0))
    lookups = []
    for d in range(w):
        own = [w * b * s.pooling for s in plan.shards_of(d)]
        lookups.append(np.array(own + [c[d] for c in rw_counts], dtype=float))
    rw_bytes = float(w * b * cfg.embedding_dim * cfg.comm_dtype_bytes * len(plan.rw_tables))
    return IterationTraffic(lengths, indices, pooled_matrix(plan, cfg), rw_bytes, lookups)
