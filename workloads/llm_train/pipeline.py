"""One training iteration under pipeline parallelism and ZeRO as a trace.

The model's units are cut into pp × (stages per rank) chunks (stages); pipeline rank r holds its
stages on the contiguous block of dies `Layout.stage_ranks(r)` and runs the schedule's actions
(pp_schedules.py) in order on its `main` stream. Every op of a stage spans that stage's dies (one
op for all of them). Between stages the activations (forward) and their gradients (backward)
travel as p2p ops, die j of one block to die j of the next, on one stream per stage boundary and
direction, as torch.distributed.pipelining's batched isend/irecv do (ProcessGroupNCCL keeps a
per-peer communicator and stream for p2p). An action starts when its input has arrived and its
rank's previous step has finished: the bubbles are whatever waiting that leaves.

DualPipeV's overlapped pair (forward of one micro-batch, backward of another) runs its two actions
on two streams, so one's MoE dispatch/combine overlaps the other's compute (DeepSeek-V3 report
§3.2.1); the engine shares the die's cores between them.

ZeRO (the data-parallel `fsdp` group of a stage): 2 and 1 keep the parameters replicated; 3
(FSDP2) gathers a unit before its first use and then follows torch.distributed.pipelining and
TorchTitan: every backward but the last micro-batch's runs with `set_reshard_after_backward(False)`
and `set_requires_gradient_sync(False)` (torch 2.13 pipelining/stage.py
`backward_maybe_with_nosync`; `perform_reduce_grad` reshards and reduce-scatters once per step),
and TorchTitan's default `reshard_after_forward_policy` is `not pp_enabled` (torchtitan
models/llama3/infra/parallelize.py `apply_fsdp`): with `reshard_after_forward` false a unit is
gathered once per step and stays gathered, with it true it is freed after each forward and
gathered again by the next action that finds it freed. Gradients are reduce-scattered after the
backward of every micro-batch (2) or only of the last one (1, 3: accumulated unsynchronised); the
optimizer steps on the shard, and 1 / 2 all-gather the updated parameters afterwards. (DeepSpeed's
pipeline engine refuses ZeRO-2/3 with pipelining: deepspeed/runtime/pipe/engine.py asserts
`zero_optimization_stage() < 2`.)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from stratacl.errors import ConfigError
from stratacl.metrics import union_length
from stratacl.trace import MoeShape, Trace
from stratacl.vocab import OpKind
from workloads.common.routing import EpRouting
from workloads.llm_train.schema import LayerSplit

from .blocks import ModelPlan, SubBlock
from .checkpointing import AcMode
from .layout import Layout
from .pp_schedules import (
    Action,
    PpSchedule,
    Step,
    rank_steps,
    stage_rank,
    stages_per_rank,
    validate,
)
from .report import comm_key
from .schedule import IterationBuilder, Knobs


@dataclass(frozen=True)
class Pipe:
    schedule: PpSchedule = PpSchedule.one_f_one_b
    microbatches: int = 1
    virtual: int = 2  # stages per rank of the interleaved schedules
    weight_fraction: float = 0.5  # share of a backward that is the weight-gradient part (I/W split)
    zero: int = 3
    split: LayerSplit = LayerSplit.even
    overlap: bool = True  # DualPipeV's pairs on two streams (False: one after the other on one)
    reshard_after_forward: bool = False  # ZeRO-3: free a unit after each forward (TorchTitan: not under PP)
    combined: bool = False  # Megatron-Core's combined 1F1B: steady-state F/B pairs (pp_schedules.combine_1f1b)

    def n_stages(self, pp: int) -> int:
        return pp * stages_per_rank(self.schedule, self.virtual)


def chunk_units(plan: ModelPlan, n_chunks: int, split: LayerSplit) -> list[list[int]]:
    """Unit indices of each stage: decoder layers in order, the embedding with the first stage and
    the head with the last."""
    dec = [i for i, u in enumerate(plan.units) if u.decoder]
    n = len(dec)
    if n_chunks > n or (split == LayerSplit.even and n % n_chunks):
        raise ConfigError("workload.pp", f"{n} decoder layers do not split evenly over {n_chunks} stages "
                          "(pp × stages per pipeline rank)",
                          "choose pp (and pp_virtual_stages) dividing the layers, or pp_layer_split=balanced")
    base, extra = divmod(n, n_chunks)
    inner = list(range(1, n_chunks - 1)) + [0, n_chunks - 1]  # extra layers go past the first stage
    counts = [base + (c in inner[:extra]) for c in range(n_chunks)]
    bounds = np.cumsum([0, *counts])
    chunks = [dec[bounds[c]:bounds[c + 1]] for c in range(n_chunks)]
    chunks[0] = [i for i in range(dec[0])] + chunks[0]
    chunks[-1] = chunks[-1] + list(range(dec[-1] + 1, len(plan.units)))
    return chunks


def boundary_bytes(plan: ModelPlan, layout: Layout, knobs: Knobs) -> float:
    """Activation (and its gradient) one die sends across a stage boundary per micro-batch: the
    hidden states of its tokens, sequence-sharded over TP under sequence parallelism."""
    tokens = plan.tokens // layout.tp if knobs.sequence_parallel else plan.tokens
    return float(tokens * plan.hidden * knobs.act_bytes)


def _part(sub: SubBlock, f: float) -> SubBlock:
    """The input-gradient part of a sub-block's backward: the share `f` of its projections' (and
    routed experts') work plus the whole attention core, which has no weights."""
    rows = sub.row_bwd.scale(f) if sub.row_bwd is not None else None
    if sub.core_bwd is None:
        return replace(sub, bwd=sub.bwd.scale(f), row_bwd=rows)
    return replace(sub, bwd=(sub.bwd - sub.core_bwd).clip().scale(f) + sub.core_bwd, row_bwd=rows)


class PipelineBuilder(IterationBuilder):
    def __init__(self, plan: ModelPlan, layout: Layout, knobs: Knobs, pipe: Pipe,
                 routing: dict[int, EpRouting] | None = None, meta: dict | None = None,
                 moe: MoeShape | None = None) -> None:
        super().__init__(plan, layout, knobs, routing, meta, moe)
        self.pipe = pipe
        self.fsdp2_copies = pipe.zero == 3  # ZeRO-1/2: contiguous buffers, no FSDP2 copies
        self.p = layout.pp
        self.n_stages = pipe.n_stages(self.p)
        self.chunks = chunk_units(plan, self.n_stages, pipe.split)
        self.ep_pos = np.arange(layout.stage_dies) % layout.ep
        self.act = boundary_bytes(plan, layout, knobs)
        wf = pipe.weight_fraction
        self.input_part = {i: tuple(_part(s, 1.0 - wf) for s in u.subs) for i, u in enumerate(plan.units)}
        self.first_decoder = next((i for i, u in enumerate(plan.units) if u.decoder), 0)
        self.t.meta["pipeline"] = {"pp": self.p, "stages": self.n_stages, "schedule": str(pipe.schedule),
                                   "microbatches": pipe.microbatches, "zero": pipe.zero,
                                   "stage_dies": layout.stage_dies, "boundary_bytes": self.act}
        self.rs_ops: list[list[int]] = [[] for _ in range(self.p)]
        self.gathered: set[int] = set()  # ZeRO-3: units whose parameters are unsharded now
        # (kind, stage, micro-batch, first op, last op) of every action, in issue order
        self.actions: list[tuple[str, int, int, int, int]] = []
        self.t.meta["pipeline"]["actions"] = self.actions

    # ------------------------------------------------------------------ one action
    def _marker(self, deps: list[int], name: str) -> None:
        self.last_main = self.t.compute(self.ranks, fixed_time_s=0.0, deps=deps, name=name, stream=self.stream)

    def _zero3_gathers(self, units: list[int], slot: int = 0, deps: list[int] | None = None) -> dict[int, list[int]]:
        """ZeRO-3: all-gathers of the action's units that are sharded now (none at ZeRO-1/2), into
        buffer slots `slot`, `slot + 1`, ... (two, alternating), each after `deps`."""
        out: dict[int, list[int]] = {}
        if self.pipe.zero != 3:
            return out
        for n, i in enumerate(units, start=slot):
            if i in self.gathered:
                continue
            self.gathered.add(i)
            u = self.plan.units[i]
            out[i] = [self.t.collective("allgather", fam, float(params * self.k.act_bytes), ranks=self.ranks,
                                        stream="fsdp_ag", buffer=f"{fam}.unsharded.{n % 2}",
                                        deps=self._copy_in(u, fam, deps or []), name=f"{u.name}.{fam}_allgather")
                      for fam, params in (("fsdp", u.params), ("efsdp", u.expert_params))
                      if params and fam in self.fams]
        return out

    def _action_gathers(self, units: list[int], n: int, release: list[int], gathers: dict[int, list[int]]) -> None:
        """With `reshard_after_forward` a unit's parameters live in one of two buffers only while it
        runs (pp_memory holds one gathered unit at a time), so the gathers go as FSDP2 prefetches
        them: unit n+1's when unit n starts, into the slot unit n-1 released (after its last op).
        Kept until the step's last backward (the default), an action gathers its units up front."""
        if not self.pipe.reshard_after_forward:
            if n == 0:
                gathers.update(self._zero3_gathers(units))
            return
        if n == 0:
            gathers.update(self._zero3_gathers(units[:1]))
        if n + 1 < len(units):
            gathers.update(self._zero3_gathers(units[n + 1:n + 2], slot=n + 1, deps=release[n - 1:n]))

    def _grad_sync(self, i: int, a: Action) -> None:
        last_mb = a.mb == self.pipe.microbatches - 1
        if self.pipe.zero == 2 or last_mb:
            self.rs_ops[stage_rank(a.stage, self.p, self.pipe.schedule)] += \
                self._reduce_scatters(self.plan.units[i], len(self.rs_ops[0]))

    # an action's ops come out sub-block by sub-block (generators), so that DualPipeV's pair can
    # interleave its two actions' ops in issue order, as DualPipe rearranges the components of an
    # overlapped forward/backward chunk pair (report Fig. 4): collectives on one communicator run
    # in issue order (engine/order.py), so emitting one action whole would queue all of the other's
    # all-to-alls behind it
    def _forward(self, a: Action) -> Iterator[None]:
        units = self.chunks[a.stage]
        gathers: dict[int, list[int]] = {}
        release: list[int] = []  # each unit's last op: its buffer slot is free after it
        for n, i in enumerate(units):
            self._action_gathers(units, n, release, gathers)
            if gathers.get(i):
                self.last_main = self._copy_out(self.plan.units[i], [self.last_main, *gathers[i]])
            for sub in self.plan.units[i].subs:
                self._sub(i, sub, "fwd", True)
                yield
            release.append(self.last_main)
            if self.pipe.reshard_after_forward:
                self.gathered.discard(i)

    def _backward(self, a: Action) -> Iterator[None]:
        """B (full) or I (input gradient; the weight part waits for W)."""
        units = list(reversed(self.chunks[a.stage]))
        gathers: dict[int, list[int]] = {}
        release: list[int] = []
        for n, i in enumerate(units):
            self._action_gathers(units, n, release, gathers)
            unit = self.plan.units[i]
            if gathers.get(i):
                self.last_main = self._copy_out(unit, [self.last_main, *gathers[i]])
            if self.k.unit_ac(self.plan.units, i) != AcMode.none:
                for sub in unit.subs:
                    self._sub(i, sub, "rfwd", True)
            subs = unit.subs if a.kind == "B" else self.input_part[i]
            for j, sub in reversed(list(enumerate(subs))):
                first = i == self.first_decoder and j == 0 and not self.plan.first_input_needs_grad
                self._sub(i, sub, "bwd", not first)
                yield
            release.append(self.last_main)
            if a.mb == self.pipe.microbatches - 1:  # perform_reduce_grad reshards
                self.gathered.discard(i)
            if a.kind == "B":
                self._grad_sync(i, a)

    def _weight(self, a: Action) -> Iterator[None]:
        """W: the weight-gradient GEMMs (no collectives: their inputs and output grads are local)."""
        wf = self.pipe.weight_fraction
        for i in reversed(self.chunks[a.stage]):
            for sub in self.plan.units[i].subs:
                proj = (sub.bwd - sub.core_bwd).clip() if sub.core_bwd is not None else sub.bwd
                self._compute(f"{self.plan.units[i].name}.{sub.name}.wgrad", sub.name, proj.scale(wf),
                              dtype=sub.dtype)
                if sub.routed and "ep" in self.fams:
                    recv = self.routing[i].rows.sum(axis=0).astype(float)
                    self._compute(f"{self.plan.units[i].name}.{sub.name}.experts.wgrad", sub.name,
                                  sub.row_bwd.scale(wf), per_rank=recv[self.ep_pos], dtype=sub.dtype)
                yield
            self._grad_sync(i, a)

    # ------------------------------------------------------------------ transfers
    def _input_deps(self, a: Action, done: dict[tuple[str, int, int], int]) -> list[int]:
        """The op(s) an action's input comes from: a p2p from the neighbouring stage's rank."""
        if a.kind == "W":
            return []
        fwd = a.kind == "F"
        src_stage = a.stage - 1 if fwd else a.stage + 1
        if not 0 <= src_stage < self.n_stages:
            return []
        producer = done[("F", src_stage, a.mb)] if fwd else done[("G", src_stage, a.mb)]
        src = stage_rank(src_stage, self.p, self.pipe.schedule)
        dst = stage_rank(a.stage, self.p, self.pipe.schedule)
        if src == dst:  # DualPipeV's turn: the two stages share a rank
            return [producer]
        s_r, d_r = self.layout.stage_ranks(src), self.layout.stage_ranks(dst)
        boundary = min(src_stage, a.stage)
        return [self.t.add("p2p", tuple(sorted(s_r + d_r)), src=s_r, dst=d_r, nbytes=self.act, deps=[producer],
                           stream=f"pp{boundary}.{'fwd' if fwd else 'bwd'}",
                           name=f"stage{boundary}.{'act' if fwd else 'grad'}.mb{a.mb}")]

    @staticmethod
    def _ready(a: Action, done: dict, n_stages: int) -> bool:
        if a.kind == "F":
            return a.stage == 0 or ("F", a.stage - 1, a.mb) in done
        if a.kind == "W":
            return ("G", a.stage, a.mb) in done
        return ("F", a.stage, a.mb) in done and (a.stage == n_stages - 1 or ("G", a.stage + 1, a.mb) in done)

    def _emit(self, r: int, step: Step, done: dict, tail: list[list[int]]) -> None:
        """One step of rank r: an action, or an overlapped pair (two streams, ops interleaved)."""
        self.ranks = self.layout.stage_ranks(r)
        run = {"F": self._forward, "B": self._backward, "I": self._backward, "W": self._weight}
        parallel = self.pipe.overlap and len(step) > 1
        ends: list[int] = []
        live = []  # [action, stream, its ops, first op, last op]
        for n, a in enumerate(step):
            self.stream = "main.overlap" if parallel and n else "main"
            deps = tail[r] if parallel or not ends else ends[-1:]
            self._marker(deps + self._input_deps(a, done), f"{a.kind}{a.stage}.mb{a.mb}")
            live.append([a, self.stream, run[a.kind](a), self.last_main, self.last_main])
            if not parallel:
                self._drain(live.pop(), done, ends)
        while live:  # round robin, sub-block by sub-block
            for st in list(live):
                self.stream, self.last_main = st[1], st[4]
                more = next(st[2], StopIteration) is not StopIteration
                st[4] = self.last_main
                if not more:
                    live.remove(st)
                    self._drain(st, done, ends)
        tail[r] = ends
        self.stream = "main"

    def _drain(self, st: list, done: dict, ends: list[int]) -> None:
        a, self.stream, ops, first, self.last_main = st
        for _ in ops:
            pass
        done[("G" if a.kind in "BI" else a.kind, a.stage, a.mb)] = self.last_main
        self.actions.append((a.kind, a.stage, a.mb, first, self.last_main))
        ends.append(self.last_main)

    # ------------------------------------------------------------------ iteration
    def build(self) -> Trace:
        pipe = self.pipe
        steps = rank_steps(pipe.schedule, self.p, pipe.microbatches, pipe.virtual, pipe.combined)
        validate(steps, pipe.schedule, self.p, pipe.microbatches, pipe.virtual)
        done: dict[tuple[str, int, int], int] = {}
        tail: list[list[int]] = [[] for _ in range(self.p)]
        ptr = [0] * self.p
        moved = True
        while moved:  # each rank's steps in order, as soon as their inputs exist (any valid order)
            moved = False
            for r in range(self.p):
                while ptr[r] < len(steps[r]) and all(self._ready(a, done, self.n_stages) for a in steps[r][ptr[r]]):
                    self._emit(r, steps[r][ptr[r]], done, tail)
                    ptr[r] += 1
                    moved = True
        stuck = [r for r in range(self.p) if ptr[r] < len(steps[r])]
        if stuck:
            raise AssertionError(f"{pipe.schedule}: rank {stuck[0]} waits forever at {steps[stuck[0]][ptr[stuck[0]]]}")
        for r in range(self.p):
            self._step_optimizer(r, tail[r])
        return self.t

    def _step_optimizer(self, r: int, tail: list[int]) -> None:
        """Adam on the rank's shard of its stages, then (ZeRO-1/2) the updated parameters gathered."""
        k, lay = self.k, self.layout
        self.ranks = lay.stage_ranks(r)
        units = [i for c in range(self.n_stages) if stage_rank(c, self.p, self.pipe.schedule) == r
                 for i in self.chunks[c]]
        local = sum(lay.shard_params(self.plan.units[i]) for i in units)
        opt = self._adam(local, f"optimizer.step.pp{r}",
                         self._clip(local, f"optimizer.pp{r}", [*tail, *self.rs_ops[r][-1:]]))
        if self.pipe.zero < 3:
            for i in units:
                u = self.plan.units[i]
                for fam, params in (("fsdp", u.params), ("efsdp", u.expert_params)):
                    if params and fam in self.fams:
                        self.t.collective("allgather", fam, float(params * k.act_bytes), ranks=self.ranks,
                                          stream="fsdp_ag", deps=[opt], buffer=f"{fam}.unsharded.0",
                                          name=f"{u.name}.{fam}_param_allgather")


def build_pipeline(plan: ModelPlan, layout: Layout, knobs: Knobs, pipe: Pipe,
                   routing: dict[int, EpRouting] | None = None, meta: dict | None = None,
                   moe: MoeShape | None = None) -> Trace:
    return PipelineBuilder(plan, layout, knobs, pipe, routing, meta, moe).build()


def stage_figures(trace: Trace, start: np.ndarray, end: np.ndarray, layout: Layout) -> dict[str, float]:
    """Per pipeline rank over the iteration [first start, last end]: the bubble (nothing of its
    own running: no compute, no communication it takes part in), the exposed communication (its
    communication running while none of its compute does), its compute, and per communicator
    family and collective (`report.comm_key`) the time its own such ops are in flight while none
    of its compute runs; means over the ranks, and the bubble's fraction of the iteration."""
    n = layout.stage_dies
    kinds = np.array([op.kind for op in trace.ops])
    first = np.array([(op.src[0] if op.kind == OpKind.p2p else op.ranks[0]) // n for op in trace.ops])
    second = np.array([(op.dst[0] if op.kind == OpKind.p2p else op.ranks[0]) // n for op in trace.ops])
    lo, hi = float(start.min(initial=0.0)), float(end.max(initial=0.0))
    span = hi - lo
    comp = kinds == OpKind.compute.value
    keys = np.array([comm_key(op) if op.kind in (OpKind.collective, OpKind.p2p) else "" for op in trace.ops])
    families = sorted(set(keys) - {""})
    bubble, exposed, compute = [], [], []
    by_family = {k: 0.0 for k in families}
    for s in range(layout.pp):
        mine = (first == s) | (second == s)
        own = mine & comp
        c = union_length(start[own], end[own])
        busy = union_length(start[mine], end[mine])
        bubble.append(span - busy)
        exposed.append(busy - c)
        compute.append(c)
        for k in families:  # its collectives of the family in flight, none of its compute running
            m = own | (mine & (keys == k))
            by_family[k] += (union_length(start[m], end[m]) - c) / layout.pp
    return {"bubble_fraction": float(np.mean(bubble)) / span if span > 0 else 0.0,
            "bubble_s": float(np.mean(bubble)), "stage_exposed_comm_s": float(np.mean(exposed)),
            "stage_compute_s": float(np.mean(compute)), **{f"exposed_{k}_s": v for k, v in by_family.items()}}
