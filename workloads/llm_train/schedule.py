"""One training iteration as a trace: FSDP2 gathers/reduce-scatters on their own streams, TP and
EP collectives inline with compute, recompute under activation checkpointing (checkpointing.py), optimizer.

Streams: ``main`` (compute, TP and EP collectives: they block the next kernel), ``fsdp_ag``
(parameter all-gathers, prefetched `prefetch` units ahead: the gather into an unsharded buffer
slot waits until the unit that last used the slot has finished computing) and ``fsdp_rs``
(gradient reduce-scatters, after each unit's backward). Every op spans all dies (SPMD).

Communicators, as FSDP2 sets them up (torch 2.13 torch/distributed/fsdp/_fully_shard): the
all-gathers and reduce-scatters of a unit share its shard process group — one communicator, so
the engine runs them one at a time in issue order (engine/order.py) — unless
`separate_reduce_scatter_group` gives the reduce-scatters their own (`fsdp_rs`, `efsdp_rs`). The
issue order is FSDP2's: in the forward a unit's gather is issued when the CPU reaches the unit (the
all-gather stream lets it run ahead of compute); in the backward `FSDPParamGroup.pre_backward`
issues the unit's own gather and prefetches the next unit's (`_backward_prefetch`) before the
unit's backward kernels, and `post_backward` issues its reduce-scatter after them — so the next
gather is queued ahead of this unit's reduce-scatter on the communicator.
Compute enters as the kernels of the training rule (`workloads/common/kernels.py`, TRAINING_FUSED:
flash attention one mixed kernel, GEMMs cube kernels followed by their vector work), its matmuls in
the sub-block's numeric format.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stratacl.trace import MoeShape, Trace
from stratacl.vocab import KernelClass
from workloads.common.cost import Cost
from workloads.common.kernels import TRAINING_FUSED, add_cost
from workloads.common.quant import FORMAT_BYTES, Formats
from workloads.common.routing import EpRouting

from .blocks import ModelPlan, SubBlock, Unit
from .checkpointing import AcMode, unit_ac
from .layout import Layout

# (tp_style, sequence parallel, backward) -> TP collective before / after the sub-block's kernels.
# SP: activations are sequence-sharded between sub-blocks (all-gather in, reduce-scatter out; the
# backward of each is the other). No SP: row-parallel outputs are all-reduced in forward and
# column-parallel input grads in backward. Embedding: vocab-parallel; head: loss parallel.
_TP: dict[tuple[str, bool, bool], tuple[str | None, str | None]] = {
    ("block", True, False): ("allgather", "reducescatter"),
    ("block", True, True): ("allgather", "reducescatter"),
    ("embedding", True, False): (None, "reducescatter"),
    ("embedding", True, True): ("allgather", None),
    ("head", True, False): ("allgather", None),
    ("head", True, True): (None, "reducescatter"),
    ("block", False, False): (None, "allreduce"),
    ("block", False, True): (None, "allreduce"),
    ("embedding", False, False): (None, "allreduce"),
    ("embedding", False, True): (None, None),
    ("head", False, False): (None, None),
    ("head", False, True): (None, "allreduce"),
}


@dataclass(frozen=True)
class Knobs:
    act_bytes: int = 2  # activations and all-gathered parameters (bf16)
    grad_bytes: int = 4  # reduce-scatter dtype
    master_bytes: int = 4
    state_bytes: int = 8
    optimizer_flops_per_param: float = 12.0
    sequence_parallel: bool = True
    grad_clip: bool = True  # torchtitan's clip_grad_norm_ (max_norm 1.0) before the optimizer step
    ac: AcMode = AcMode.full  # activation checkpointing (checkpointing.py)
    ac_every: int = 2  # selective_layer: every k-th block checkpointed
    prefetch: int = 1
    # the kernel class a layer's element-wise work runs as: eager PyTorch's ATen kernels
    # (`elementwise_eager`) or torch.compile's Triton kernels (`elementwise_compiled`)
    elementwise: str = KernelClass.elementwise_eager

    def unit_ac(self, units: tuple[Unit, ...], i: int) -> AcMode:
        """How unit i is checkpointed (none, full or selective_op)."""
        return unit_ac(self.ac, self.ac_every, units, i)


class IterationBuilder:
    def __init__(self, plan: ModelPlan, layout: Layout, knobs: Knobs,
                 routing: dict[int, EpRouting] | None = None, meta: dict | None = None,
                 moe: MoeShape | None = None) -> None:
        self.plan, self.layout, self.k = plan, layout, knobs
        self.routing = routing or {}
        self.t = Trace(world_size=layout.dies, meta={"workload": "llm_train", **(meta or {})}, moe=moe)
        self.fams = set(layout.add_to(self.t))
        self.ranks = tuple(range(layout.dies))
        self.ep_pos = np.arange(layout.dies) % layout.ep  # rank -> position in its EP group
        self.stream = "main"  # the compute stream ops go on (a pipeline's overlapped pair uses two)
        self.fsdp2_copies = True  # FSDP2's copies around its collectives (`_fsdp_copy`); not ZeRO-1/2's buffers
        self.last_main = -1
        self.group_start: dict[int, int] = {}  # last op of a kernel group -> its first (cube) op
        for name in ("tp.in", "tp.out"):
            self.t.add_buffer(name, -1)
        for fam in ("fsdp", "efsdp"):
            for slot in range(knobs.prefetch + 1):
                self.t.add_buffer(f"{fam}.unsharded.{slot}", -1)  # reused every layer
            for slot in range(2):
                self.t.add_buffer(f"{fam}.grad.{slot}", -1)

    # ------------------------------------------------------------------ op helpers
    def _compute(self, name: str, layer_type: str, cost: Cost, per_rank: np.ndarray | None = None,
                 dtype: str = "", hbm_extra: float = 0.0) -> int:
        """One SPMD kernel group: the kernels training's fused set gives `layer_type`'s work
        (`workloads/common/kernels.py`), its matmuls in `dtype`."""
        ops = add_cost(self.t, self.ranks, layer_type, cost, fused=TRAINING_FUSED, name=name, scale=per_rank,
                       dtype=dtype, hbm_extra=hbm_extra, stream=self.stream, elementwise=self.k.elementwise)
        self.last_main = ops[-1]
        self.group_start[ops[-1]] = ops[0]
        return self.last_main

    def _main_coll(self, coll: str, fam: str, nbytes: object, name: str, buffer: str,
                   **kw: object) -> int:
        self.last_main = self.t.collective(coll, fam, nbytes, ranks=self.ranks, name=name, buffer=buffer,
                                           stream=self.stream, **kw)
        return self.last_main

    # ------------------------------------------------------------------ sub-blocks
    def _sub(self, unit_idx: int, sub: SubBlock, phase: str, needs_input_grad: bool) -> None:
        tag = f"{self.plan.units[unit_idx].name}.{sub.name}.{phase}"
        bwd = phase == "bwd"
        tp = "tp" in self.fams and sub.tp_style != "none"
        sp = self.k.sequence_parallel
        size = float(self.plan.tokens * self.plan.hidden * self.k.act_bytes)
        before, after = _TP[(sub.tp_style, sp, bwd)] if tp else (None, None)
        if bwd and not needs_input_grad:
            after = None
        cost = sub.bwd if bwd else sub.fwd
        core = sub.core_bwd if bwd else sub.core_fwd
        row = sub.row_bwd if bwd else sub.row_fwd
        if phase == "rfwd" and self.k.unit_ac(self.plan.units, unit_idx) == AcMode.selective_op:
            # the ops the policy saved are not run again: the fused attention core, half the mm,
            # the reduce-scatter after the block (torchtitan's _save_list)
            assert sub.sac is not None, "selective_op needs the plan's selective recompute costs"
            cost, core, row = sub.sac, None, sub.row_sac
            if after == "reducescatter":
                after = None
        if before:
            self._main_coll(before, "tp", size, f"{tag}.tp_{before}", "tp.in")
        if sub.routed and "ep" in self.fams:
            assert row is not None
            self._moe(tag, unit_idx, sub, cost, bwd, row)
        elif core is not None:  # quantised projections, then the core in its own format
            self._compute(tag, sub.name, (cost - core).clip(), dtype=sub.dtype)
            self._compute(f"{tag}.core", f"{sub.name}.core", core, dtype=sub.core_dtype)
        else:
            self._compute(tag, sub.name, cost, dtype=sub.dtype)
        if after:
            self._main_coll(after, "tp", size, f"{tag}.tp_{after}", "tp.out")

    def _moe(self, tag: str, unit_idx: int, sub: SubBlock, base: Cost, bwd: bool, row: Cost) -> None:
        """The MoE layer through the library's dispatch/combine (HT kernels): one copy per
        destination rank of a token — the library decides whether per node, with forwarding —,
        the forward dispatch in its quantised format, combines and every backward exchange (the
        gradients) in the activation format (DeepSeek-V3 report §3.3: FP8 dispatch, BF16 combine)."""
        route = self.routing[unit_idx]
        shape = self.t.moe
        assert shape is not None, "a routed MoE layer needs the iteration's MoeShape"
        disp_bytes = shape.combine_bytes_per_copy if bwd else shape.dispatch_bytes_per_copy
        recv = route.rows.sum(axis=0).astype(float)
        # router + shared experts (unfused GEMMs + their activation work; allocates the dispatch
        # buffers), then the routed experts at the rows each rank received; the expert weights
        # they read (the row-independent part of the measured grouped GEMM) ride on that kernel
        weights = base.only("grouped_gemm")
        base = base - weights
        if not bwd:
            self._compute(f"{tag}.router", "shared_experts", base, dtype=sub.dtype)
        self._ep(tag, "dispatch", route.copies * disp_bytes, route.group_tokens)
        self._compute(f"{tag}.experts", sub.name, row, per_rank=recv[self.ep_pos], dtype=sub.dtype,
                      hbm_extra=weights.hbm_bytes)
        self._ep(tag, "combine", route.copies.T * shape.combine_bytes_per_copy, route.group_tokens)
        if bwd:
            self._compute(f"{tag}.router", "shared_experts", base, dtype=sub.dtype)

    def _ep(self, tag: str, coll: str, matrix: np.ndarray, group_tokens: np.ndarray) -> None:
        """An HT dispatch/combine with a per-peer matrix (row = sender) and the routing's (token,
        block) counts; its buffer is allocated when the kernel group before it (router or experts)
        starts: routed sizes change every step."""
        buf = self.t.add_buffer(f"{tag}.{coll}", self.group_start.get(self.last_main, self.last_main))
        sent = matrix.sum(axis=1)
        # a layer's routing is the same for every micro-batch: Trace.add keeps one copy of the per-peer
        # vectors (SharedVec), so memory follows layers, not micro-batches
        self._main_coll(coll, "ep", sent[self.ep_pos], f"{tag}.{coll}", buf,
                        peer_bytes=matrix.ravel(), moe_mode="ht", group_tokens=group_tokens)

    # ------------------------------------------------------------------ FSDP
    def _gathers(self, unit: Unit, pos: int, release: list[int]) -> list[int]:
        k = self.k
        deps = [release[pos - k.prefetch - 1]] if pos > k.prefetch else []
        deps = [d for d in deps if d >= 0]
        slot = pos % (k.prefetch + 1)
        ops = []
        for fam, params in (("fsdp", unit.params), ("efsdp", unit.expert_params)):
            if params and fam in self.fams:
                ops.append(self.t.collective("allgather", fam, float(params * k.act_bytes), stream="fsdp_ag",
                                             deps=self._copy_in(unit, fam, deps), buffer=f"{fam}.unsharded.{slot}",
                                             name=f"{unit.name}.{fam}_allgather"))
        return ops

    def _reduce_scatters(self, unit: Unit, slot: int) -> list[int]:
        ops = []
        k = self.k
        for fam, params in (("fsdp", unit.params), ("efsdp", unit.expert_params)):
            if params and fam in self.fams:
                comm = self.layout.reduce_scatter_family(fam)
                deps = [self.last_main]
                if self.fsdp2_copies:  # _chunk_cat of the unsharded gradients, cast to reduce_dtype
                    deps = [self._fsdp_copy(f"{unit.name}.{fam}_rs_copy_in", params * (k.act_bytes + k.grad_bytes),
                                            "fsdp_rs", deps)]
                ops.append(self.t.collective("reducescatter", comm, float(params * k.grad_bytes),
                                             ranks=self.ranks, stream="fsdp_rs", deps=deps,
                                             buffer=f"{fam}.grad.{slot % 2}",
                                             name=f"{unit.name}.{fam}_reducescatter"))
        return ops

    # FSDP2's copies around its collectives (torch 2.13 torch/distributed/fsdp/_fully_shard/
    # _fsdp_collectives.py): the all-gather's copy-in casts each local shard to param_dtype and
    # copies it into the all-gather input (`foreach_all_gather`: `_to_dtype_if_needed`, then
    # `torch._foreach_copy_`), on the all-gather stream; its copy-out splits the output into the
    # unsharded parameters (`foreach_all_gather_copy_out`: `split_with_sizes_copy`) on the compute
    # stream when the unit waits for it; the reduce-scatter's copy-in concatenates the unsharded
    # gradients cast to reduce_dtype (`_chunk_cat`) on the reduce-scatter stream. Memory-bound
    # element-wise kernels; ZeRO-1/2 (contiguous parameter and gradient buffers) have none.
    def _fsdp_copy(self, name: str, nbytes: float, stream: str, deps: list[int]) -> int:
        return add_cost(self.t, self.ranks, "fsdp_copy", Cost(0.0, 0.0, float(nbytes)), fused=TRAINING_FUSED,
                        name=name, stream=stream, deps=deps)[-1]

    def _copy_in(self, unit: Unit, fam: str, deps: list[int]) -> list[int]:
        if not self.fsdp2_copies:
            return deps
        k = self.k
        local = -(-unit.params // self.layout.fsdp) if fam == "fsdp" else -(-unit.expert_params // self.layout.efsdp)
        # the cast reads the fp32 shard and writes param_dtype; the copy reads and writes param_dtype
        return [self._fsdp_copy(f"{unit.name}.{fam}_ag_copy_in", local * (k.master_bytes + 3 * k.act_bytes),
                                "fsdp_ag", deps)]

    def _copy_out(self, unit: Unit, deps: list[int], name: str = "wait_gather") -> int:
        """The unit's first kernel waits for its gathers: FSDP2's copy-out (reads the all-gather
        output, writes the unsharded parameters), or a zero-cost marker without copies."""
        if not self.fsdp2_copies:
            return self.t.compute(self.ranks, fixed_time_s=0.0, deps=deps, name=name, stream=self.stream)
        gathered = (unit.params if "fsdp" in self.fams else 0) + (unit.expert_params if "efsdp" in self.fams else 0)
        return add_cost(self.t, self.ranks, "fsdp_copy", Cost(0.0, 0.0, 2.0 * gathered * self.k.act_bytes),
                        fused=TRAINING_FUSED, name=f"{unit.name}.fsdp_copy_out", stream=self.stream, deps=deps)[-1]

    def _first_main_dep(self, deps: list[int], unit: Unit) -> None:
        if deps:
            self.last_main = self._copy_out(unit, deps)

    # ------------------------------------------------------------------ iteration
    def build(self) -> Trace:
        units = self.plan.units
        order = [(i, "fwd") for i in range(len(units))] + [(i, "bwd") for i in reversed(range(len(units)))]
        release = [-1] * len(order)
        rs_ops: list[int] = []
        first_decoder = next((i for i, u in enumerate(units) if u.decoder), 0)
        gathers: dict[int, list[int]] = {}  # position -> its gathers, once issued
        for pos, (i, phase) in enumerate(order):
            unit = units[i]
            if pos not in gathers:
                gathers[pos] = self._gathers(unit, pos, release)
            if phase == "bwd":  # pre-backward prefetch: the next units' gathers before this backward
                for ahead in range(pos + 1, min(pos + self.k.prefetch, len(order) - 1) + 1):
                    if ahead not in gathers:
                        gathers[ahead] = self._gathers(units[order[ahead][0]], ahead, release)
            self._first_main_dep(gathers.pop(pos), unit)
            if phase == "fwd":
                for sub in unit.subs:
                    self._sub(i, sub, "fwd", True)
            else:
                if self.k.unit_ac(units, i) != AcMode.none:
                    for sub in unit.subs:
                        self._sub(i, sub, "rfwd", True)
                for j, sub in reversed(list(enumerate(unit.subs))):
                    first = i == first_decoder and j == 0 and not self.plan.first_input_needs_grad
                    self._sub(i, sub, "bwd", not first)
                rs_ops += self._reduce_scatters(unit, len(rs_ops))
            release[pos] = self.last_main
        self._optimizer(rs_ops)
        return self.t

    def _optimizer(self, rs_ops: list[int]) -> None:
        """Adam on this rank's fp32 shard: read/write master weights and both moments, read grads."""
        local = sum(self.layout.shard_params(u) for u in self.plan.units)
        self.last_main = self._adam(local, "optimizer.step", self._clip(local, "optimizer", rs_ops[-1:]))

    def _clip(self, local: int, name: str, deps: list[int]) -> list[int]:
        """torchtitan's gradient clipping (`clip_grad_norm_`, foreach): the norm of the rank's
        gradient shard (reads it), the squared norms summed over the data-parallel (and tensor-
        parallel) groups by an all-reduce of one fp32 (DTensor `full_tensor()`), then the shard
        scaled by the clip coefficient (reads and writes it)."""
        if not self.k.grad_clip:
            return deps
        g = local * self.k.grad_bytes
        last = add_cost(self.t, self.ranks, "optimizer", Cost(0.0, 2.0 * local, g), fused=TRAINING_FUSED,
                        name=f"{name}.clip_norm", deps=deps)[-1]
        for fam in ("fsdp", "efsdp", "tp"):
            if fam in self.fams:
                last = self.t.collective("allreduce", fam, 4.0, ranks=self.ranks, stream=self.stream, deps=[last],
                                         name=f"{name}.clip_norm_{fam}_allreduce")
        return add_cost(self.t, self.ranks, "optimizer", Cost(0.0, float(local), 2 * g), fused=TRAINING_FUSED,
                        name=f"{name}.clip_scale", deps=[last])[-1:]

    def _adam(self, local: int, name: str, deps: list[int]) -> int:
        """Adam over `local` parameters: read/write fp32 master weights and both moments, read grads."""
        k = self.k
        hbm = local * (2 * k.master_bytes + k.grad_bytes + 2 * k.state_bytes)
        return add_cost(self.t, self.ranks, "optimizer", Cost(0.0, local * k.optimizer_flops_per_param, hbm),
                        fused=TRAINING_FUSED, name=name, deps=deps)[-1]


# FP8 / INT8 tokens carry one fp32 scale per 128 channels (DeepEP's per-token FP8 cast:
# tests/legacy/test_internode.py @dd758ca, fp8_factor = (1 + 4/128) / 2 of BF16)
SCALE_BYTES_PER_128 = 4.0


def moe_shape(plan: ModelPlan, layout: Layout, formats: Formats, knobs: Knobs) -> MoeShape:
    """The MoeShape of a training iteration: bytes per token copy of the forward dispatch (the
    model's dispatch format, with its per-128-channel scales when quantised) and of the combine
    (the activations' format), experts per rank and top_k."""
    fmt = FORMAT_BYTES[formats.dispatch]
    dispatch = plan.hidden * fmt + (plan.hidden / 128 * SCALE_BYTES_PER_128 if fmt <= 1 else 0.0)
    return MoeShape(float(dispatch), float(plan.hidden * knobs.act_bytes), plan.n_experts // layout.ep, plan.top_k)


def build_iteration(plan: ModelPlan, layout: Layout, knobs: Knobs,
                    routing: dict[int, np.ndarray] | None = None, meta: dict | None = None,
                    moe: MoeShape | None = None) -> Trace:
    return IterationBuilder(plan, layout, knobs, routing, meta, moe).build()
