"""LLM training workload: TorchTitan-style FSDP × TP × EP training of a MoE model.

One trace per sampled iteration (the routing skew changes over training); each is replayed once
per library. See layout.py for the mesh, schedule.py for the iteration, model.py for costs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from stratacl.compare import pivot_table
from stratacl.errors import ConfigError
from stratacl.limits import RunSize
from stratacl.machine.fabric import Fabric
from stratacl.trace import Trace
from stratacl.vocab import KernelClass
from stratacl.workload_api import Library, RunContext, WorkloadResult
from workloads.common.expert_load import router_exponent
from workloads.common.model import describe_model, hf_config
from workloads.common.routing import (
    EpRouting,
    ep_routing,
    imbalance,
    model_group_limit,
    zipf_exponent,
)
from workloads.llm_train.schema import LlmTrainConfig

from .allocation import allocator_peak
from .blocks import ModelPlan
from .checkpointing import AcMode
from .layout import Layout
from .memory import check_fits, memory_breakdown
from .model import build_plan, model_costs, model_ref
from .pipeline import Pipe, build_pipeline, chunk_units, stage_figures
from .pp_memory import pipeline_breakdown, pipeline_peak
from .pp_schedules import COMBINABLE, PpSchedule, check, stages_per_rank
from .report import STEP_PARTS, iteration_figures, step_breakdown
from .schedule import Knobs, build_iteration, moe_shape

__all__ = ["Prepared", "estimate", "iteration_trace", "prepare", "run"]


@dataclass(frozen=True)
class Prepared:
    cfg: LlmTrainConfig
    layout: Layout
    plan: ModelPlan
    knobs: Knobs
    pipe: Pipe | None = None  # None: the FSDP schedule (pp 1, ZeRO-3, one micro-batch)


def prepare(cfg: LlmTrainConfig, fabric: Fabric) -> Prepared:
    fabric.check_ranks(cfg.dies, "workload.dies")
    if not cfg.iterations:  # each element's bound is the schema's
        raise ConfigError("workload.iterations", "empty", "give at least one iteration number ≥ 0")
    pipe = _pipe(cfg)
    layout = Layout(cfg.dies, cfg.fsdp, cfg.tp, cfg.ep, cfg.separate_reduce_scatter_group, pp=cfg.pp)
    if cfg.fsdp * cfg.tp * cfg.pp != cfg.dies:  # fail before measuring the model
        layout.check(0 if cfg.ep == 1 else cfg.ep)
    knobs = Knobs(act_bytes=cfg.model.dtype_bytes, grad_bytes=cfg.grad_dtype_bytes,
                  master_bytes=cfg.master_dtype_bytes, state_bytes=cfg.optimizer_state_bytes,
                  optimizer_flops_per_param=cfg.optimizer_flops_per_param,
                  sequence_parallel=cfg.sequence_parallel, grad_clip=cfg.grad_clip, ac=cfg.ac, ac_every=cfg.ac_every,
                  prefetch=cfg.prefetch,
                  elementwise=KernelClass.elementwise_compiled if cfg.compile else KernelClass.elementwise_eager)
    if pipe is None:
        return Prepared(cfg, layout, build_plan(cfg, layout), knobs)
    if cfg.global_batch % (cfg.fsdp * cfg.microbatches):
        raise ConfigError("workload.microbatches", f"global_batch {cfg.global_batch} does not split into "
                          f"{cfg.microbatches} micro-batches on each of fsdp={cfg.fsdp} data-parallel ranks",
                          "choose global_batch a multiple of fsdp × microbatches")
    plan = build_plan(replace(cfg, global_batch=cfg.global_batch // cfg.microbatches), layout)  # one micro-batch
    chunk_units(plan, pipe.n_stages(cfg.pp), pipe.split)  # stages must divide the layers
    return Prepared(cfg, layout, plan, knobs, pipe)


def _pipe(cfg: LlmTrainConfig) -> Pipe | None:
    """The pipeline / ZeRO knobs, checked; None for the plain FSDP iteration."""
    if cfg.pp == 1 and cfg.zero == 3 and cfg.microbatches == 1:
        if cfg.ep_overlap:
            raise ConfigError("workload.ep_overlap", "Megatron's combined 1F1B pairs micro-batches: one "
                              "FSDP step without pipelining has a single one", "set workload.microbatches ≥ 2 "
                              "(or a pipeline), or ep_overlap=false")
        return None
    sched = PpSchedule(cfg.pp_schedule)
    if cfg.dies % cfg.pp:
        raise ConfigError("workload.pp", f"pp={cfg.pp} does not divide dies={cfg.dies}", "use a divisor of dies")
    if sched == PpSchedule.dualpipev and cfg.pp == 1:
        raise ConfigError("workload.pp_schedule", "dualpipev needs pp ≥ 2", "use 1f1b, or set workload.pp")
    n_stages = cfg.pp * stages_per_rank(sched, cfg.pp_virtual_stages)
    if sched in (PpSchedule.one_f_one_b, PpSchedule.dualpipev) and cfg.microbatches < n_stages:
        raise ConfigError("workload.microbatches", f"{sched.value} needs at least as many micro-batches as "
                          f"stages ({n_stages}), got {cfg.microbatches}", f"use microbatches ≥ {n_stages}")
    check(sched, cfg.pp, cfg.microbatches, cfg.pp_virtual_stages)
    if cfg.ep_overlap and sched not in COMBINABLE:
        raise ConfigError("workload.ep_overlap", f"Megatron's combined 1F1B pairs the steady state of "
                          f"{' / '.join(s.value for s in COMBINABLE)}, not {sched.value}",
                          "use pp_schedule=interleaved_1f1b or one_f_one_b (dualpipev pairs by itself: pp_overlap)")
    if cfg.ep_overlap and cfg.ep == 1:
        raise ConfigError("workload.ep_overlap", "no expert-parallel all-to-all to overlap (ep=1)",
                          "set workload.ep > 1 or ep_overlap=false")
    return Pipe(sched, cfg.microbatches, cfg.pp_virtual_stages, cfg.pp_weight_grad_fraction, cfg.zero,
                cfg.pp_layer_split, cfg.pp_overlap, cfg.zero3_reshard_after_forward, combined=cfg.ep_overlap)


MAX_MODEL_LAYERS = 128  # depth assumed when the config does not say (deeper than every shipped model)
OPS_PER_LAYER = 40  # measured: 2118 ops for DeepSeek-V3.2's 61 layers (≈ 35), rounded up


def estimate(cfg: LlmTrainConfig) -> RunSize:
    """One trace per sampled iteration, each ≈ OPS_PER_LAYER ops per transformer layer."""
    layers = cfg.num_layers or _model_depth(cfg)
    # a pipeline runs every layer once per micro-batch (the zero-bubble schedules add weight passes)
    split = 1.5 if cfg.pp_schedule in ("interleaved_zb", "zbv", "dualpipev") else 1.0
    per_trace = int(OPS_PER_LAYER * layers * cfg.microbatches * split) + 64 * cfg.pp
    return RunSize(trace_ops=per_trace, replayed_ops=per_trace * len(cfg.iterations))


def _model_depth(cfg: LlmTrainConfig) -> int:
    """The configured model's decoder layers (its preset, config.json or overrides)."""
    return int(getattr(hf_config(cfg.model), "num_hidden_layers", MAX_MODEL_LAYERS) or MAX_MODEL_LAYERS)


