"""Wiring of the serving workload: validation, per-library runs, metrics, tables."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pandas as pd

from stratacl.compare import metric_table
from stratacl.errors import ConfigError
from stratacl.limits import RunSize
from stratacl.machine.fabric import Fabric
from stratacl.metrics import LATENCY_DEFINITION, latency_percentiles
from stratacl.workload_api import RunContext, WorkloadResult
from workloads.common.expert_load import describe_law, router_shares
from workloads.common.kernels import layout_on_die
from workloads.common.model import describe_model, model_costs, model_name
from workloads.llm_infer.capacity import population, slo_capacity
from workloads.llm_infer.costs import ServingCosts
from workloads.llm_infer.fixed import run_fixed
from workloads.llm_infer.iteration import IterationModel, decode_split_note
from workloads.llm_infer.memory import (
    ServingDie,
    registers_user_buffers,
    role_dies,
    serving_tensors,
)
from workloads.llm_infer.prefix import PrefixCache, prefix_metrics, tier_blocks
from workloads.llm_infer.prefix_trace import BLOCK_TOKENS, BUNDLES
from workloads.llm_infer.requests import (
    Requests,
    describe,
    generate,
    pool,
    window_end,
    window_note,
    window_start,
)
from workloads.llm_infer.scheduling import ServingPhase, decode_batch_cap, emitted_tokens_per_step
from workloads.llm_infer.schema import LlmInferConfig, ServingMode, StreamLayout
from workloads.llm_infer.serving import ServingSim
from workloads.llm_infer.stability import served_fractions
from workloads.modelcost import ModelCosts

GiB = 2**30
# closed-loop request pool beyond the population: completions over the run at up to this rate
# (far above what 192 dies complete; the run reports if the pool runs dry)
POOL_RATE = 1000.0


def estimate(cfg: LlmInferConfig) -> RunSize:
    """Requests generated for the run (arrivals are drawn for 1.5× the expected count plus 50, as
    requests.generate does) and the closed-loop pool (its population is bounded by every decode die
    at its batch cap)."""
    resolve_layout(cfg)
    r = cfg.requests
    if cfg.mode in ("fixed", "search"):  # search: bounded by its own grid (conf/experiment/deployment_search.yaml)
        return RunSize()  # one decode and one prefill iteration at fixed shapes: no requests
    n = 0.0 if r.arrival == "csv" else r.rate * r.duration_s * 1.5 + 50  # a user's table is bounded by its file
    if cfg.capacity.saturation:
        lay = cfg.layout
        n += lay.decode_instances * lay.decode_dp * decode_batch_cap(cfg.scheduler) \
            + POOL_RATE * cfg.capacity.saturation_duration_s
    return RunSize(requests=int(n))


def resolve_layout(cfg: LlmInferConfig) -> None:
    """With `layout.total_dies`, the decode instances take the dies the prefill instances leave
    (the prefill:decode ratio as one knob: vary `prefill_instances`)."""
    lay = cfg.layout
    if not lay.total_dies:
        return
    left = lay.total_dies - lay.prefill_instances * lay.prefill_dp
    if left < lay.decode_dp or left % lay.decode_dp:
        raise ConfigError("workload.layout.total_dies", f"{lay.total_dies} dies minus {lay.prefill_instances} "
                          f"prefill instances of {lay.prefill_dp} leave {left}, not a positive multiple of "
                          f"decode_dp {lay.decode_dp}", "choose prefill_instances / total_dies that divide")
    lay.decode_instances = left // lay.decode_dp


def serving_costs(mc: ModelCosts, cfg: LlmInferConfig, seed: int) -> ServingCosts:
    """Per-die costs on the configured layout; an EPLB placement balances the run's expert popularity.
    A prefill's attention spans one prompt: `workload.fixed.prompt_tokens` in fixed mode, the mean
    request prompt when serving."""
    e = int(mc.moe_info().get("n_routed_experts", 0))
    shares = router_shares(cfg.skew, cfg.zipf_s, cfg.expert_load, e, seed) if e else None
    prompt = cfg.fixed.prompt_tokens if cfg.mode == ServingMode.fixed else cfg.requests.input_mean
    return ServingCosts(mc, cfg.layout.prefill_ep, cfg.layout.decode_ep, prompt,
                        layout=cfg.layout, shares=shares)


def validate_layout(cfg: LlmInferConfig, world: int) -> None:
    resolve_layout(cfg)
    lay = cfg.layout
    if lay.decode_instances <= 0:  # the schema admits 0 for `total_dies` to fill in
        raise ConfigError("workload.layout.decode_instances", "must be positive",
                          "set it, or layout.total_dies to give the decode instances the dies left")
    for role in ServingPhase:
        if getattr(lay, f"{role}_dp") != getattr(lay, f"{role}_ep"):
            raise ConfigError(f"workload.layout.{role}_ep", "attention DP and MoE EP span the same dies of "
                              "an instance here", f"set {role}_ep = {role}_dp")
    dies = lay.prefill_instances * lay.prefill_dp + lay.decode_instances * lay.decode_dp
    if dies > world:
        raise ConfigError("workload.layout", f"{dies} dies needed but the fabric has {world}",
                          "fewer or smaller instances, or a larger fabric")
    c = cfg.capacity
    if c.saturation and c.saturation_warmup_s >= c.saturation_duration_s:
        raise ConfigError("workload.capacity.saturation_warmup_s", "must be shorter than saturation_duration_s")


class Serving:
    """What one run shares across libraries and request sets: model costs, iteration model and the
    tensor declarations of both roles."""

    def __init__(self, ctx: RunContext, cfg: LlmInferConfig, costs: ServingCosts, iters: IterationModel,
                 kv_tok: float) -> None:
        self.ctx, self.cfg, self.costs, self.iters, self.kv_tok = ctx, cfg, costs, iters, kv_tok
        self.tensors = {role: serving_tensors(costs, cfg, role) for role in ServingPhase}

    def dies(self, library: str, role: str, drive_all: bool) -> list[ServingDie]:
        """One allocator-model die per instance of `role` (the instance's busiest die); only the
        first when the library's cost does not depend on them (`drive_all` False: memory report)."""
        n = getattr(self.cfg.layout, f"{role}_instances") if drive_all else 1
        return role_dies(self.tensors[role], self.ctx.libraries[library], self.cfg, role, self.ctx.fabric.hbm_bytes,
                         self.costs, weights=self.iters.weights, seed=self.ctx.seed, instances=n)

    def serve(self, library: str, reqs: Requests, what: str = "serve", closed_loop: int = 0,
              until_s: float | None = None) -> tuple[ServingSim, list[ServingDie]]:
        ctx, cfg = self.ctx, self.cfg
        lib = ctx.libraries[library]
        registers = registers_user_buffers(lib)
        pre, dec = self.dies(library, ServingPhase.prefill, registers), self.dies(library, ServingPhase.decode, registers)
        kv = dec[0].plan.kv
        biggest = self.kv_tok * float((reqs.input_tokens + reqs.output_tokens).max()) if len(reqs) else 0.0
        if biggest > kv:
            raise ConfigError("workload.requests", f"a {biggest / GiB:.1f} GiB KV footprint does not fit the "
                              f"{kv / GiB:.1f} GiB KV cache of a decode die with '{library}'",
                              "shorter requests (input_max / output_max, another trace) or more HBM per die")
        total = until_s if until_s is not None else float(reqs.arrival_s.max(initial=0.0))
        ctx.progress.phase(f"{what} {library}", total=total, unit="sim s")
        sim = ServingSim(reqs, self.iters, library, cfg, kv_per_die=kv, kv_bytes_per_token=self.kv_tok,
                         progress=ctx.progress if not closed_loop else None,
                         prefill_dies=pre, decode_dies=dec, closed_loop=closed_loop, until_s=until_s,
                         prefix=self.prefix_cache(pre[0].plan.kv, reqs))
        sim.run()
        return sim, dec


    def prefix_cache(self, kv_prefill_die: float, reqs: Requests) -> PrefixCache | None:
        """A cold prefix cache for one serving run (None: reuse off, or no block ids): each prefill
        instance's HBM tier from what its dies' allocator model leaves, the DRAM pool from the host
        DRAM of the deployment's dies (the fabric's host tier)."""
        p, lay = self.cfg.prefix_cache, self.cfg.layout
        if not reuses_prefixes(self.cfg) or reqs.block_ids is None or not len(reqs):
            return None
        dies = lay.prefill_instances * lay.prefill_dp + lay.decode_instances * lay.decode_dp
        pool_bytes = p.pool_dram_share * self.ctx.fabric.host_dram_bytes_per_die * dies if uses_pool(self.cfg, self.ctx) \
            else 0.0
        hbm, pool_blocks = tier_blocks(kv_prefill_die, lay.prefill_dp, self.kv_tok, int(reqs.input_tokens.max()),
                                       p.hbm_share, pool_bytes, BLOCK_TOKENS)
        return PrefixCache(lay.prefill_instances, hbm, pool_blocks, BLOCK_TOKENS)


def reuses_prefixes(cfg: LlmInferConfig) -> bool:
    """Whether the run's requests carry block ids and reuse is on (a bundled trace that has them)."""
    r = cfg.requests
    return cfg.prefix_cache.enabled and r.arrival == "trace" and str(r.trace) in BUNDLES


def uses_pool(cfg: LlmInferConfig, ctx: RunContext) -> bool:
    """Whether the prefix cache has its DRAM tier: serving with reuse on, `pool` on, and the fabric
    has host CPUs (fixed-shape runs serve no requests: no cache)."""
    return (cfg.mode == ServingMode.serve and reuses_prefixes(cfg) and cfg.prefix_cache.pool
            and ctx.fabric.host_cpus_per_node > 0)


def memory_metrics(dies: list[ServingDie]) -> dict[str, float]:
    """Where a decode die's HBM goes, and the allocator's peaks over start-up and serving."""
    p = dies[0].plan
    peak = max(d.stats().reserved_peak for d in dies)
    frag = max(d.stats().fragmentation for d in dies)
    return {"weights_GiB_per_die": p.weights / GiB, "activations_GiB_per_die": p.activations / GiB,
            "comm_buffers_GiB_per_die": p.comm_buffers / GiB, "pool_GiB_per_die": p.pool / GiB,
            "library_GiB_per_die": p.library / GiB, "kv_cache_GiB_per_die": p.kv / GiB,
            "reserved_GiB_per_die": peak / GiB, "fragmentation_GiB_per_die": frag / GiB,
            "startup_fragmentation_GiB_per_die": p.fragmentation / GiB,
            "expandable_segments": float(p.expandable_segments)}


def registration_metrics(sim: ServingSim, warmup_s: float) -> dict[str, float]:
    """Iterations after the warm-up, per phase: the share that mapped new memory (the remaps
    registration-on-allocation sees), the JIT cache's hit rate, the registration time per
    iteration (decode keys unprefixed, prefill keys prefixed `prefill_`)."""
    it = sim.iteration_frame()
    out = {}
    for phase, prefix, name in (("decode", "", "decode_iter"), ("prefill", "prefill_", "prefill_iter")):
        x = it[(it["phase"] == phase) & (it["start_s"] >= warmup_s)]
        if not len(x):
            x = it[it["phase"] == phase]
        look = float(x["jit_lookups"].sum())
        out[f"{prefix}remap_fraction"] = float(x["remap"].mean()) if len(x) else 0.0
        out[f"{prefix}jit_hit_rate"] = 1.0 - float(x["jit_misses"].sum()) / look if look else float("nan")
        out[f"register_ms_per_{name}"] = float(x["register_s"].mean() * 1e3) if len(x) else 0.0
    return out


def summarise(sim: ServingSim, warmup_s: float, end_s: float) -> dict[str, float]:
    """Latency percentiles over requests arriving in [warmup, end) (stratacl.metrics
    LATENCY_DEFINITION); throughput = tokens produced
    inside that window ÷ its length (steady state, not diluted by the drain after arrivals stop);
    iteration statistics (decode batch, KV utilisation, prefill busy time) over the same window."""
    req = sim.request_frame()
    t0 = window_start(req["arrival_s"].to_numpy(), warmup_s, end_s)
    span = max(end_s - t0, 1e-9)
    it = sim.iteration_frame()
    it_end = it["start_s"] + it["time_s"]
    win = it[(it_end > t0) & (it_end <= end_s)]
    dec = win[win["phase"] == ServingPhase.decode]
    if not len(dec):
        dec = it[it["phase"] == ServingPhase.decode]
    w = dec["time_s"].to_numpy()
    # iterations overlapping the window, their time clipped to it (a busy share never exceeds 1)
    clipped = it[(it_end > t0) & (it["start_s"] < end_s)]
    clipped = clipped.assign(time_s=np.minimum(clipped["start_s"] + clipped["time_s"], end_s)
                             - np.maximum(clipped["start_s"], t0))
    first = req["first_token_s"]
    out_tokens = float(win.loc[win["phase"] == ServingPhase.decode, "tokens"].sum() + ((first > t0) & (first <= end_s)).sum())
    prompt_tokens = float(win.loc[win["phase"] == ServingPhase.prefill, "tokens"].sum())
    done = req["completion_s"]
    out = {
        "throughput_tok_per_s": out_tokens / span,
        "total_throughput_tok_per_s": (out_tokens + prompt_tokens) / span,
        "requests_per_s": float(((done > t0) & (done <= end_s)).sum()) / span,
        "mean_decode_batch_per_die": float(np.average(dec["batch_per_die"], weights=w)) if w.sum() > 0 else 0.0,
        "max_decode_batch_per_die": float(sim.max_batch_seen),
        "kv_utilisation_mean": float(np.average(dec["kv_utilisation"], weights=w)) if w.sum() > 0 else 0.0,
        "decode_step_s_mean": float(np.average(dec["time_s"], weights=w)) if w.sum() > 0 else 0.0,
        "decode_exposed_comm_share": float(dec["exposed_comm_s"].sum() / max(dec["time_s"].sum(), 1e-12)),
        # share of the window a prefill die computes its own tokens (an iteration lasts as long as its
        # fullest die: the others idle for the rest, pro rata to their tokens). Not "an instance is in
        # an iteration": that reads 1.0 at any load keeping one long prompt in flight (a fifth of
        # capacity on the default run), so it is not reported
        "prefill_die_busy_fraction": _die_busy(clipped[clipped["phase"] == ServingPhase.prefill], span, sim.layout.prefill_instances,
                                               sim.layout.prefill_dp, 1.0),
        # share of the window a decode die steps with sequences of its own: time, not load (a die
        # stepping one sequence is busy; decode_batch_fraction / decode_load_fraction are the load)
        "decode_die_busy_fraction": _die_busy(clipped[clipped["phase"] == ServingPhase.decode], span, sim.layout.decode_instances,
                                              sim.layout.decode_dp, emitted_tokens_per_step(sim.sched)),
    }
    out.update(latency_percentiles(req, t0, end_s))
    return out


def queue_metrics(sim: ServingSim, warmup_s: float, end_s: float) -> dict[str, float]:
    """The offered rate (requests arriving in the measured window ÷ its length) and whether the run
    keeps up with it: the share of the arrival rate served, from the rise of each queue's backlog
    floor (stability.py), and the backlog growth it leaves (offered × the unserved share)."""
    req = sim.request_frame()
    t0 = window_start(req["arrival_s"].to_numpy(), warmup_s, end_s)
    arrived = float(((req["arrival_s"] >= t0) & (req["arrival_s"] < end_s)).sum())
    offered = arrived / max(end_s - t0, 1e-9)
    fr = served_fractions(req, t0, end_s)
    return {"offered_req_per_s": offered, "served_fraction": fr["served_fraction"],
            "prefill_served_fraction": fr["prefill_served_fraction"],
            "decode_served_fraction": fr["decode_served_fraction"],
            "backlog_growth_req_per_s": offered * max(0.0, 1.0 - fr["served_fraction"])}


def _die_busy(it: pd.DataFrame, span: float, instances: int, dp: int, per_row: float) -> float:
    """Σ iteration time × (rows of all dies ÷ (dies × rows of the fullest)) over the window, per
    die: a die is busy for its share of the iteration's work (`per_row`: tokens a row records —
    a decode sequence records the tokens it emits)."""
    if not len(it):
        return 0.0
    full = (it["batch_per_die"] * dp * per_row).clip(lower=1e-12)
    return float((it["time_s"] * (it["tokens"] / full).clip(upper=1.0)).sum()) / (span * instances)


def saturation(serving: Serving, library: str) -> tuple[dict[str, float], list[str]]:
    """Closed-loop saturation throughput (capacity.py): enough outstanding requests for every
    decode die to reach its cap, measured after `saturation_warmup_s`."""
    cfg, ctx = serving.cfg, serving.ctx
    c = cfg.capacity
    sample = pool(cfg.requests, ctx.seed, 10_000)
    kv = serving.dies(library, ServingPhase.decode, False)[0].plan.kv
    n = population(cfg, sample, kv, serving.kv_tok)
    reqs = pool(cfg.requests, ctx.seed, n + int(POOL_RATE * c.saturation_duration_s))
    with serving.iters.probing():  # its iterations are not the verdict's: no counterfactual split
        sim, _ = serving.serve(library, reqs, "saturation", closed_loop=n, until_s=c.saturation_duration_s)
    s = summarise(sim, c.saturation_warmup_s, c.saturation_duration_s)
    notes = []
    hits = {f"saturation_{k}": v for k, v in prefix_metrics(sim.request_frame(), serving.kv_tok).items()
            if k.endswith("rate_tokens")} if sim.prefix is not None else {}
    if sim.issued >= len(reqs):
        notes.append(f"{library}: the closed-loop request pool ran dry; saturation throughput is a lower bound")
    return {"saturation_throughput_tok_per_s": s["throughput_tok_per_s"],
            "saturation_requests_per_s": s["requests_per_s"],
            "saturation_population": float(n),
            "saturation_mean_decode_batch_per_die": s["mean_decode_batch_per_die"],
            "saturation_kv_utilisation": s["kv_utilisation_mean"],
            "saturation_prefill_die_busy_fraction": s["prefill_die_busy_fraction"], **hits}, notes


def slo_search(serving: Serving, library: str) -> tuple[dict[str, float], pd.DataFrame]:
    """The SLO capacity: bisection on the rate, the same arrivals scaled (capacity.py)."""
    cfg, ctx = serving.cfg, serving.ctx

    def evaluate(rate: float) -> tuple[float, float]:
        with serving.iters.probing():  # a search's iterations are not the verdict's
            sim, _ = serving.serve(library, generate(cfg.requests, ctx.seed, rate=rate), f"slo {rate:g} req/s")
        s = summarise(sim, cfg.warmup_s, cfg.requests.duration_s)
        return s["ttft_p99_s"], s["tpot_p99_s"]

    res = slo_capacity(cfg.capacity, cfg.requests.rate, evaluate)
    rows = pd.DataFrame([{"library": library, "rate_req_per_s": r, "ttft_p99_s": v[0], "tpot_p99_s": v[1],
                          "meets_slo": res.meets(cfg.capacity, r)} for r, v in sorted(res.evaluated.items())])
    return {"slo_capacity_req_per_s": res.rate, "slo_capacity_capped": float(res.capped),
            "slo_capacity_ceiling_req_per_s": res.ceiling or cfg.capacity.rate_max}, rows


def resolved_layouts(cfg: LlmInferConfig, fabric: Fabric) -> LlmInferConfig:
    """`cfg` with the stream layouts named `auto` (scheduler, search space) as they run on `fabric`'s die."""
    def on(layout: str) -> str:
        return str(layout_on_die(layout, fabric.cube_cores, fabric.vector_cores))

    sched = replace(cfg.scheduler, decode_stream_layout=StreamLayout(on(cfg.scheduler.decode_stream_layout)))
    search = replace(cfg.search, stream_layout=list(dict.fromkeys(on(s) for s in cfg.search.stream_layout)))
    return replace(cfg, scheduler=sched, search=search)


def run(ctx: RunContext) -> WorkloadResult:
    cfg = resolved_layouts(ctx.cfg.workload, ctx.fabric)
    validate_layout(cfg, ctx.fabric.world)
    ctx.progress.phase("model costs", total=1, unit="model")
    mc = model_costs(cfg.model, cfg.cache_dir)
    ctx.progress(1)
    costs = serving_costs(mc, cfg, ctx.seed)
    kv_tok = float(mc.kv_bytes_per_token())
    lay = cfg.layout
    first_decode = lay.prefill_instances * lay.prefill_dp  # decode instances follow the prefill ones
    iters = IterationModel(ctx, costs, cfg, kv_bytes_per_token=kv_tok,
                           decode_dies=tuple(range(first_decode, first_decode + lay.decode_dp)),
                           pool_writes=uses_pool(cfg, ctx))
    if cfg.mode == ServingMode.fixed:
        return run_fixed(ctx, cfg, costs, iters, kv_tok)  # no requests: workload.requests is not read
    if cfg.mode == ServingMode.search:
        from workloads.llm_infer.deployment import run_search  # imports this module
        return run_search(ctx, cfg, mc)
    reqs = generate(cfg.requests, ctx.seed)
    serving = Serving(ctx, cfg, costs, iters, kv_tok)
    req_frames, iter_frames, slo_frames, metrics, timelines, notes = [], [], [], {}, {}, []
    end_s = window_end(reqs, cfg.requests)
    for library in ctx.libraries:
        sim, dies = serving.serve(library, reqs)
        m = summarise(sim, cfg.warmup_s, end_s)
        if not m["throughput_tok_per_s"] > 0:  # latency percentiles beside 0 tok/s would read as a result
            table = cfg.requests.arrival == "csv" and cfg.requests.csv_window == "table"
            raise ConfigError("workload.warmup_s" if table else "workload.requests.duration_s",
                              f"no output token falls inside the measured window [{cfg.warmup_s:g}, {end_s:g}) s "
                              f"({len(reqs)} requests, TTFT p50 {m['ttft_p50_s']:.3g} s)",
                              "a table spanning several times the time to first token after warmup_s" if table
                              else "a window several times longer than the time to first token")
        m.update(memory_metrics(dies))
        m.update(registration_metrics(sim, cfg.warmup_s))
        if sim.prefix is not None:
            m.update(prefix_metrics(sim.request_frame(), kv_tok))
        # deployment.py imports this module: imported here, not at the top
        from workloads.llm_infer.deployment import load_metrics, load_word, regime
        m.update(queue_metrics(sim, cfg.warmup_s, end_s))
        with iters.probing():  # the capacities' batch searches are not the verdict's iterations
            m.update(load_metrics(serving, library, m, pool(cfg.requests, ctx.seed, 10_000)))
        word = load_word(m["offered_load_fraction"], m["served_fraction"], cfg.search.min_served_fraction)
        m["overloaded"] = float(word == "overload")  # the verdict's caveat: its P99s grow with the window
        notes.append(regime(library, m, model_name(cfg.model, mc.cfg.model_type), cfg.search.min_served_fraction))
        if cfg.capacity.saturation:
            sat, sat_notes = saturation(serving, library)
            m.update(sat)
            notes += sat_notes
        if cfg.capacity.slo_search:
            slo, rows = slo_search(serving, library)
            m.update(slo)
            slo_frames.append(rows)
        metrics[library] = m
        req_frames.append(sim.request_frame())
        iter_frames.append(sim.iteration_frame())
        timelines[library] = _typical_decode_timeline(iters, sim, library)
    rows = pd.concat(req_frames, ignore_index=True)
    keys = ["throughput_tok_per_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p99_s",
            "mean_decode_batch_per_die", "kv_utilisation_mean", "decode_step_s_mean",
            "decode_exposed_comm_share", "kv_cache_GiB_per_die", "library_GiB_per_die", "reserved_GiB_per_die",
            "fragmentation_GiB_per_die", "remap_fraction", "prefill_remap_fraction", "jit_hit_rate",
            "prefill_jit_hit_rate", "register_ms_per_decode_iter", "register_ms_per_prefill_iter",
            "prefix_hit_rate_blocks", "prefix_hit_rate_tokens", "prefix_pool_hit_rate_blocks",
            "saturation_throughput_tok_per_s", "slo_capacity_req_per_s", "load_fraction", "prefill_die_busy_fraction",
            "decode_die_busy_fraction", "decode_batch_fraction"]
    keys = [k for k in keys if k in next(iter(metrics.values()))]
    table = metric_table(metrics, ctx.baseline, keys)
    notes.insert(0, f"{describe(reqs, cfg.requests, cfg.requests.duration_s)}; "
                    f"{window_note(reqs, cfg.requests, cfg.warmup_s)}; {iters.simulated} iteration traces simulated; "
                    f"KV {kv_tok:.0f} B/token; {describe_model(cfg.model, mc)}")
    notes.insert(1, f"latency percentiles (ttft/tpot/e2e_pNN_s): {LATENCY_DEFINITION}")
    if (split := decode_split_note(ctx, cfg)) is not None:
        notes.insert(2, split)
    if costs.experts:
        notes.append(costs.load_note(*describe_law(cfg.skew, cfg.zipf_s, cfg.expert_load, costs.experts)))
    extra = {"iterations": pd.concat(iter_frames, ignore_index=True)}
    if slo_frames:
        extra["slo_search"] = pd.concat(slo_frames, ignore_index=True)
    return WorkloadResult(rows=rows, metrics=metrics, timelines=timelines, table=table, notes=notes,
                          extra_rows=extra, timeline_label=_timeline_label(timelines),
                          run_timeline=_run_intervals(extra["iterations"], rows),
                          run_timeline_label="the whole serving run: every iteration per instance and "
                          "every request from arrival to completion, per library")


def _run_intervals(it: pd.DataFrame, req: pd.DataFrame) -> pd.DataFrame:
    """Iterations per instance and requests (arrival → completion) as run_timeline.json intervals."""
    iters = pd.DataFrame({"library": it["library"], "track": it["phase"] + " instance " + it["instance"].astype(str),
                          "name": it["phase"] + " batch " + it["batch_per_die"].astype(str),
                          "start_s": it["start_s"], "end_s": it["start_s"] + it["time_s"], "tokens": it["tokens"],
                          "exposed_comm_ms": it["exposed_comm_s"] * 1e3})
    reqs = pd.DataFrame({"library": req["library"], "track": "requests (arrival → completion)",
                         "name": "request " + req["request"].astype(str), "start_s": req["arrival_s"],
                         "end_s": req["completion_s"], "ttft_ms": req["ttft_s"] * 1e3, "tpot_ms": req["tpot_s"] * 1e3})
    return pd.concat([iters, reqs], ignore_index=True)


def _timeline_label(timelines: dict) -> str:
    trace = next(iter(timelines.values()))[0]
    return (f"ONE decode iteration, not the run: the run's most frequent decode batch "
            f"({trace.meta.get('size')} per die, context {trace.meta.get('context')} tokens) on "
            f"{trace.world_size} dies, replayed once per library; the run itself is in results.parquet "
            f"(requests) and iterations.parquet (every iteration)")


def _typical_decode_timeline(iters: IterationModel, sim: ServingSim, library: str):  # noqa: ANN202
    """The most frequent decode batch of this run at the median context of its steps, replayed at
    that exact shape for the timeline (shows TBO overlap)."""
    it = sim.iteration_frame()
    dec = it[it["phase"] == ServingPhase.decode]
    b = int(Counter(dec["batch_per_die"]).most_common(1)[0][0]) if len(dec) else 1
    ctx = round(float(dec["context"].median())) if len(dec) else 1024
    trace = iters.trace(ServingPhase.decode, b, ctx)
    return trace, iters.ctx.simulate(trace, library)
