"""One library's trace of `iterations` DLRM training iterations on W dies (TorchRec order).

Streams: `main` (compute), `sparse` (KJT input dist and pooled-embedding all-to-alls), `ddp`
(dense-gradient all-reduce buckets, overlapping backward) and, with the prefetch pipeline,
`cache` / `writeback` (the HBM cache's prefetch). The next batch's input distribution is issued as
TrainPipelineSparseDist.progress() issues it (torchrec/distributed/train_pipeline/
train_pipelines.py): its lengths all-to-all (start_sparse_data_dist, "the splits all_to_all") before
batch i's forward, its indices all-to-all (wait_sparse_data_dist) after batch i's forward, before
its backward; both on the one process group, so in issue order with batch i's all-to-alls.

The embedding tables live in host DRAM (their die's CPU, `fabric.host`) behind an HBM cache (UVM
caching; TorchRec "embedding offloading" = UVM caching + prefetching, torchrec v0.6.0 release
notes). A batch's distinct missed rows (TorchRec deduplicates its ids; cache.CacheModel) come from
DRAM as one host->device transfer per iteration
(`Trace.memcpy(peer="host")`: the die's UB port and its CPU's link, shared with everything else);
each inserted row evicts one, and every cached row is dirty (a row enters the cache for a lookup,
and each looked-up row is updated by the fused optimizer in that iteration's backward), so as
many bytes go back device->host. With `prefetch_pipeline` (PrefetchTrainPipelineSparseDist,
torchrec/distributed/train_pipeline/train_pipelines.py: "stage 3: prefetch - uses prefetch CUDA
stream" for batch i+1 while batch i runs forward/backward) fetch and write-back start as soon as
the batch's input distribution is done and only the lookup waits for them (the rows a prefetch
evicts are not those of the batch in flight: FBGEMM locks those, so they are already updated).
Without it the TBE forward prefetches inline: write-back
and fetch run on `main` in front of the lookup.
Every op spans all W ranks; uneven per-die work is a per-rank vector (the op ends with its
slowest rank).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from stratacl.trace import Trace
from workloads.common.cost import Cost
from workloads.common.kernels import DLRM_FUSED, add_cost
from workloads.dlrm_train.schema import DlrmTrainConfig

from .model import DenseCosts, embedding_cost
from .planner import Plan
from .traffic import IterationTraffic

FAMILY = "dp"
BUFFERS = ("kjt_lengths", "kjt_indices", "pooled_emb", "pooled_emb_grad", "rw_partial", "rw_grad")


@dataclass
class BuiltTrace:
    trace: Trace
    iteration_of: list[int] = field(default_factory=list)  # op -> iteration
    role_of: list[str] = field(default_factory=list)  # op -> compute | comm | cache
    miss_bytes: list[np.ndarray] = field(default_factory=list)  # per iteration, per die
    miss_rows: list[list[np.ndarray]] = field(default_factory=list)  # per iteration, per die: distinct rows per segment
    ddp_bucket_bytes: list[float] = field(default_factory=list)


def ddp_buckets(dense: DenseCosts, cfg: DlrmTrainConfig) -> list[tuple[float, bool]]:
    """DDP gradient buckets in reverse parameter order: (bytes, needs bottom-MLP backward)."""
    params = [(n, False) for n in reversed(dense.params_top)] + [(n, True) for n in reversed(dense.params_bottom)]
    caps = [cfg.ddp_first_bucket_MB * 2**20, cfg.ddp_bucket_MB * 2**20]
    buckets: list[tuple[float, bool]] = []
    cur, bottom = 0.0, False
    for n, is_bottom in params:
        cur += n * cfg.param_dtype_bytes
        bottom = bottom or is_bottom
        if cur >= caps[min(len(buckets), 1)]:
            buckets.append((cur, bottom))
            cur, bottom = 0.0, False
    if cur:
        buckets.append((cur, bottom))
    return buckets


def _die_embedding(plan: Plan, cfg: DlrmTrainConfig, lookups: list[np.ndarray]) -> np.ndarray:
    """Per die: [fwd flops, fwd bytes, bwd flops, bwd bytes] of its embedding bags."""
    w, b = plan.world, cfg.batch_per_worker
    out = np.zeros((w, 4))
    for d in range(w):
        widths = [s.width for s in plan.shards_of(d)] + [t.dim for t in plan.rw_tables]
        for lk, width in zip(lookups[d], widths, strict=True):
            c = embedding_cost(lk, width, w * b, cfg.table_dtype_bytes, cfg.optimizer_state_bytes_per_row,
                               cfg.index_bytes, cfg.comm_dtype_bytes)
            out[d] += (c.fwd_flops, c.fwd_bytes, c.bwd_flops, c.bwd_bytes)
    return out


class _Builder:
    def __init__(self, world: int) -> None:
        self.bt = BuiltTrace(Trace(world_size=world, meta={"workload": "dlrm_train"}))
        self.tr = self.bt.trace
        self.ranks = tuple(range(world))
        self.it = 0

    def _tag(self, op: int, role: str) -> int:
        self.bt.iteration_of.append(self.it)
        self.bt.role_of.append(role)
        assert len(self.bt.iteration_of) == op + 1
        return op

    def stage(self, name: str, cost: Cost, deps: list[int]) -> int:
        """A dense stage (MLP GEMMs and the interaction's bmm, nothing fused: `DLRM_FUSED`): its
        matmuls as a cube kernel, then its element-wise work as a vector kernel."""
        ops = add_cost(self.tr, self.ranks, name, cost, fused=DLRM_FUSED, name=name, stream="main", deps=deps)
        return [self._tag(op, "compute") for op in ops][-1]

    def vector(self, name: str, flops: object, hbm: object, deps: list[int]) -> int:
        """Work with no matmul (FBGEMM's table-batched embedding bags, the fused optimizer step):
        one vector kernel by the same rule (per-rank vectors: uneven shards)."""
        # per-rank FLOPs and bytes in different proportions: one vector FLOP scaled per rank, the
        # bytes as the kernel's per-rank extra traffic
        ops = add_cost(self.tr, self.ranks, name, Cost(0.0, 1.0, 0.0), fused=DLRM_FUSED, name=name, stream="main",
                       deps=deps, scale=np.asarray(flops, dtype=float), hbm_extra=np.asarray(hbm, dtype=float))
        return [self._tag(op, "compute") for op in ops][-1]

    def alltoallv(self, name: str, m: np.ndarray, buffer: str, deps: list[int]) -> int:
        return self._tag(self.tr.collective("alltoallv", FAMILY, m.sum(axis=1), peer_bytes=m.ravel(),
                                            stream="sparse", name=name, buffer=buffer, deps=deps), "comm")

    def coll(self, coll: str, name: str, nbytes: float, buffer: str, stream: str, deps: list[int]) -> int:
        return self._tag(self.tr.collective(coll, FAMILY, nbytes, stream=stream, name=name, buffer=buffer,
                                            deps=deps), "comm")

    def host(self, name: str, direction: str, nbytes: np.ndarray, stream: str, deps: list[int]) -> int:
        """Cache rows between each die's HBM and its CPU's DRAM (one op for all dies)."""
        return self._tag(self.tr.memcpy(self.ranks, nbytes, peer="host", direction=direction, stream=stream,
                                        name=name, deps=deps), "cache")


def _input_dist(b: _Builder, tf: IterationTraffic, it: int, parts: list[str] | None,
                lengths: int = -1) -> tuple[int, int]:
    """Batch `it`'s KJT all-to-alls on `sparse` (parts: "lengths", "indices"; [] = both)."""
    b.it = it
    if not parts or "lengths" in parts:
        lengths = b.alltoallv("input_dist_lengths", tf.lengths, "kjt_lengths", [])
    indices = -1
    if not parts or "indices" in parts:
        indices = b.alltoallv("input_dist_indices", tf.indices, "kjt_indices", [lengths])
    return lengths, indices


def _prefetch(b: _Builder, misses: np.ndarray, indices: int, it: int) -> list[int]:
    """Batch `it`'s prefetch stage: its missed rows in, as many evicted dirty rows out."""
    if not misses.any():
        return []
    b.it = it
    return [b.host("cache_writeback", "d2h", misses, "writeback", [indices]),
            b.host("cache_miss_fetch", "h2d", misses, "cache", [indices])]


def build_trace(cfg: DlrmTrainConfig, plan: Plan, dense: DenseCosts, traffic: list[IterationTraffic],
                miss_rows: list[list[np.ndarray]], row_bytes: list[np.ndarray]) -> BuiltTrace:
    """`miss_rows[i][d]`: distinct rows die d misses per segment in iteration i (the prefetch
    fetches each once, cache.CacheModel); `row_bytes[d]`: its segments' row bytes (weights +
    optimizer state, what UVM caching moves)."""
    w = plan.world
    b = _Builder(w)
    b.tr.add_family(FAMILY, [range(w)])
    for name in BUFFERS:
        b.tr.add_buffer(name, alloc_op=-1)  # allocated in warm-up; the caching allocator reuses them
    buckets = ddp_buckets(dense, cfg)
    b.bt.ddp_bucket_bytes = [nb for nb, _ in buckets]
    for k in range(len(buckets)):
        b.tr.add_buffer(f"ddp_bucket{k}", alloc_op=-1)
    prefetch = cfg.prefetch_pipeline
    for rows in miss_rows:
        b.bt.miss_rows.append(rows)
        b.bt.miss_bytes.append(np.array([float((rows[d] * row_bytes[d]).sum()) for d in range(w)]))
    n = len(traffic)
    # batch 0's input dist and prefetch fill the pipeline (TrainPipelineSparseDist.fill_pipeline)
    indices = [_input_dist(b, traffic[0], 0, [])[1]] + [0] * (n - 1)
    fetched = [_prefetch(b, b.bt.miss_bytes[0], indices[0], 0) if prefetch else []] + [[]] * (n - 1)
    for it, tf in enumerate(traffic):
        b.it = it
        emb = _die_embedding(plan, cfg, tf.lookups)
        misses = b.bt.miss_bytes[it]
        # progress(): start_sparse_data_dist(batch i+1) (the splits/lengths part) before forward(i)
        nxt = _input_dist(b, traffic[it + 1], it + 1, ["lengths"]) if it + 1 < n else None
        b.it = it
        ready = [indices[it], *fetched[it]]
        bottom = b.stage("bottom_mlp_fwd", dense.bottom_fwd, [])
        if misses.any() and not prefetch:  # inline in the TBE forward, in the lookup's path
            ready.append(b.host("cache_writeback", "d2h", misses, "main", [indices[it]]))
            ready.append(b.host("cache_miss_fetch", "h2d", misses, "main", [indices[it]]))
        lookup = b.vector("embedding_fwd", emb[:, 0], emb[:, 1], ready)
        pooled_ready = [bottom]
        if tf.pooled.any():
            pooled_ready.append(b.alltoallv("pooled_emb_fwd", tf.pooled, "pooled_emb", [lookup]))
        if tf.rw_bytes:
            pooled_ready.append(b.coll("reducescatter", "rw_pooled_fwd", tf.rw_bytes, "rw_partial",
                                       "sparse", [lookup]))
        if nxt is not None:  # wait_sparse_data_dist(batch i+1) after forward(i): the values part,
            indices[it + 1] = _input_dist(b, traffic[it + 1], it + 1, ["indices"], nxt[0])[1]
            if prefetch:  # then batch i+1's prefetch beside batch i's backward
                fetched[it + 1] = _prefetch(b, b.bt.miss_bytes[it + 1], indices[it + 1], it + 1)
            b.it = it
        top_f = b.stage("interaction_top_fwd", dense.top_fwd, pooled_ready)
        top_b = b.stage("interaction_top_bwd", dense.top_bwd, [top_f])
        bot_b = b.stage("bottom_mlp_bwd", dense.bottom_bwd, [top_b])
        grads = []
        if tf.pooled.any():
            grads.append(b.alltoallv("pooled_emb_bwd", tf.pooled.T, "pooled_emb_grad", [top_b]))
        if tf.rw_bytes:
            grads.append(b.coll("allgather", "rw_grad_bwd", tf.rw_bytes, "rw_grad", "sparse", [top_b]))
        reduced = [b.coll("allreduce", f"ddp_allreduce_{k}", nb, f"ddp_bucket{k}", "ddp",
                          [bot_b if needs_bottom else top_b])
                   for k, (nb, needs_bottom) in enumerate(buckets)]
        b.vector("embedding_bwd_update", emb[:, 2], emb[:, 3], grads)
        params = sum(dense.params_bottom) + sum(dense.params_top)
        states = cfg.dense_optimizer_states
        b.vector("dense_optimizer_step", params * (4 + 4 * states),
                 params * cfg.param_dtype_bytes * (3 + 2 * states), reduced)
    return b.bt