def train_exponent(cfg: LlmTrainConfig, experts: int, iteration: int) -> float:
    """The router's Zipf exponent at `iteration`: the configured schedule when it has one
    (skew.start or skew.end > 0), else the one derived from the measured load figure."""
    if cfg.skew.start > 0 or cfg.skew.end > 0:
        return zipf_exponent(cfg.skew, iteration)
    return router_exponent(0.0, cfg.expert_load, experts)


def routing_for(prep: Prepared, iteration: int, seed: int) -> tuple[dict[int, EpRouting], float, float]:
    """Per-unit routing for one iteration (token by token, node-limited where the model's config
    says so), the Zipf exponent and the mean EP imbalance."""
    plan, lay = prep.plan, prep.layout
    s = train_exponent(prep.cfg, plan.n_experts, iteration)
    limit = model_group_limit(model_costs(prep.cfg)[0].cfg)
    rows = {}
    for i, unit in enumerate(plan.units):
        if any(sub.routed for sub in unit.subs) and lay.ep > 1:
            rows[i] = ep_routing(lay.ep, plan.n_experts, plan.top_k, plan.tokens // lay.tp, s, seed, i,
                                 iteration, limit)
    imb = float(np.mean([imbalance(r.rows) for r in rows.values()])) if rows else 1.0
    return rows, s, imb


