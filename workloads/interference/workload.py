"""Comm-compute interference on a die under FSDP overlap (REFERENCE §3 "Overlap").

The forward and backward compute of one training layer (costs from the model-cost piece at the
llm_train shape, as kernels of the kinds `workloads/common/kernels.py` assigns) runs on every die,
once alone, once overlapped with the FSDP collectives of its neighbour layer — the all-gather of
its parameters during the forward; that all-gather plus the reduce-scatter of its gradients during
the backward (prefetch 1, as FSDP2 runs them) — and the collectives once alone. Per library:

- ``compute_slowdown`` = compute time overlapped / compute time alone − 1 (the whole layer);
- ``concurrent_compute_slowdown`` = how much slower compute progresses *while* a collective is in
  flight: extra / (overlap − extra), with extra the added compute time and overlap the time both
  run (a kernel at rate r while overlapped gives 1/r − 1). It averages over every kernel the
  collectives overlap, cube-only ones included, so it depends on which kernels the transfers
  happen to overlap (a held half of the AIVs gives 1.0 only if every overlapped kernel is mixed);
- the overlapped step vs running compute and communication back to back.
Which mechanism slows compute shows in the per-kernel rows (kernels.parquet, summarised in the
notes): held vector cores slow mixed and vector kernels; HBM traffic (transfers, staging copies)
slows what shares HBM — memory-bound kernels through the bandwidth share, every kernel through the
memory latency the traffic adds (`fabric.die.kernel.comm_hbm_stall`, stratacl/engine/interference.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from stratacl.errors import ConfigError
from stratacl.metrics import union_length
from stratacl.trace import Trace
from stratacl.workload_api import RunContext, WorkloadResult
from workloads.common.kernels import (
    Kernel,
    add_kernels,
    apply_stream_limits,
    split_cost,
    stream_limits,
)
from workloads.interference.schema import InterferenceConfig
from workloads.llm_train.blocks import ModelPlan, SubBlock, Unit
from workloads.llm_train.layout import Layout
from workloads.llm_train.model import build_plan

PHASES = ("fwd", "bwd")


@dataclass(frozen=True)
class LayerWork:
    unit: Unit
    plan: ModelPlan
    layout: Layout


def layer_work(cfg: InterferenceConfig) -> LayerWork:
    layout = Layout(cfg.dies, cfg.fsdp, cfg.tp, cfg.ep)
    plan = build_plan(cfg, layout)
    decoders = [u for u in plan.units if u.decoder]
    if not -len(decoders) <= cfg.layer < len(decoders):
        raise ConfigError("workload.layer", f"layer {cfg.layer} outside the model's {len(decoders)} decoder layers",
                          f"use -1 or 0..{len(decoders) - 1}")
    return LayerWork(decoders[cfg.layer], plan, layout)


def sub_kernels(sub: SubBlock, phase: str, work: LayerWork, fused: list[str]) -> list[tuple[str, list[Kernel]]]:
    """(name, kernels) of one sub-block in one phase. A routed MoE: router + shared experts, then
    the experts at the mean rows an EP rank receives (uniform routing: its tokens × top-k)."""
    cost = sub.bwd if phase == "bwd" else sub.fwd
    if not sub.routed:
        return [(sub.name, split_cost(sub.name, cost, fused=fused))]
    rows = work.plan.tokens // work.layout.tp * work.plan.top_k
    row = sub.row_bwd if phase == "bwd" else sub.row_fwd
    assert row is not None
    experts = row.scale(rows)
    out = [("router_shared", split_cost("shared_experts", cost, fused=fused)),
           ("experts", split_cost("moe", experts, fused=fused))]
    return out[::-1] if phase == "bwd" else out


def build_trace(cfg: InterferenceConfig, work: LayerWork, compute: bool, comm: bool) -> tuple[Trace, dict[int, str]]:
    """The layer's forward + backward (compute), the FSDP collectives (comm), or both overlapped.
    Returns the trace and op id -> "<phase>" for compute kernels / "comm.<phase>" for collectives."""
    lay, unit = work.layout, work.unit
    tr = Trace(world_size=lay.dies, meta={"workload": "interference", "layer": unit.name})
    fams = set(lay.add_to(tr))
    apply_stream_limits(tr, stream_limits(cfg.stream_layout, ("main", "fsdp_ag")))
    ranks = range(lay.dies)
    sizes = [(fam, p) for fam, p in (("fsdp", unit.params), ("efsdp", unit.expert_params)) if p and fam in fams]
    tag: dict[int, str] = {}
    last_main: list[int] = []
    last_comm: list[int] = []
    for phase in PHASES:
        start_deps = last_main if compute else last_comm
        issued = []
        if comm:
            for fam, params in sizes:
                buf = tr.add_buffer(f"{fam}.unsharded")
                issued.append(tr.collective("allgather", fam, float(params * cfg.model.dtype_bytes), stream="fsdp_ag",
                                            deps=start_deps, buffer=buf, name=f"{phase}.{fam}_allgather"))
                if phase == "bwd":
                    buf = tr.add_buffer(f"{fam}.grad")
                    issued.append(tr.collective("reducescatter", fam, float(params * cfg.grad_dtype_bytes),
                                                stream="fsdp_rs", deps=start_deps, buffer=buf,
                                                name=f"{phase}.{fam}_reducescatter"))
            for i in issued:
                tag[i] = f"comm.{phase}"
        last_comm = issued or last_comm
        if compute:
            subs = unit.subs if phase == "fwd" else unit.subs[::-1]
            for sub in subs:
                for name, kernels in sub_kernels(sub, phase, work, cfg.fused):
                    ids = add_kernels(tr, ranks, kernels, name=f"{phase}.{name}", stream="main", deps=last_main)
                    for i in ids:
                        tag[i] = phase
                    last_main = ids[-1:] or last_main
    tr.validate()
    return tr, tag


def _span(res, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001
    idx = np.asarray(ids, dtype=int)
    return res.start[idx], res.end[idx]


def _figures(alone_c, alone_x, both, tag_c: dict[int, str], tag_b: dict[int, str],  # noqa: ANN001
             dies: int) -> dict[str, float]:
    comp_b = [i for i, t in tag_b.items() if not t.startswith("comm")]
    comm_b = [i for i, t in tag_b.items() if t.startswith("comm")]
    compute_alone = alone_c.makespan_s
    comm_alone = alone_x.makespan_s
    cs, ce = _span(both, comp_b)
    xs, xe = _span(both, comm_b)
    compute_both = union_length(cs, ce)
    overlap = compute_both + union_length(xs, xe) - union_length(np.r_[cs, xs], np.r_[ce, xe])
    extra = compute_both - compute_alone
    m = {
        "compute_alone_s": compute_alone,
        "comm_alone_s": comm_alone,
        "back_to_back_s": compute_alone + comm_alone,
        "overlapped_s": both.makespan_s,
        "compute_overlapped_s": compute_both,
        "overlap_s": overlap,
        "compute_slowdown": compute_both / compute_alone - 1 if compute_alone > 0 else float("nan"),
        "concurrent_compute_slowdown": extra / (overlap - extra) if overlap - extra > 0 else float("nan"),
        "step_vs_back_to_back": both.makespan_s / (compute_alone + comm_alone),
        "comm_vector_core_s": float(both.core_s[comm_b].sum()),
        "comm_hbm_GB_per_die": float(both.hbm_bytes[comm_b].sum()) / 1e9 / dies,
    }
    for phase in PHASES:
        ids_c = [i for i, t in tag_c.items() if t == phase]
        ids_b = [i for i, t in tag_b.items() if t == phase]
        a = union_length(*_span(alone_c, ids_c))
        b = union_length(*_span(both, ids_b))
        m[f"{phase}_compute_slowdown"] = b / a - 1 if a > 0 else float("nan")
    return m


def _kernel_rows(lib: str, trace: Trace, alone_c, both, tag_c: dict[int, str],  # noqa: ANN001
                 tag_b: dict[int, str]) -> list[dict]:
    """Per kernel: alone vs overlapped duration (kernels are matched by name and order)."""
    a_ids = [i for i, t in tag_c.items() if not t.startswith("comm")]
    b_ids = [i for i, t in tag_b.items() if not t.startswith("comm")]
    rows = []
    for ia, ib in zip(a_ids, b_ids, strict=True):
        op = trace.ops[ib]
        alone = float(alone_c.end[ia] - alone_c.start[ia])
        over = float(both.end[ib] - both.start[ib])
        rows.append({"library": lib, "kernel": op.name, "kind": op.core, "alone_s": alone, "overlapped_s": over,
                     "slowdown": over / alone - 1 if alone > 0 else float("nan")})
    return rows


def kernel_notes(kernels: pd.DataFrame, least: float = 0.005) -> list[str]:
    """One line per library: the kernels slowed by more than `least` under the overlap (the rest of
    kernels.parquet ran as alone), so which kernel kinds the interference reaches shows in the output."""
    out = []
    for lib, df in kernels.groupby("library", sort=False):
        hit = df[df["slowdown"] > least]
        slowed = ", ".join(f"{r.kernel} ({r.kind}) {r.slowdown:+.1%}" for r in hit.itertuples()) or "none"
        out.append(f"{lib}: kernels slowed under overlap (kernels.parquet): {slowed}")
    return out


def kind_notes(kernels: pd.DataFrame, metrics: dict[str, dict[str, float]]) -> list[str]:
    """One line per library: its concurrent compute slowdown split by the kind of kernel that lost
    the time (the added seconds of cube, vector and mixed kernels, each as a share of the slowdown).
    Cube kernels share no vector core with the transfers: what they lose is HBM (the stall of
    loaded memory latency, or the bandwidth share of a memory-bound one)."""
    out = []
    for lib, df in kernels.groupby("library", sort=False):
        extra = (df["overlapped_s"] - df["alone_s"]).groupby(df["kind"]).sum()
        total, slow = float(extra.sum()), metrics[lib]["concurrent_compute_slowdown"]
        if total <= 0 or not np.isfinite(slow):
            continue
        parts = ", ".join(f"{kind} kernels {slow * v / total:.1%}" for kind, v in extra.items() if v > 0)
        out.append(f"{lib}: concurrent compute slowdown {slow:.1%} = {parts}")
    return out


def run(ctx: RunContext) -> WorkloadResult:
    cfg: InterferenceConfig = ctx.cfg.workload
    ctx.fabric.check_ranks(cfg.dies, "workload.dies")
    work = layer_work(cfg)
    tr_c, tag_c = build_trace(cfg, work, compute=True, comm=False)
    tr_x, _ = build_trace(cfg, work, compute=False, comm=True)
    tr_b, tag_b = build_trace(cfg, work, compute=True, comm=True)
    alone_c = ctx.replay_all(tr_c)
    alone_x = ctx.replay_all(tr_x)
    both = ctx.replay_all(tr_b, progress=True)
    # the counterfactual without the loaded-memory-latency stall: what HBM bandwidth and core sharing
    # alone cost (alone, compute meets no traffic: its replays are the same with or without it)
    no_stall = ctx.without_hbm_stall().replay_all(tr_b)
    records, kernels, timelines = [], [], {}
    for lib in ctx.libraries:
        m = _figures(alone_c[lib], alone_x[lib], both[lib], tag_c, tag_b, cfg.dies)
        sharing = _figures(alone_c[lib], alone_x[lib], no_stall[lib], tag_c, tag_b, cfg.dies)
        m["concurrent_slowdown_sharing"] = sharing["concurrent_compute_slowdown"]
        m["concurrent_slowdown_hbm_stall"] = m["concurrent_compute_slowdown"] - m["concurrent_slowdown_sharing"]
        records.append({"library": lib, **m})
        kernels += _kernel_rows(lib, tr_b, alone_c[lib], both[lib], tag_c, tag_b)
        timelines[lib] = (tr_b, both[lib])
    rows = pd.DataFrame(records)
    metrics = {r["library"]: {k: float(v) for k, v in r.items() if k != "library"} for r in records}
    shown = ["compute_slowdown", "concurrent_compute_slowdown", "fwd_compute_slowdown", "bwd_compute_slowdown",
             "compute_alone_s", "comm_alone_s", "overlapped_s", "back_to_back_s", "step_vs_back_to_back"]
    table = rows.set_index("library")[shown].T.rename_axis("metric").reset_index()
    u = work.unit
    notes = [f"layer {u.name}: {len(tr_c.ops)} kernels; FSDP all-gather {u.params * cfg.model.dtype_bytes / 1e6:.0f} MB "
             f"(fsdp) + {u.expert_params * cfg.model.dtype_bytes / 1e6:.0f} MB (efsdp) per rank; "
             "targets (REFERENCE §3): hccl ≈ 25 %, hccl_zerocopy ≈ 13 % slowdown of the compute that runs while "
             "the collectives are in flight: concurrent_compute_slowdown, the figure python -m stratacl.validate "
             "checks (compute_slowdown is over the whole layer's compute, most of which runs alone)"]
    notes += kernel_notes(pd.DataFrame(kernels))
    notes += kind_notes(pd.DataFrame(kernels), metrics)
    notes += [f"{lib}: concurrent compute slowdown {m['concurrent_compute_slowdown']:.1%} = HBM latency stall "
              f"{m['concurrent_slowdown_hbm_stall']:.1%} + HBM bandwidth and core sharing "
              f"{m['concurrent_slowdown_sharing']:.1%} (a replay with fabric.die.kernel.comm_hbm_stall=0)"
              for lib, m in metrics.items()]
    return WorkloadResult(rows=rows, metrics=metrics, timelines=timelines, notes=notes, table=table,
                          extra_rows={"kernels": pd.DataFrame(kernels)})
