"""`run(ctx)`: plan once, then per library size the cache, build the trace and replay it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from stratacl.errors import ConfigError
from stratacl.limits import RunSize
from stratacl.machine.fabric import Fabric
from stratacl.memory import MemoryPeak
from stratacl.workload_api import Library, RunContext, Span, WorkloadResult
from workloads.dlrm_train.schema import DlrmTrainConfig

from .access import zipf_exponent
from .allocation import die_ops
from .analysis import iteration_split
from .builder import BuiltTrace, build_trace
from .cache import CacheModel, Segment
from .memory import DieBudget, die_budget
from .model import DenseCosts, dense_costs
from .planner import Plan, plan
from .tables import Table, make_tables
from .traffic import IterationTraffic, iteration_traffic, segments

COMMUNICATORS = 1  # TorchRec's sharding env and DDP share the default process group ("dp")


@dataclass
class Setup:
    """Everything that does not depend on the library."""

    cfg: DlrmTrainConfig
    tables: list[Table]
    dense: DenseCosts
    plan: Plan
    traffic: list[IterationTraffic]
    segments: list[list[Segment]]
    work_bytes: np.ndarray


@dataclass(frozen=True, slots=True)
class ShardCache:
    """A die's shard set and its cache size: what its cache model depends on."""

    segments: tuple[Segment, ...]
    cache_bytes: float


@dataclass
class LibraryRun:
    memory: DieBudget
    hit_rate: np.ndarray  # per die, lookup-weighted
    built: BuiltTrace


def estimate(cfg: DlrmTrainConfig) -> RunSize:
    """One trace of all iterations; per iteration a forward and a backward op per MLP stage, the
    input/embedding all-to-alls, cache fetches and write-backs and the DDP buckets (an upper bound:
    2·stages + 8; the default model gives 21)."""
    per_iter = 2 * (len(cfg.bottom_mlp) + len(cfg.top_mlp)) + 8
    return RunSize(trace_ops=per_iter * cfg.iterations, replayed_ops=per_iter * cfg.iterations)


def _check(cfg: DlrmTrainConfig, fabric: Fabric) -> None:
    fabric.check_ranks(cfg.ranks, "workload.ranks")
    if cfg.ranks < 2 or cfg.ranks % (2 * fabric.dies_per_npu):
        raise ConfigError("workload.ranks", f"{cfg.ranks} is not a multiple of two NPUs "
                          f"({2 * fabric.dies_per_npu} dies)", "use e.g. 16, 32, 64 or 128")
    zipf_exponent(cfg)  # a skew figure out of reach fails here, before any replay


def _work_bytes(dense: DenseCosts, tf: IterationTraffic, world: int) -> np.ndarray:
    """Activations plus the send and receive buffers of one iteration's collectives, per die."""
    bufs = np.zeros(world)
    for m in (tf.lengths, tf.indices, tf.pooled, tf.pooled.T):
        bufs += m.sum(axis=1) + m.sum(axis=0)
    bufs += 2 * (tf.rw_bytes + tf.rw_bytes / world)
    return dense.activation_bytes + bufs


def prepare(cfg: DlrmTrainConfig, fabric: Fabric, seed: int) -> Setup:
    _check(cfg, fabric)
    tables = make_tables(cfg)
    dense = dense_costs(cfg.dense_features, len(tables), cfg.embedding_dim, tuple(cfg.bottom_mlp),
                        tuple(cfg.top_mlp), cfg.batch_per_worker, cfg.compute_dtype_bytes)
    # a die's shards live in its HBM, or in host DRAM behind an HBM cache (UVM caching)
    dram = cfg.host_dram_GB_per_die * 1e9 or fabric.host_dram_bytes_per_die
    capacity = max(dram, fabric.hbm_bytes - cfg.runtime_reserve_GB * 1e9)
    p = plan(tables, cfg.ranks, cfg.sharding, cfg.column_shards, capacity)
    rng = np.random.default_rng([seed, 0])
    traffic = [iteration_traffic(p, cfg, rng) for _ in range(cfg.iterations)]
    return Setup(cfg, tables, dense, p, traffic, segments(p, cfg), _work_bytes(dense, traffic[0], cfg.ranks))


def allocator_peaks(setup: Setup, library: Library, capacity: float) -> tuple[np.ndarray, np.ndarray]:
    """Per die, the allocator's reserved peak and fragmentation for the dense state and the run's
    iteration buffers (allocation.py); dies with the same buffers share one run."""
    cfg = setup.cfg
    reserved, frag = np.zeros(cfg.ranks), np.zeros(cfg.ranks)
    memo: dict[tuple, MemoryPeak | None] = {}
    for d in range(cfg.ranks):
        ops = die_ops(cfg, setup.dense, setup.traffic, d)
        key = tuple(ops)
        if key not in memo:
            die = library.die_memory(max(capacity, 0.0) or 1.0, 0, expandable_segments=cfg.expandable_segments)
            memo[key] = die.peak(ops)
        peak = memo[key]
        if peak is None:
            raise ConfigError("workload.runtime_reserve_GB", f"die {d}: the dense model and the iteration's "
                              f"buffers do not fit next to the {library.name} library's "
                              f"{(library.fabric.hbm_bytes - capacity) / 1e9:.2f} GB of reserve and library memory",
                              "lower the reserve, the batch or library memory")
        reserved[d], frag[d] = peak.reserved, peak.fragmentation
    return reserved, frag