def iteration_trace(prep: Prepared, iteration: int, seed: int) -> tuple[Trace, float, float]:
    rows, s, imb = routing_for(prep, iteration, seed)
    meta = {"iteration": iteration, "zipf_exponent": s}
    moe = moe_shape(prep.plan, prep.layout, model_costs(prep.cfg)[0].formats, prep.knobs) if rows else None
    if prep.pipe is not None:
        return build_pipeline(prep.plan, prep.layout, prep.knobs, prep.pipe, rows, meta=meta, moe=moe), s, imb
    trace = build_iteration(prep.plan, prep.layout, prep.knobs, rows, meta=meta, moe=moe)
    return trace, s, imb


def fit_memory(prep: Prepared, library: Library, hbm_bytes: float) -> tuple[Knobs, dict[str, float], str]:
    """The knobs a library's memory allows, the per-die breakdown and the schedule change made.

    The iteration's tensors run through the library's allocator (allocation.py) on what is left
    of HBM after the library's buffers / pool and the runtime reserve. If they do not fit without
    the configured activation checkpointing (`workload.ac`), TorchTitan's remedy is "full" AC: the
    run goes on with every block checkpointed (and says so, `schedule_change` "recompute:<was>->full");
    if they do not fit with it either, the run stops."""
    cfg = prep.cfg
    outside = library.held_memory_bytes(communicators=prep.layout.communicators_per_rank(), context="training")
    capacity = hbm_bytes - outside - cfg.alloc_overhead_GB * 1e9
    knobs, change = prep.knobs, ""

    def peak_of(k: Knobs):  # noqa: ANN202
        if prep.pipe is None:
            return allocator_peak(prep.plan, prep.layout, k, library, capacity, cfg.expandable_segments)
        return pipeline_peak(prep.plan, prep.layout, k, prep.pipe, library, capacity, cfg.expandable_segments)

    peak = peak_of(knobs) if capacity > 0 else None
    if peak is None and knobs.ac != AcMode.full and capacity > 0:
        knobs, change = replace(knobs, ac=AcMode.full), f"recompute:{knobs.ac.value}->full"
        peak = peak_of(knobs)
    mem = memory_breakdown(prep.plan, prep.layout, knobs, outside, cfg.alloc_overhead_GB * 1e9) \
        if prep.pipe is None else \
        pipeline_breakdown(prep.plan, prep.layout, knobs, prep.pipe, outside, cfg.alloc_overhead_GB * 1e9)
    if peak is None:
        check_fits(mem, hbm_bytes, library.name, knobs.ac, allocator_failed=True)
    mem["reserved"] = peak.reserved
    mem["fragmentation"] = peak.fragmentation
    return knobs, mem, change


