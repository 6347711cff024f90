"""Wiring of the serving workload: validation, per-library runs, metrics, tables."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from stratacl.compare import metric_table
from stratacl.errors import ConfigError
from stratacl.limits import RunSize
from stratacl.metrics import percentile
from stratacl.schemas.llm_infer import LlmInferConfig
from stratacl.workload_api import RunContext, WorkloadResult
from workloads.common.model import model_costs
from workloads.common.routing import expert_weights
from workloads.llm_infer.costs import ServingCosts
from workloads.llm_infer.fixed import run_fixed
from workloads.llm_infer.iteration import BATCH_BUCKETS, CONTEXT_BUCKETS, IterationModel, bucket
from workloads.llm_infer.memory import die_memory
from workloads.llm_infer.requests import Requests, describe, generate
from workloads.llm_infer.serving import ServingSim
from workloads.modelcost import ModelCosts


def estimate(cfg: LlmInferConfig) -> RunSize:
    """Requests generated for the run and the saturation run (arrivals are drawn for 1.5× the
    expected count plus 50, as requests.generate does)."""
    r = cfg.requests
    if r.arrival == "csv" or cfg.mode == "fixed":
        return RunSize()  # a user's table: its rows are already bounded by the file
    n = r.rate * r.duration_s * 1.5 + 50
    if cfg.saturation_rate > 0:
        n += cfg.saturation_rate * r.duration_s * 1.5 + 50
    return RunSize(requests=int(n))


def serving_costs(mc: ModelCosts, cfg: LlmInferConfig, seed: int) -> ServingCosts:
    """Per-die costs on the configured layout; an EPLB placement balances the run's expert popularity."""
    e = int(mc.moe_info().get("n_routed_experts", 0))
    shares = expert_weights(e, cfg.skew, cfg.zipf_s, seed=seed) if e else None
    return ServingCosts(mc, cfg.layout.prefill_ep, cfg.layout.decode_ep, cfg.requests.input_mean,
                        layout=cfg.layout, shares=shares)


def validate_layout(cfg: LlmInferConfig, world: int) -> None:
    lay = cfg.layout
    for key in ("prefill_instances", "prefill_dp", "prefill_ep", "decode_instances", "decode_dp", "decode_ep"):
        if getattr(lay, key) <= 0:
            raise ConfigError(f"workload.layout.{key}", "must be positive")
    for role in ("prefill", "decode"):
        if getattr(lay, f"{role}_dp") != getattr(lay, f"{role}_ep"):
            raise ConfigError(f"workload.layout.{role}_ep", "attention DP and MoE EP span the same dies of "
                              "an instance here", f"set {role}_ep = {role}_dp")
    dies = lay.prefill_instances * lay.prefill_dp + lay.decode_instances * lay.decode_dp
    if dies > world:
        raise ConfigError("workload.layout", f"{dies} dies needed but the fabric has {world}",
                          "fewer or smaller instances, or a larger fabric")
    if not 0 <= cfg.remap_fraction <= 1:
        raise ConfigError("workload.remap_fraction", f"{cfg.remap_fraction} is not a fraction", "use 0..1")
    s = cfg.scheduler
    if s.prefill_token_budget <= 0 or s.decode_max_batch < 0 or not 0 <= s.mtp_acceptance <= 1:
        raise ConfigError("workload.scheduler", "need prefill_token_budget > 0, decode_max_batch ≥ 0, "
                          "0 ≤ mtp_acceptance ≤ 1")


def serve(ctx: RunContext, cfg: LlmInferConfig, costs: ServingCosts, iters: IterationModel, library: str,
          reqs: Requests, kv_tok: float, what: str = "serve") -> tuple[ServingSim, dict[str, float]]:
    lib = ctx.libraries[library]
    # progress in simulated seconds of arrivals
    ctx.progress.phase(f"{what} {library}", total=float(reqs.arrival_s.max(initial=0.0)), unit="sim s")
    sched = cfg.scheduler
    reserve = max(sched.activation_reserve_tokens, 1)
    mem_d = die_memory(costs.mc, costs.decode_ep, reserve, lib, ctx.fabric.hbm_bytes, "decode", costs)
    die_memory(costs.mc, costs.prefill_ep, max(reserve, sched.prefill_token_budget), lib, ctx.fabric.hbm_bytes,
               "prefill", costs)
    biggest = kv_tok * float((reqs.input_tokens + reqs.output_tokens).max()) if len(reqs) else 0.0
    if biggest > mem_d.kv_bytes:
        raise ConfigError("workload.requests.input_max", f"a {biggest / 1e9:.1f} GB KV footprint does not fit "
                          f"the {mem_d.kv_bytes / 1e9:.1f} GB KV cache of a decode die with '{library}'",
                          "shorter requests or more HBM per die")
    sim = ServingSim(reqs, iters, library, cfg, kv_per_die=mem_d.kv_bytes, kv_bytes_per_token=kv_tok,
                     progress=ctx.progress, seed=ctx.seed)
    sim.run()
    return sim, {"weights_GB_per_die": mem_d.weight_bytes / 1e9, "library_GB_per_die": mem_d.library_bytes / 1e9,
                 "kv_cache_GB_per_die": mem_d.kv_bytes / 1e9}