def library_run(setup: Setup, library: Library, seed: int) -> LibraryRun:
    """Cache size after the library's memory, hit rates, and this library's trace."""
    cfg = setup.cfg
    held = library.held_memory_bytes(communicators=COMMUNICATORS, context="training")
    capacity = library.fabric.hbm_bytes - cfg.runtime_reserve_GB * 1e9 - held
    reserved, frag = allocator_peaks(setup, library, capacity)
    mem = die_budget(cfg, library.fabric.hbm_bytes, setup.dense, setup.work_bytes,
                     setup.plan.bytes_per_die(), held, library.name, reserved, frag)
    s = zipf_exponent(cfg)
    rows, rate, models = [], np.ones(cfg.ranks), []
    memo: dict[ShardCache, CacheModel] = {}
    for d, segs in enumerate(setup.segments):
        cache = np.inf if mem.resident[d] else float(mem.cache_bytes[d])
        key = ShardCache(tuple(segs), cache)
        if key not in memo:  # many dies serve identical shard sets
            memo[key] = CacheModel(segs, cache, s, str(cfg.cache_policy))
        models.append(memo[key])
        rate[d] = memo[key].die_hit
        rows.append(np.array([g.row_bytes for g in segs], dtype=float))
    # each iteration's distinct missed rows per die and segment: Poisson around their expectation
    # (a sum of many independent rare row events), in iteration order from one seeded stream
    rng = np.random.default_rng([seed, 1])
    misses = [[rng.poisson(models[d].unique_misses(tf.lookups[d])).astype(float) for d in range(cfg.ranks)]
              for tf in setup.traffic]
    built = build_trace(cfg, setup.plan, setup.dense, setup.traffic, misses, rows)
    return LibraryRun(mem, rate, built)


def steady_span(iteration_of: list[int]) -> Span:
    """The steady iterations' summed time from a replay's op ends: from the first iteration's end to
    the last's (each iteration runs from the previous one's end, analysis.iteration_split), or the
    one iteration's end."""
    it = np.asarray(iteration_of)
    first, last = it == it.min(), it == it.max()

    def span(end: np.ndarray) -> float:
        return float(end[last].max()) - (float(end[first].max()) if it.max() > it.min() else 0.0)
    return span


def run(ctx: RunContext) -> WorkloadResult:
    cfg: DlrmTrainConfig = ctx.cfg.workload
    setup = prepare(cfg, ctx.fabric, ctx.seed)
    samples = cfg.ranks * cfg.batch_per_worker
    frames, metrics, timelines = [], {}, {}
    ctx.progress.phase("replay", total=len(ctx.libraries), unit="lib")
    for lib, model in ctx.libraries.items():
        lr = library_run(setup, model, ctx.seed)
        res = ctx.simulate(lr.built.trace, lib)
        split = iteration_split(res, lr.built.iteration_of, lr.built.role_of,
                                [op.name for op in lr.built.trace.ops])
        split.insert(0, "library", lib)
        split["cache_hit_rate"] = float(lr.hit_rate.mean())
        split["cache_miss_GB_max_die"] = [float(m.max()) / 1e9 for m in lr.built.miss_bytes]
        split["samples_per_s"] = samples / split["iteration_time_s"]
        frames.append(split)
        steady = split.iloc[1:] if len(split) > 1 else split  # pipeline warm from the 2nd on
        cf = ctx.counterfactual(lr.built.trace, lib, res, steady_span(lr.built.iteration_of))
        m = {k: float(steady[k].mean()) for k in ("iteration_time_s", "compute_s", "exposed_comm_s",
                                                  "exposed_cache_miss_s", "cache_traffic_s",
                                                  "cache_fetch_s", "cache_writeback_s")}
        m["samples_per_s"] = samples / m["iteration_time_s"]
        m |= {k: v / len(steady) for k, v in cf.metrics("iteration").items()}  # the steady mean's split
        m["cache_hit_rate"] = float(lr.hit_rate.mean())
        m["cache_hit_rate_min"] = float(lr.hit_rate.min())
        m["cache_GB_per_die"] = float(lr.memory.cache_bytes.mean()) / 1e9
        m["table_GB_per_die_max"] = float(lr.memory.table_bytes.max()) / 1e9
        m["library_memory_GB_per_die"] = lr.memory.library_bytes / 1e9
        m["reserved_GB_per_die_max"] = float(lr.memory.reserved_bytes.max()) / 1e9
        m["fragmentation_GB_per_die_max"] = float(lr.memory.fragmentation_bytes.max()) / 1e9
        m["cache_miss_GB_per_iter_max_die"] = float(np.mean([x.max() for x in lr.built.miss_bytes])) / 1e9
        m["dense_allreduce_MB"] = sum(lr.built.ddp_bucket_bytes) / 1e6
        metrics[lib] = m
        timelines[lib] = (lr.built.trace, res)
        ctx.progress(1)
    rows = pd.concat(frames, ignore_index=True)
    notes = [f"plan: {len(setup.plan.shards)} table/column-wise shards, row-wise tables "
             f"{[t.index for t in setup.plan.rw_tables]}; tables {sum(t.bytes for t in setup.tables) / 1e12:.2f} TB"]
    return WorkloadResult(rows=rows, metrics=metrics, timelines=timelines, notes=notes)