def run(ctx: RunContext) -> WorkloadResult:
    cfg: LlmTrainConfig = ctx.cfg.workload
    prep = prepare(cfg, ctx.fabric)
    memory, knobs, changes = {}, {}, {}
    for lib, model in ctx.libraries.items():
        knobs[lib], memory[lib], changes[lib] = fit_memory(prep, model, ctx.fabric.hbm_bytes)
    tokens = cfg.global_batch * cfg.seq_len
    records, timelines = [], {}
    ctx.progress.phase("iterations", total=len(cfg.iterations) * len(ctx.libraries), unit="replay")
    for it in cfg.iterations:
        by_knobs: dict[Knobs, list[str]] = {}
        for lib in ctx.libraries:  # one trace per schedule: a library forced to recompute gets its own
            by_knobs.setdefault(knobs[lib], []).append(lib)
        for k, libs in by_knobs.items():
            trace, s, imb = iteration_trace(replace(prep, knobs=k), it, ctx.seed)
            for lib in libs:
                res = ctx.simulate(trace, lib)
                ctx.progress(1)
                fig = iteration_figures(res.exposure())
                fig |= ctx.counterfactual(trace, lib, res).metrics("iteration")  # the window is [0, last end]
                fig |= step_breakdown(trace, res, ctx.fabric, fig["iteration_time_s"])
                if prep.pipe is not None:  # per pipeline rank: one stage's compute hides nothing of another's
                    fig.update(stage_figures(trace, res.start, res.end, prep.layout))
                    fig["compute_s"], fig["exposed_comm_s"] = fig["stage_compute_s"], fig["stage_exposed_comm_s"]
                mem = memory[lib]
                held = mem["reserved"] + mem["library"] + mem["overhead"]
                records.append({"library": lib, "iteration": it, "zipf_exponent": s, "ep_imbalance": imb, **fig,
                                "tokens_per_s": tokens / fig["iteration_time_s"],
                                "tokens_per_s_per_die": tokens / fig["iteration_time_s"] / cfg.dies,
                                "peak_mem_GB_per_die": held / 1e9,
                                **{f"mem_{key}_GB": v / 1e9 for key, v in mem.items()},
                                "ac": k.ac.value, "schedule_change": changes[lib],
                                "n_ops": len(trace.ops), "sim_wall_s": res.wall_s})
                timelines[lib] = (trace, res)  # the last sampled iteration
    rows = pd.DataFrame(records).sort_values(["iteration", "library"], kind="stable").reset_index(drop=True)
    metrics = {lib: _metrics(rows[rows["library"] == lib]) for lib in ctx.libraries}
    notes = [f"mesh: fsdp {cfg.fsdp} × tp {cfg.tp} = {cfg.dies} dies; ep {cfg.ep} over {cfg.ep // cfg.tp} "
             f"FSDP ranks × tp; efsdp {prep.layout.efsdp}; {len(prep.plan.units)} FSDP units"]
    if prep.pipe is not None:
        pipe = prep.pipe
        notes = [f"mesh: pp {cfg.pp} × fsdp {cfg.fsdp} × tp {cfg.tp} = {cfg.dies} dies; ep {cfg.ep} inside each "
                 f"{prep.layout.stage_dies}-die stage; schedule {pipe.schedule.value}, {pipe.n_stages(cfg.pp)} "
                 f"stages, {pipe.microbatches} micro-batches; ZeRO-{pipe.zero}"]
    notes.insert(0, describe_model(model_ref(cfg), model_costs(cfg)[0]))
    notes += [f"{lib}: its memory does not fit with workload.ac={cfg.ac.value} (the allocator runs out of the "
              f"die's HBM): every block checkpointed (ac=full) instead" for lib, c in changes.items() if c]
    return WorkloadResult(rows=rows, metrics=metrics, timelines=timelines, notes=notes,
                          table=pivot_table(rows, ["iteration", "zipf_exponent", "ep_imbalance"],
                                            "iteration_time_s", list(ctx.libraries), ctx.baseline))


def _metrics(sub: pd.DataFrame) -> dict[str, float]:
    m = {k: float(sub[k].mean()) for k in ("iteration_time_s", "compute_s", "exposed_comm_s", "tokens_per_s",
                                            "tokens_per_s_per_die", "mfu", "comm_wire_s", "comm_copy_s",
                                            "comm_sync_s", "comm_register_s", "comm_launch_s",
                                            *(f"step_{p}_s" for p in (*STEP_PARTS, "recompute")),
                                            *(c for c in sub.columns if "_cf_" in c))}
    if "bubble_fraction" in sub:
        m["bubble_fraction"] = float(sub["bubble_fraction"].mean())
    m["iteration_time_s_first"] = float(sub["iteration_time_s"].iloc[0])
    m["iteration_time_s_last"] = float(sub["iteration_time_s"].iloc[-1])
    m["peak_mem_GB_per_die"] = float(sub["peak_mem_GB_per_die"].max())
    m["reserved_GB_per_die"] = float(sub["mem_reserved_GB"].max())
    m["fragmentation_GB_per_die"] = float(sub["mem_fragmentation_GB"].max())
    m["recompute_forced"] = float(sub["schedule_change"].str.startswith("recompute").any())
    return m
