"""MoE dispatch/combine benchmark (REFERENCE §5): bus bandwidth in the DeepEP convention.

Per mode (HT: high-throughput, LL: low-latency) and iteration: the router GEMM (which allocates
the dispatch/combine buffers — their size follows the routing), the dispatch of token copies
(in HT mode the library first exchanges per-peer token counts, DeepEP's notify step, as part of
the dispatch) and the combine back.
Routing is sampled once per iteration with the run's seed, identically for every library.
busbw (DeepEP "logical bandwidth") = bytes of token copies a rank receives ÷ kernel time, averaged
over ranks; HT counts one copy per destination rank of a token, LL one copy per selected expert.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from stratacl.compare import metric_table
from stratacl.errors import ConfigError
from stratacl.limits import RunSize
from stratacl.schemas.moe import MoeConfig, MoeMode
from stratacl.trace import Trace
from stratacl.workload_api import RunContext, WorkloadResult
from workloads.common.routing import copies_matrix, expert_weights, route


def estimate(cfg: MoeConfig) -> RunSize:
    """Per mode one trace of gate, dispatch and combine per iteration."""
    per_trace = 3 * (cfg.warmup + cfg.iters)
    return RunSize(trace_ops=per_trace, replayed_ops=per_trace * len(cfg.modes))


def build_trace(cfg: MoeConfig, mode: MoeMode, seed: int) -> tuple[Trace, list[dict]]:
    tokens = cfg.tokens_ht if mode == MoeMode.ht else cfg.tokens_ll
    w = expert_weights(cfg.experts, cfg.skew, cfg.zipf_s, cfg.histogram, seed)
    rng = np.random.default_rng(seed)
    # the MoE shape a library needs to lower dispatch/combine: bytes per token copy and experts per
    # rank (LL kernels write each peer's copies into one window per expert)
    moe = {"bytes_per_copy": {"dispatch": cfg.dispatch_bytes_per_token, "combine": cfg.combine_bytes_per_token},
           "experts_per_rank": cfg.experts // cfg.ep}
    tr = Trace(world_size=cfg.ep, meta={"workload": "moe", "mode": mode, "moe": moe})
    tr.add_family("ep", [range(cfg.ep)])
    ranks = range(cfg.ep)
    points: list[dict] = []
    prev: list[int] = []
    for it in range(cfg.warmup + cfg.iters):
        copies = copies_matrix(route(tokens, cfg.ep, cfg.experts, cfg.top_k, w, rng), cfg.ep,
                               cfg.experts, per_expert=(mode == MoeMode.ll))
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
                               buffer=kind, name=f"{kind}{it}", deps=dep, moe_mode=mode)
            points.append({"op": op, "mode": mode, "kind": kind, "iteration": it,
                           "measured": it >= cfg.warmup, "recv_bytes_mean": float(peer.sum(axis=0).mean()),
                           "recv_bytes_max": float(peer.sum(axis=0).max())})
            dep = [op]
        prev = dep
    return tr, points


def run(ctx: RunContext) -> WorkloadResult:
    cfg: MoeConfig = ctx.cfg.workload
    ctx.fabric.check_ranks(cfg.ep, "workload.ep")
    if not cfg.modes:  # the schema admits only MoeMode members, and bounds iters, warmup and tokens
        raise ConfigError("workload.modes", "empty", "use [ht], [ll] or [ht,ll]")
    traces = {m: build_trace(cfg, m, ctx.seed) for m in cfg.modes}
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
            pts["busbw_GBps"] = pts["recv_bytes_mean"] / pts["time_s"] / 1e9
            pts["library"] = lib
            frames.append(pts)
            m = metrics[lib]
            for kind, sub in pts.groupby("kind", sort=False):
                steady = sub[sub["measured"]]
                m[f"{kind}_{mode}_busbw_GBps"] = float((steady["recv_bytes_mean"] / steady["time_s"]).mean() / 1e9)
                m[f"{kind}_{mode}_time_us"] = float(steady["time_s"].mean() * 1e6)
                m[f"{kind}_{mode}_first_time_us"] = float(sub["time_s"].iloc[0] * 1e6)
            timelines.setdefault(lib, (trace, res))
    rows = pd.concat(frames, ignore_index=True)
    keys = [k for k in metrics[ctx.baseline] if k.endswith("busbw_GBps")]
    table = metric_table(metrics, ctx.baseline, keys).rename(columns={"metric": "busbw GB/s (DeepEP convention)"})
    return WorkloadResult(rows=rows, metrics=metrics, timelines=timelines, table=table)
