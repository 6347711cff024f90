"""MoE dispatch/combine benchmark (REFERENCE §5): bus bandwidth in the DeepEP convention.

Per mode (HT: high-throughput, LL: low-latency) and iteration: the router GEMM (which allocates
the dispatch/combine buffers — their size follows the routing), the dispatch of token copies
(in HT mode the library first exchanges per-peer token counts, DeepEP's notify step, as part of
the dispatch) and the combine back.
Routing is sampled once per iteration with the run's seed, identically for every library
(node-limited when `n_group` is set). Every op reports its time and, each named in its column:
- `algbw_GBps` / `busbw_GBps` (nccl-tests all-to-all): S = bytes a rank sends (its own copies
  included), algbw = S / t, busbw = algbw · (n − 1) / n;
- `deepep_logical_GBps` (DeepEP's "logical bandwidth", tests/legacy/test_intranode.py and
  test_low_latency.py @dd758ca): bytes of token copies a rank receives ÷ t; HT counts one copy per
  destination rank of a token, LL one copy per selected expert;
- `deepep_rdma_GBps` (HT; DeepEP's internode convention, tests/legacy/test_internode.py
  @dd758ca: `num_rdma_token_sent` × bytes ÷ t): (token, destination node) pairs a rank sends, its
  own node included, × bytes per token ÷ t; nodes as the fabric places the ranks.
Averages are over ranks and measured iterations.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from stratacl.compare import metric_table
from stratacl.errors import ConfigError
from stratacl.limits import RunSize
from stratacl.trace import MoeShape, Trace
from stratacl.workload_api import RunContext, WorkloadResult
from workloads.common.routing import GroupLimit, copies_matrix, expert_weights, group_tokens, route
from workloads.moe.schema import MoeConfig, MoeMode

# (column, the bytes it counts, the factor on them given n ranks): each bandwidth convention once
_CONVENTIONS = (
    ("algbw_GBps", "send_bytes_mean", lambda n: 1.0),  # nccl-tests
    ("busbw_GBps", "send_bytes_mean", lambda n: (n - 1) / n),  # nccl-tests all-to-all
    ("deepep_logical_GBps", "recv_bytes_mean", lambda n: 1.0),  # DeepEP intranode / low-latency
    ("deepep_rdma_GBps", "rdma_bytes_mean", lambda n: 1.0),  # DeepEP internode (token, node) pairs
)


def estimate(cfg: MoeConfig) -> RunSize:
    """Per mode one trace of gate, dispatch and combine per iteration."""
    per_trace = 3 * (cfg.warmup + cfg.iters)
    return RunSize(trace_ops=per_trace, replayed_ops=per_trace * len(cfg.modes))


def build_trace(cfg: MoeConfig, mode: MoeMode, seed: int, node_ranks: int = 0) -> tuple[Trace, list[dict]]:
    """`node_ranks`: ranks per node of the fabric, for DeepEP's internode (token, node) convention."""
    tokens = cfg.tokens_ht if mode == MoeMode.ht else cfg.tokens_ll
    w = expert_weights(cfg.experts, cfg.skew, cfg.zipf_s, cfg.histogram, seed)
    rng = np.random.default_rng(seed)
    moe = MoeShape(float(cfg.dispatch_bytes_per_token), float(cfg.combine_bytes_per_token),
                   cfg.experts // cfg.ep, cfg.top_k)
    tr = Trace(world_size=cfg.ep, meta={"workload": "moe", "mode": mode}, moe=moe)
    tr.add_family("ep", [range(cfg.ep)])
    ranks = range(cfg.ep)
    points: list[dict] = []
    prev: list[int] = []
    for it in range(cfg.warmup + cfg.iters):
        choice = route(tokens, cfg.ep, cfg.experts, cfg.top_k, w, rng,
                       limit=GroupLimit(cfg.n_group, cfg.topk_group))
        copies = copies_matrix(choice, cfg.ep, cfg.experts, per_expert=(mode == MoeMode.ll))
        dest = choice // (cfg.experts // cfg.ep)
        gtok = group_tokens(dest, cfg.ep) if mode == MoeMode.ht else ()
        node_pairs = _node_pairs(dest, node_ranks, cfg.ep)
        gate = tr.compute(ranks, flops=2.0 * tokens * cfg.hidden * cfg.experts,
                          hbm_bytes=2.0 * cfg.hidden * (tokens + cfg.experts), name=f"gate{it}", deps=prev)
        # the router's output sizes the dispatch/combine buffers: the allocator maps more memory
        # for them at the gate when they grow
        tr.add_buffer("dispatch", alloc_op=gate)
        tr.add_buffer("combine", alloc_op=gate)
        dep = [gate]
        for kind, mat, per_copy in (("dispatch", copies, cfg.dispatch_bytes_per_token),
                                    ("combine", copies.T, cfg.combine_bytes_per_token)):
            peer = mat * per_copy
            op = tr.collective(kind, "ep", float(peer.sum(axis=1).max()), peer_bytes=peer,
                               buffer=kind, name=f"{kind}{it}", deps=dep, moe_mode=mode, group_tokens=gtok)
            points.append({"op": op, "mode": mode, "kind": kind, "iteration": it,
                           "measured": it >= cfg.warmup, "recv_bytes_mean": float(peer.sum(axis=0).mean()),
                           "recv_bytes_max": float(peer.sum(axis=0).max()),
                           "send_bytes_mean": float(peer.sum(axis=1).mean()),
                           "rdma_bytes_mean": node_pairs * per_copy})
            dep = [op]
        prev = dep
    return tr, points


def _node_pairs(dest: np.ndarray, node_ranks: int, ep: int) -> float:
    """(token, destination node) pairs per rank, averaged (DeepEP's `num_rdma_token_sent`: the
    rank's own node counts too); nodes of `node_ranks` consecutive ranks. NaN inside one node."""
    if not 0 < node_ranks < ep:
        return float("nan")
    g = node_ranks
    blk = np.sort(dest // g, axis=2)
    distinct = 1 + (np.diff(blk, axis=2) != 0).sum(axis=2)
    return float(distinct.sum() / ep)


def run(ctx: RunContext) -> WorkloadResult:
    cfg: MoeConfig = ctx.cfg.workload
    ctx.fabric.check_ranks(cfg.ep, "workload.ep")
    if not cfg.modes:  # the schema admits only MoeMode members, and bounds iters, warmup and tokens
        raise ConfigError("workload.modes", "empty", "use [ht], [ll] or [ht,ll]")
    GroupLimit(cfg.n_group, cfg.topk_group).check(cfg.experts, cfg.top_k)
    traces = {m: build_trace(cfg, m, ctx.seed, ctx.fabric.dies_per_node) for m in cfg.modes}
    frames: list[pd.DataFrame] = []
    metrics: dict[str, dict[str, float]] = {lib: {} for lib in ctx.libraries}
    timelines = {}
    ctx.progress.phase("replay", total=len(traces) * len(ctx.libraries), unit="replay")
    for mode, (trace, points) in traces.items():
        for lib, res in ctx.replay_all(trace, progress=True).items():
            ops = res.op_frame(trace).set_index("op")
            pts = pd.DataFrame(points)
            pts["time_s"] = [ops.at[p, "end_s"] - ops.at[p, "start_s"] for p in pts["op"]]
            pts["register_s"] = [ops.at[p, "register_s"] for p in pts["op"]]
            for col, nbytes, factor in _CONVENTIONS:
                if mode == MoeMode.ll and col == "deepep_rdma_GBps":
                    continue
                pts[col] = pts[nbytes] * factor(cfg.ep) / pts["time_s"] / 1e9
            pts["library"] = lib
            frames.append(pts)
            m = metrics[lib]
            for kind, sub in pts.groupby("kind", sort=False):
                steady = sub[sub["measured"]]
                m[f"{kind}_{mode}_time_us"] = float(steady["time_s"].mean() * 1e6)
                m[f"{kind}_{mode}_first_time_us"] = float(sub["time_s"].iloc[0] * 1e6)
                for col, *_ in _CONVENTIONS:
                    if col in steady:
                        m[f"{kind}_{mode}_{col}"] = float(steady[col].mean())
            timelines.setdefault(lib, (trace, res))
    rows = pd.concat(frames, ignore_index=True)
    keys = [k for k in metrics[ctx.baseline] if k.endswith(("time_us", "busbw_GBps", "_GBps")) and "first" not in k]
    table = metric_table(metrics, ctx.baseline, keys)
    return WorkloadResult(rows=rows, metrics=metrics, timelines=timelines, table=table)