def summarise(sim: ServingSim, warmup_s: float, end_s: float) -> dict[str, float]:
    """Latency percentiles over requests arriving in [warmup, end); throughput = tokens produced
    inside that window ÷ its length (steady state, not diluted by the drain after arrivals stop)."""
    req = sim.request_frame()
    t0 = warmup_s if warmup_s < end_s and (req["arrival_s"] >= warmup_s).any() else 0.0
    m = req[req["arrival_s"] >= t0]
    span = max(end_s - t0, 1e-9)
    it = sim.iteration_frame()
    it_end = it["start_s"] + it["time_s"]
    win = it[(it_end > t0) & (it_end <= end_s)]
    dec = it[it["phase"] == "decode"]
    w = dec["time_s"].to_numpy()
    first = req["first_token_s"]
    out_tokens = float(win.loc[win["phase"] == "decode", "tokens"].sum() + ((first > t0) & (first <= end_s)).sum())
    prompt_tokens = float(win.loc[win["phase"] == "prefill", "tokens"].sum())
    done = req["completion_s"]
    out = {
        "throughput_tok_per_s": out_tokens / span,
        "total_throughput_tok_per_s": (out_tokens + prompt_tokens) / span,
        "requests_per_s": float(((done > t0) & (done <= end_s)).sum()) / span,
        "mean_decode_batch_per_die": float(np.average(dec["batch_per_die"], weights=w)) if len(dec) else 0.0,
        "max_decode_batch_per_die": float(sim.max_batch_seen),
        "kv_utilisation_mean": float(np.average(dec["kv_utilisation"], weights=w)) if len(dec) else 0.0,
        "decode_step_s_mean": float(np.average(dec["time_s"], weights=w)) if len(dec) else 0.0,
        "decode_exposed_comm_share": float(dec["exposed_comm_s"].sum() / max(dec["time_s"].sum(), 1e-12)),
    }
    for name, col in (("ttft", "ttft_s"), ("tpot", "tpot_s"), ("e2e", "e2e_s")):
        vals = m[col].dropna().to_numpy()
        for q in (50, 90, 99):
            out[f"{name}_p{q}_s"] = percentile(vals, q)
    return out


def run(ctx: RunContext) -> WorkloadResult:
    cfg: LlmInferConfig = ctx.cfg.workload
    validate_layout(cfg, ctx.fabric.world)
    ctx.progress.phase("model costs", total=1, unit="model")
    mc = model_costs(cfg.model, cfg.cache_dir)
    ctx.progress(1)
    costs = serving_costs(mc, cfg, ctx.seed)
    kv_tok = float(mc.kv_bytes_per_token())
    reqs = generate(cfg.requests, ctx.seed)
    lay = cfg.layout
    first_decode = lay.prefill_instances * lay.prefill_dp  # decode instances follow the prefill ones
    iters = IterationModel(ctx, costs, cfg, kv_bytes_per_token=kv_tok,
                           decode_dies=tuple(range(first_decode, first_decode + lay.decode_dp)))
    if cfg.mode == "fixed":
        return run_fixed(ctx, cfg, costs, iters, kv_tok)
    sat_reqs = generate(cfg.requests, ctx.seed, rate=cfg.saturation_rate) if cfg.saturation_rate > 0 else None
    req_frames, iter_frames, metrics, timelines = [], [], {}, {}
    for library in ctx.libraries:
        sim, mem = serve(ctx, cfg, costs, iters, library, reqs, kv_tok)
        m = summarise(sim, cfg.warmup_s, cfg.requests.duration_s)
        m.update(mem)
        if sat_reqs is not None:
            sat, _ = serve(ctx, cfg, costs, iters, library, sat_reqs, kv_tok, what="saturation")
            s = summarise(sat, cfg.warmup_s, cfg.requests.duration_s)
            m["saturation_throughput_tok_per_s"] = s["throughput_tok_per_s"]
            m["saturation_mean_decode_batch_per_die"] = s["mean_decode_batch_per_die"]
        metrics[library] = m
        req_frames.append(sim.request_frame())
        iter_frames.append(sim.iteration_frame())
        timelines[library] = _typical_decode_timeline(iters, sim, library)
    rows = pd.concat(req_frames, ignore_index=True)
    keys = ["throughput_tok_per_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p99_s",
            "mean_decode_batch_per_die", "decode_step_s_mean", "decode_exposed_comm_share", "kv_cache_GB_per_die"]
    keys += [k for k in ("saturation_throughput_tok_per_s",) if k in next(iter(metrics.values()))]
    table = metric_table(metrics, ctx.baseline, keys)
    notes = [f"{describe(reqs, cfg.requests, cfg.requests.duration_s)} "
             f"(statistics after {cfg.warmup_s} s); {iters.simulated} iteration traces simulated; "
             f"KV {kv_tok:.0f} B/token; model {cfg.model.preset or cfg.model.model_type}"]
    return WorkloadResult(rows=rows, metrics=metrics, timelines=timelines, table=table,
                          notes=notes,
                          extra_rows={"iterations": pd.concat(iter_frames, ignore_index=True)})


def _typical_decode_timeline(iters: IterationModel, sim: ServingSim, library: str):  # noqa: ANN202
    """The most frequent decode shape of this run, replayed for the timeline (shows TBO overlap)."""
    it = sim.iteration_frame()
    dec = it[it["phase"] == "decode"]
    if len(dec):
        b = Counter(bucket(BATCH_BUCKETS, x) for x in dec["batch_per_die"]).most_common(1)[0][0]
    else:
        b = 1
    trace = iters.trace("decode", b, CONTEXT_BUCKETS[0])
    return trace, iters.ctx.simulate(trace, library)
