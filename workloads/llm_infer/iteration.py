"""Iteration times of one prefill or decode instance, simulated on the fabric per library.

An iteration is the whole layer stack of one instance (DP attention on every die, EP MoE across
them): per layer and micro-batch the attention kernel, the MoE dispatch (HT mode in prefill,
whose count-exchange step the library adds; LL mode in decode), the experts and the combine. With two-batch overlap
the two micro-batches overlap: one's dispatch/combine (and, in decode with the CloudMatrix
layout, its MoE compute) runs while the other computes, and both share the dies' cores and HBM in
the engine. Every layer type's work becomes the kernels `workloads/common/kernels.py` assigns
(serving fuses attention and the W8A8 experts: mixed kernels). With MTP a decode step verifies
two tokens per sequence and runs the MTP layer. The shape rules (micro-batches, verified tokens, MTP
layer) are the scheduler's (scheduling.py), the same the memory model allocates by. A decode step
runs as a captured graph (`decode_graph_capture`): its graph launch precedes its work, unless an
operator that needs the host makes the library's step run eagerly (`step_graph_launch_s`). Traces
are built once per grid shape (same routing for every library) and results memoised per (library,
shape); an iteration is priced by linear interpolation between the grid shapes around it (the grid
below).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace

import numpy as np

from stratacl.trace import REGISTERED, MoeShape, Trace
from stratacl.vocab import MoeMode, OpKind
from stratacl.workload_api import RunContext, end_of
from workloads.common.cost import Cost
from workloads.common.expert_load import router_shares
from workloads.common.kernels import (
    INFERENCE_FUSED,
    add_cost,
    apply_stream_limits,
    check_layout,
    layout_on_die,
    split_note,
    stream_limits,
)
from workloads.common.placement import copies
from workloads.common.routing import group_tokens, model_group_limit, route
from workloads.llm_infer import scheduling as rules
from workloads.llm_infer.costs import CORE, ServingCosts, payload_bytes
from workloads.llm_infer.scheduling import ServingPhase
from workloads.llm_infer.schema import LlmInferConfig, StreamLayout

# Shapes. A prefill iteration is priced exactly: its own trace at its own token count (memoised).
# Prefill time in tokens is a staircase a grid cannot follow within 2 %: the kernel model's tile
# padding and wave quantisation step it by 3-5 % within a few hundred tokens (tests/test_llm_infer.py's
# model: just past every multiple of 4096 tokens per die), and a chord across a step misses a shape
# beside it by up to the step. Cost: ~0.5 s per distinct count and library. Under load chunked
# prefill fills its budget, so a run visits few counts (6 in the default run, 5 in its 10-minute
# version); light load with generated prompt lengths visits about one per request (228 in 60 s at
# 5 req/s Poisson: 203 s).
# A decode step is priced on a shape grid: traces are simulated at grid shapes only (each once per
# library, the same routing for every library) and a step by bilinear interpolation in batch and
# context between the grid shapes that bracket it; a shape on the grid is priced exactly. Each
# dimension's grid is unbounded (every shape a run reaches has a grid shape above it: nothing is
# clamped) and `per_octave` points split each octave evenly above `per_octave · unit`, every
# multiple of `unit` below (small integer batches are priced exactly). A step in the number of
# micro-batches (`tbo_min_tokens`) is never interpolated across.
# Error bound: within 2 % of pricing the shape's own trace (tests/test_llm_infer.py draws seeded
# random shapes and simulates each exactly). Decode time is near-linear in batch and context between
# neighbouring points, so this spacing measured ≤ 0.8 % on the default deployment; if a change to the compute model breaks the bound,
# raise that dimension's `per_octave` (each doubling halves the spacing) until the test passes.
BATCH_GRID = (1, 2)  # (unit, per_octave): decode sequences per die: 1, 2, 3, then 4, 6, 8, 12, 16, 24, ...
CONTEXT_GRID = (256, 1)  # cached tokens per sequence: 0, 256, then octaves 512, 1024, 2048, ...
ROUTING_SAMPLES = 4  # distinct routing draws cycled over layers (keeps trace building cheap)
MISS_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # JIT misses per iteration with a trace of their own
# DRAM-pool fetches of a prefill iteration are priced at a shape rounded up (never under-priced):
# fetching dies and the busiest die's fetched 512-token blocks each to a power of two (at most 2x
# the bytes; a finer grid multiplies the distinct prefill traces a run simulates: 47 fetch shapes
# in the default run at two points per octave)
FETCH_GRID = (512, 1)
# a prefill's context (earlier tokens of its prompts: a reused prefix, earlier chunks) is priced by
# linear interpolation between the points of 0, 1024, 2048, 4096, ... around it, each at the
# iteration's own token count: attention's work is linear in the keys it spans, and with the cost
# anchors' matmuls paired (`workloads.common.cost.lerp_gemms`) so is the exact iteration between
# grid points: within 0.25 % on tests/test_llm_infer.py's model (the test bounds it at 2 %).
# Pricing a context at its nearest point instead was off by 2-3 %; the anchors' shapes unpaired
# (the nearer anchor's, rows fitted) put a +12 % tile-padding step into the exact time itself.
PREFILL_CONTEXT_GRID = (1024, 1)
POOL_FETCH, POOL_STORE = "kv_fetch", "kv_store"  # streams of the prefix cache's DRAM-pool copies
PREFIX_SEND = "kv_prefix"  # stream of a reused prefix's KV on its way to decode


def fetch_shape(per_die: list[int], dp: int) -> tuple[int, int] | tuple[()]:
    """(dies, tokens) a prefill iteration with `per_die` pool-fetched tokens is priced at; () none."""
    busy = [t for t in per_die if t > 0]
    if not busy:
        return ()
    dies = min(dp, 1 << (len(busy) - 1).bit_length())
    top = max(busy)
    lo, hi, w = bracket(FETCH_GRID, top)
    return dies, hi if w > 0 else lo


def grid_step(grid: tuple[int, int], x: float) -> int:
    """Spacing of `grid` at x: `unit` below `per_octave · unit`, else the octave [2^j, 2^(j+1)) ∋ x
    split into `per_octave` steps."""
    unit, per_octave = grid
    if x < unit * per_octave:
        return unit
    return max(unit, (1 << (int(x) // unit).bit_length() - 1) * unit // per_octave)


def bracket(grid: tuple[int, int], x: float, step_at: int = 0) -> tuple[int, int, float]:
    """Grid points lo ≤ x ≤ hi around x and x's weight on hi (0 when x is a grid point). With
    `step_at` the priced quantity steps between step_at − 1 and step_at (integer shapes): the
    bracket stays on x's side of the step, its end there becoming a grid point."""
    h = grid_step(grid, x)
    lo = int(x // h * h)
    if lo == x:
        return lo, lo, 0.0
    hi = lo + h
    if step_at and lo < step_at <= hi:
        lo, hi = (lo, step_at - 1) if x < step_at else (step_at, hi)
        if x in (lo, hi):
            return int(x), int(x), 0.0
    return lo, hi, (x - lo) / (hi - lo)


def _mix(parts: list[tuple[float, IterStats]]) -> IterStats:
    """The weighted sum of iteration statistics (weights summing to 1); one part: itself."""
    if len(parts) == 1:
        return parts[0][1]
    rows = [(w, st.__dict__.values()) for w, st in parts]
    return IterStats(*[sum(x) for x in zip(*[[w * v for v in vals] for w, vals in rows], strict=True)])


@dataclass(frozen=True, slots=True)
class IterShape:
    """One iteration's shape, which keys its memoised trace (the same for every library) and its
    per-library statistics. `remap`, `jit_misses`, `fetch`, `send`: as `IterationModel.build`;
    `fetch`/`send` are (dies, tokens per die), () for none."""

    phase: ServingPhase
    size: float
    context: float
    remap: bool = False
    jit_misses: int = 0
    fetch: tuple[int, ...] = ()
    send: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class RoutingKey:
    """What one set of routing draws is memoised by: the phase (its expert placement), the
    instance's dies, tokens per die and the MoE kernel mode."""

    phase: ServingPhase
    ranks: int
    tokens: int
    mode: str


@dataclass(frozen=True)
class IterStats:
    time_s: float
    compute_s: float  # time some compute kernel runs (union over streams)
    exposed_comm_s: float  # time nothing computes: communication on the critical path
    copy_s: float  # staging copies on the path (summed over comm ops)
    register_s: float  # registration waits (summed)
    vector_core_s: float  # vector-core-seconds held by communication
    kv_ready_s: float = 0.0  # prefill: when the last KV byte of this iteration lands on a decode die
    launch_s: float = 0.0  # graph launches on the step's path (in time_s): captured-graph decode
    prefix_ready_s: float = 0.0  # prefill: when a reused prefix's KV sent on to decode has landed there
    # the counterfactual split of time_s (stratacl/engine/counterfactual.py; the terms sum to it):
    # the graph launch is in cf_launch_s, a DRAM-pool fetch or prefix send added to the step in cf_wire_s
    cf_compute_s: float = 0.0
    cf_wire_s: float = 0.0
    cf_sync_s: float = 0.0
    cf_copy_s: float = 0.0
    cf_register_s: float = 0.0
    cf_launch_s: float = 0.0
    cf_host_s: float = 0.0
    cf_contention_s: float = 0.0


CF_COLUMNS = tuple(f.name for f in fields(IterStats) if f.name.startswith("cf_"))


class IterationModel:
    def __init__(self, ctx: RunContext, costs: ServingCosts, cfg: LlmInferConfig, *,
                 kv_bytes_per_token: float = 0.0, decode_dies: tuple[int, ...] = (),
                 pool_writes: bool = False) -> None:
        """Scheduler (TBO, MTP), instance sizes, routing skew and dispatch format from `cfg`;
        the routing seed is the run's. With `decode_dies`, prefill iterations also send their
        tokens' KV cache (`kv_bytes_per_token`) to those dies: prefill die i to decode_dies[i mod D].
        `pool_writes`: prefill iterations also write their tokens' KV through to the DRAM pool
        (prefix.py: the EMS tier of the prefix cache)."""
        self.ctx = ctx
        self.costs = costs
        self.sched = cfg.scheduler
        fab = ctx.fabric
        self.decode_layout = layout_on_die(cfg.scheduler.decode_stream_layout, fab.cube_cores, fab.vector_cores)
        check_layout(self.decode_layout, fab.cube_cores, fab.vector_cores, "workload.scheduler.decode_stream_layout")
        self.ranks = {ServingPhase.prefill: cfg.layout.prefill_dp, ServingPhase.decode: cfg.layout.decode_dp}
        self.kv_bytes_per_token = kv_bytes_per_token
        self.decode_dies = tuple(decode_dies)
        self.pool_writes = pool_writes and kv_bytes_per_token > 0
        self.seed = seed = ctx.seed
        self.weights = router_shares(cfg.skew, cfg.zipf_s, cfg.expert_load, costs.experts, seed) if costs.experts else None
        self.group_limit = model_group_limit(costs.mc.cfg)  # node-limited routing, as the model's gate
        self.dispatch_bytes, self.combine_bytes = payload_bytes(costs, cfg.dispatch_scale_ratio)
        self._traces: dict[IterShape, Trace] = {}
        self._stats: dict[str, dict[IterShape, IterStats]] = {}  # by library
        self._t_iter: dict[tuple[str, IterShape], float] = {}  # as run, for a split made later
        self.reports_split = ctx.counterfactual_enabled  # output.counterfactual: the frames carry the split
        self.split = self.reports_split  # whether iterations priced now are split (False while probing())
        self._routing: dict[RoutingKey, list[tuple[np.ndarray, np.ndarray, np.ndarray | tuple]]] = {}
        self.simulated = 0
        # the size at which an iteration turns from one micro-batch to two (none without TBO)
        self._tbo_step = max(2, self.sched.tbo_min_tokens) if rules.max_micro_batches(self.sched) > 1 else 0

    # ------------------------------------------------------------------ public
    @property
    def micro_batch_edge(self) -> int:
        """The batch per die at which an iteration turns from one micro-batch to two (0: never)."""
        return self._tbo_step

    def decode(self, library: str, batch: float, context: float, remap: bool = False,
               jit_miss: float = 0.0) -> IterStats:
        """A decode step of `batch` sequences per die; `remap`: the allocator mapped new memory in
        it (registration-on-allocation remaps); `jit_miss`: the fraction of MoE dispatch/combine
        buffer uses that paid a registration at use (a JIT cache's misses; both from the die's
        allocator model, which reports misses only for a registrar that pays at use)."""
        b0, b1, wb = bracket(BATCH_GRID, batch, self._tbo_step)
        c0, c1, wc = bracket(CONTEXT_GRID, context)
        corners = [((b, c), u * v) for b, u in ((b0, 1 - wb), (b1, wb)) for c, v in ((c0, 1 - wc), (c1, wc))]
        return _mix([(w, self._get(library, IterShape(ServingPhase.decode, b, c, remap), jit_miss)) for (b, c), w in corners if w > 0])

    def prefill(self, library: str, tokens: float, remap: bool = False, jit_miss: float = 0.0,
                fetch_tokens: list[int] | None = None, context: float = 0.0,
                send_tokens: list[int] | None = None) -> IterStats:
        """A prefill iteration of `tokens` per die (whole tokens), priced exactly by its own trace.
        `context`: the earlier prompt tokens its sequences attend over (a cached prefix, earlier
        chunks), interpolated between the PREFILL_CONTEXT_GRID points around it. `fetch_tokens`:
        per die, cached tokens whose KV the iteration first fetches from the DRAM pool (prefix hits
        there): the iteration takes what that fetch adds to a full-budget iteration (`fetch_delay`).
        `send_tokens`: per die, the reused prefix tokens of the prompts it starts, whose KV (in its
        HBM, the pool's part once fetched) it also sends to their decode die (`prefix_send`)."""
        lo, hi, w = bracket(PREFILL_CONTEXT_GRID, context) if context > 0 else (0, 0, 0.0)
        size = math.ceil(tokens)
        st = _mix([(u, self._get(library, IterShape(ServingPhase.prefill, size, c, remap), jit_miss))
                   for c, u in ((lo, 1 - w), (hi, w)) if u > 0])
        shape = fetch_shape(fetch_tokens or [], len(fetch_tokens or []))
        d = self.fetch_delay(library, shape) if shape else 0.0
        send = fetch_shape(send_tokens or [], len(send_tokens or []))
        slow, ready = self.prefix_send(library, send) if send else (0.0, 0.0)
        if not d and not send:
            return st
        # the prefix's send ends when it does on the reference iteration (pool blocks once fetched:
        # shifted by the fetch's delay); its requests go to decode when both it and their own KV landed
        return replace(st, time_s=st.time_s + d + slow, exposed_comm_s=st.exposed_comm_s + d + slow,
                       kv_ready_s=st.kv_ready_s + d + slow, prefix_ready_s=d + ready if send else 0.0,
                       cf_wire_s=st.cf_wire_s + d + slow)

    def fetch_delay(self, library: str, shape: tuple[int, int]) -> float:
        """What a DRAM-pool fetch of `shape` (dies, tokens per die) adds to a prefill iteration: the
        difference between a full-budget iteration (`prefill_token_budget` tokens per die, no
        context) with the fetch in its trace — sharing the dies' ports with its all-to-alls and KV
        sends, each layer's attention waiting for its layer's KV — and without. Measured once per
        shape rather than per (tokens, context, shape): the delay is set by the fetch's bytes
        against the ports and CPU links, and pricing every combination multiplied the prefill
        traces a run simulates (85 of 105 in the default run)."""
        return self._added(library, fetch=shape)[0]

    def prefix_send(self, library: str, shape: tuple[int, int]) -> tuple[float, float]:
        """(what sending a reused prefix's KV of `shape` (dies, tokens per die) to decode adds to a
        prefill iteration, when its last byte lands on the decode dies), both measured on a
        full-budget iteration with the send in its trace: it leaves at the iteration's start layer by
        layer and shares the dies' ports with the all-to-alls and the computed tokens' KV. The
        decode instance needs the whole prompt's KV: Mooncake (Qin et al., FAST 2025, §3: KVCache
        reuse, incremental prefill, KVCache transfer, decoding) reuses the prefix on the prefill node
        and transfers the request's KVCache to the decode node. Measured once per shape, like
        `fetch_delay`."""
        added, with_send = self._added(library, send=shape)
        return added, with_send.prefix_ready_s

    def _added(self, library: str, fetch: tuple[int, ...] = (), send: tuple[int, ...] = ()) -> tuple[float, IterStats]:
        """(what a pool fetch / prefix send adds to a full-budget prefill iteration without context,
        that iteration with it): the one reference `fetch_delay` and `prefix_send` measure against."""
        ref = IterShape(ServingPhase.prefill, self.sched.prefill_token_budget, 0)
        with self.probing():  # only their times are used
            with_it = self._get(library, replace(ref, fetch=fetch, send=send))
            return max(0.0, with_it.time_s - self._get(library, ref).time_s), with_it

    def exact(self, library: str, phase: ServingPhase, size: float, context: float = 0.0) -> IterStats:
        """An iteration priced at its own shape: its own trace built and simulated (no grid; the
        reference the grid's interpolation is tested against)."""
        return self._stats_of(library, IterShape(ServingPhase(phase), size, context))

    def _get(self, library: str, shape: IterShape, jit_miss: float = 0.0) -> IterStats:
        """`shape` (no JIT misses of its own) with a fraction `jit_miss` of its dispatch/combine
        buffer uses missing the library's registrar (a buffer it does not hold at use)."""
        lib = self.ctx.libraries[library]
        if shape.remap and not lib.cost_depends_on_mapping:
            shape = replace(shape, remap=False)  # a remap costs nothing to a library that does not care
        if jit_miss <= 0:
            return self._stats_of(library, shape)
        # the misses go into the trace as whole registrations; between two miss counts the
        # iteration is interpolated (each miss adds one registration on its collective's path)
        n = self.moe_buffer_uses(shape.phase, shape.size)
        k = min(float(n), jit_miss * n)
        points = sorted({b for b in MISS_BUCKETS if b < n} | {n})
        lo = points[bisect.bisect_right(points, k) - 1]
        hi = points[bisect.bisect_left(points, k)]
        if lo == hi:
            return self._stats_of(library, replace(shape, jit_misses=hi))
        w = (k - lo) / (hi - lo)
        a = self._stats_of(library, replace(shape, jit_misses=lo))
        b = self._stats_of(library, replace(shape, jit_misses=hi))
        return _mix([(1 - w, a), (w, b)])

    def _stats_of(self, library: str, shape: IterShape) -> IterStats:
        memo = self._stats.setdefault(library, {})
        hit = memo.get(shape)
        if hit is None:
            hit = memo[shape] = self._measure(self._trace_of(shape), library, shape)
        elif self.split and math.isnan(hit.cf_compute_s):  # first priced while probing: split it now
            t_iter = self._t_iter[(library, shape)]
            hit = memo[shape] = replace(hit, **self._split(self._trace_of(shape), library, t_iter, hit.launch_s))
        return hit

    @contextmanager
    def probing(self) -> Iterator[None]:
        """Iterations priced inside are not split by counterfactual replays (their stats carry nan
        terms, filled the first time a reported run prices the shape): a capacity search's or a
        saturation run's iterations, and `_added`'s references, report no split."""
        was, self.split = self.split, False
        try:
            yield
        finally:
            self.split = was

    def _split(self, trace: Trace, library: str, t_iter: float, launch: float) -> dict[str, float]:
        """The counterfactual terms of an iteration that took `t_iter` as run (the graph launch in
        the launch term)."""
        streams = np.array([op.stream for op in trace.ops])
        iteration = ~np.isin(streams, ("kv", POOL_STORE, PREFIX_SEND))
        terms = self.ctx.counterfactual(trace, library, t_iter, end_of(iteration)).terms
        return {f"cf_{t}_s": v + (launch if t == "launch" else 0.0) for t, v in terms.items()}

    def moe_buffer_uses(self, phase: ServingPhase, size: float) -> int:
        """Dispatch + combine collectives of one iteration (each uses one receive buffer)."""
        c = self.costs
        if not c.experts:
            return 0
        moe_layers = sum(1 for _, ffn in self.layer_stack(phase) if ffn == "moe")
        return 2 * moe_layers * rules.micro_batches(self.sched, size)

    def layer_stack(self, phase: ServingPhase) -> list[tuple[str, str]]:
        """(attention, FFN) layer types a `phase` iteration runs: the model's, then with MTP on
        decode the MTP module, one more decoder layer of the last layer's types."""
        layers = list(self.costs.layers)
        return layers + layers[-1:] if rules.runs_mtp_layer(self.sched, phase) else layers

    def trace(self, phase: ServingPhase, size: float, context: float, remap: bool = False, jit_misses: int = 0,
              fetch: tuple[int, ...] = (), send: tuple[int, ...] = ()) -> Trace:
        """The (memoised) trace of one iteration shape; the same for every library."""
        return self._trace_of(IterShape(ServingPhase(phase), size, context, remap, jit_misses, fetch, send))

    def _trace_of(self, shape: IterShape) -> Trace:
        trace = self._traces.get(shape)
        if trace is None:
            trace = self._traces[shape] = self.build(shape.phase, shape.size, shape.context, shape.remap,
                                                     shape.jit_misses, shape.fetch, shape.send)
        return trace

    # ------------------------------------------------------------------ trace
    def build(self, phase: ServingPhase | str, size: int, context: int, remap: bool = False, jit_misses: int = 0,
              fetch: tuple = (), send: tuple = ()) -> Trace:
        """One iteration's trace. The dispatch/combine buffers were mapped (and registered) before
        it; with `remap` the allocator maps new memory for them in this iteration (the routing
        outgrew the mapping) at each layer's attention, which is when the router's output sizes
        them: registration-on-allocation then races the attention kernel. With `jit_misses`, that
        many of the dispatch/combine collectives (spread evenly) use a buffer a JIT registration
        cache does not hold: each registers it on its path. With `fetch` (dies, tokens): the first
        `dies` dies load `tokens` cached tokens' KV from the DRAM pool layer by layer, each layer's
        attention waiting for its layer's KV (layer-wise loading, as Mooncake's prefill does). With
        `send` (dies, tokens): the first `dies` dies also send `tokens` reused prefix tokens' KV to
        their decode dies, layer by layer from the start (`prefix_send`)."""
        phase = ServingPhase(phase)  # a plain "prefill"/"decode" is accepted too
        n = self.ranks[phase]
        c = self.costs
        kv_dst = self._kv_destinations(n) if phase == ServingPhase.prefill else []
        world = max([n, *(d + 1 for d in kv_dst)])
        tr = Trace(world_size=world, meta={"phase": phase.value, "size": size, "context": context, "remap": remap,
                                           "jit_misses": jit_misses, "fetch": list(fetch), "send": list(send)},
                   moe=self.moe_shape(phase))
        fetched = self._pool_fetch(tr, fetch, len(c.layers))
        if send and send[1] and kv_dst:  # the reused prefix's KV, already in HBM, leaves for decode
            for li in range(len(c.layers)):
                self._kv_send(tr, kv_dst[: send[0]], send[1] * self.kv_bytes_per_token / len(c.layers), [],
                              f"L{li}.kv_prefix", PREFIX_SEND)
        tr.add_family("ep", [range(n)])
        if not remap:
            tr.add_buffer("dispatch", REGISTERED)
            tr.add_buffer("combine", REGISTERED)
        uses = self.moe_buffer_uses(phase, size)
        miss = {j for j in range(uses) if (j + 1) * jit_misses // uses > j * jit_misses // uses} if uses else set()
        use = itertools.count()
        ranks = range(n)
        mbs = rules.micro_batches(self.sched, size)
        mb_tokens = rules.micro_batch_tokens(size, mbs)
        verify = rules.verify_factor(self.sched, phase)  # main model checks the draft token
        # per micro-batch: the layer costs of the main layers (verified tokens) and of the MTP layer
        if phase == ServingPhase.decode:
            main = [c.decode(t * verify, context) for t in mb_tokens]
            mtp = [c.decode(t, context) for t in mb_tokens]
        else:
            main = mtp = [c.prefill(t, context) for t in mb_tokens]
        mode = (MoeMode.ll if phase == ServingPhase.decode else MoeMode.ht).value  # the trace keeps the plain value
        # Streams. SGLang-style TBO (prefill; decode with stream layout "none"): one compute stream
        # and one communication stream; the micro-batches' kernels interleave on each, so one
        # micro-batch's dispatch/combine runs while the other computes (without TBO the same
        # streams simply alternate). CloudMatrix-Infer's decode pipeline (2506.12708 §4.2.3;
        # layout "cloudmatrix_tbo", two micro-batches): an attention-path stream (embedding,
        # attention, LM head) and a MoE-path stream (the FFN: dispatch, experts, combine) per die,
        # micro-batch 0's MoE path overlapping micro-batch 1's attention and vice versa, the die
        # split between them as 16 AIC + 32 AIV (attention path) and 8 AIC + 16 AIV (MoE path):
        # compute and communication kernels of a path hold at most its cores (a library may drop
        # the split: `stream_core_split`).
        paths = phase == ServingPhase.decode and mbs == 2 and self.decode_layout != StreamLayout.none
        cs, xs = ("attn_path", "moe_path") if paths else ("compute", "comm")
        fs = xs if paths else cs  # the FFN's compute stream
        if paths:
            apply_stream_limits(tr, stream_limits(self.decode_layout, (cs, xs)))
        last = [[self._compute(tr, ranks, main[m]["embedding"], cs, [], f"embedding.mb{m}", layer_type="embedding")]
                for m in range(mbs)]
        for li, (attn, ffn) in enumerate(self.layer_stack(phase)):
            is_mtp = li >= len(c.layers)
            costs = mtp if is_mtp else main
            rows = [t * (1 if is_mtp else verify) for t in mb_tokens]
            attn_op = []
            for m in range(mbs):
                cost = costs[m]
                deps = last[m] + fetched[li: li + 1]  # the layer's cached context is in HBM
                last[m] = [self._compute(tr, ranks, cost[attn], cs, deps, f"L{li}.attn.mb{m}", layer_type=attn)]
                if attn + CORE in cost:  # the bf16 attention core of a layer with quantised projections
                    last[m] = [self._compute(tr, ranks, cost[attn + CORE], cs, last[m], f"L{li}.attn_core.mb{m}",
                                             layer_type=attn + CORE)]
                attn_op.append(last[m][0])  # the attention's last op: a JIT buffer is registered after it
                layer_kv = mb_tokens[m] * self.kv_bytes_per_token / len(c.layers)
                if kv_dst:  # this layer's KV of the micro-batch's tokens leaves for decode
                    self._kv_send(tr, kv_dst, layer_kv, last[m], f"L{li}.kv.mb{m}")
                if self.pool_writes and phase == ServingPhase.prefill and li < len(c.layers):  # written through to EMS
                    tr.memcpy(ranks, layer_kv, peer="pool", direction="d2h", stream=POOL_STORE, deps=last[m],
                              name=f"L{li}.kv_store.mb{m}")
                if remap:
                    tr.add_buffer("dispatch", last[m][0])
                    tr.add_buffer("combine", last[m][0])
            if not (ffn == "moe" and c.experts):
                for m in range(mbs):
                    last[m] = [self._compute(tr, ranks, costs[m][ffn], fs, last[m], f"L{li}.{ffn}.mb{m}",
                                             layer_type=ffn)]
                continue
            routed = [self._routing_sample(phase, n, max(1, math.ceil(rows[m])), mode, li * mbs + m)
                      for m in range(mbs)]
            # issue order: stage by stage over the micro-batches on the SGLang streams; micro-batch
            # by micro-batch on the MoE-path stream (its gate, dispatch, experts, combine in a row)
            order = [(m, st) for m in range(mbs) for st in range(3)] if paths else \
                [(m, st) for st in range(3) for m in range(mbs)]
            work = [c.moe_per_die(phase, costs[m]["moe"], max(1, math.ceil(rows[m])), routed[m][1])
                    for m in range(mbs)]
            for m, st in order:
                disp, _, pairs = routed[m]
                if st == 0:
                    if work[m].gate.parts:  # the routing the dispatch sends by
                        last[m] = [self._compute(tr, ranks, work[m].gate, fs, last[m], f"L{li}.gate.mb{m}",
                                                 layer_type="moe")]
                    peer = disp * self.dispatch_bytes
                    buf = self._buffer(tr, "dispatch", li, m, next(use) in miss, attn_op[m])
                    last[m] = [tr.collective("dispatch", "ep", float(peer.sum(axis=1).max()), peer_bytes=peer,
                                             stream=xs, deps=last[m], buffer=buf, moe_mode=mode,
                                             group_tokens=pairs, name=f"L{li}.dispatch.mb{m}")]
                elif st == 1:
                    # each die's experts: the rows the placement sent it (skew: hot dies) and its weights
                    if work[m].shared.parts:
                        last[m] = [self._compute(tr, ranks, work[m].shared, fs, last[m], f"L{li}.shared.mb{m}",
                                                 layer_type="moe")]
                    last[m] = [self._compute(tr, ranks, work[m].routed, fs, last[m], f"L{li}.moe.mb{m}",
                                             work[m].scale, layer_type="moe", hbm_extra=work[m].weights)]
                else:
                    peer = disp.T * self.combine_bytes
                    buf = self._buffer(tr, "combine", li, m, next(use) in miss, attn_op[m])
                    last[m] = [tr.collective("combine", "ep", float(peer.sum(axis=1).max()), peer_bytes=peer,
                                             stream=xs, deps=last[m], buffer=buf, moe_mode=mode,
                                             group_tokens=pairs, name=f"L{li}.combine.mb{m}")]
        for m in range(mbs):
            self._compute(tr, ranks, main[m]["lm_head"], cs, last[m], f"lm_head.mb{m}", layer_type="lm_head")
        tr.validate()
        return tr

    @staticmethod
    def _buffer(tr: Trace, kind: str, layer: int, mb: int, missed: bool, alloc_op: int) -> str:
        """The user buffer a dispatch/combine uses: the shared one (registered before the trace,
        or remapped), or for a JIT miss its own, allocated at the layer's attention and so not in
        the registration cache when the collective starts."""
        if not missed:
            return kind
        return tr.add_buffer(f"{kind}.L{layer}.mb{mb}", alloc_op)

    def _pool_fetch(self, tr: Trace, fetch: tuple, layers: int) -> list[int]:
        """One host-to-device copy per layer of the fetched KV on the fetching dies (a stream of
        their own, in layer order); the op ids, by layer."""
        if not fetch or not fetch[0] or not fetch[1] or self.kv_bytes_per_token <= 0:
            return []
        dies, tokens = fetch
        nbytes = tokens * self.kv_bytes_per_token / layers
        return [tr.memcpy(range(dies), nbytes, peer="pool", direction="h2d", stream=POOL_FETCH,
                          name=f"L{li}.kv_fetch") for li in range(layers)]

    def _kv_destinations(self, n: int) -> list[int]:
        if not self.decode_dies or self.kv_bytes_per_token <= 0:
            return []
        return [self.decode_dies[i % len(self.decode_dies)] for i in range(n)]

    @staticmethod
    def _kv_send(tr: Trace, dst: list[int], nbytes: float, deps: list[int], name: str, stream: str = "kv") -> None:
        """Layer-wise KV transfer on its own stream: it shares the prefill dies' ports with the
        MoE all-to-alls and the decode dies' receive ports among senders."""
        if nbytes <= 0:
            return
        src = list(range(len(dst)))
        # p2p pairs must be distinct ranks: several prefill dies sending to one decode die are
        # issued as rounds of distinct receivers (they still share its port when they overlap)
        rounds: dict[int, list[int]] = {}
        for s_ in src:
            k = sum(1 for x in src[:s_] if dst[x] == dst[s_])
            rounds.setdefault(k, []).append(s_)
        for k, group in sorted(rounds.items()):
            d = [dst[x] for x in group]
            # no user buffer: the KV cache is registered when the engine starts (Mooncake-style)
            tr.add("p2p", sorted(group + d), src=group, dst=d, nbytes=nbytes, stream=stream, deps=deps,
                   name=f"{name}.r{k}")

    def _compute(self, tr: Trace, ranks: range, cost: Cost, stream: str, deps: list[int], name: str,
                 scale: np.ndarray | None = None, *, layer_type: str, hbm_extra: np.ndarray | float = 0.0) -> int:
        """The kernels of one layer type's work (serving's fused set), in its matmul format; returns
        the last one."""
        return add_cost(tr, ranks, layer_type, cost, fused=INFERENCE_FUSED, name=name, stream=stream, deps=deps,
                        scale=scale, dtype=self.costs.dtypes.get(layer_type, ""), hbm_extra=hbm_extra)[-1]

    def moe_shape(self, phase: ServingPhase) -> MoeShape | None:
        """The MoE shape the library lowers the phase's dispatch/combine with: the payload bytes per
        token copy and the routed-expert slots of the busiest die under the phase's placement (an LL
        kernel's per-expert receive windows, redundant replicas included); None for a dense model."""
        c = self.costs
        if not c.experts:
            return None
        slots = int(c.placement[phase].routed_slots_per_die().max())
        return MoeShape(float(self.dispatch_bytes), float(self.combine_bytes), slots, c.top_k)

    def _routing_sample(self, phase: ServingPhase, n: int, tokens: int, mode: str,
                        index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | tuple]:
        """(token copies between dies, weighted expert rows per die, the (token, destination
        block) counts a node-deduplicating HT dispatch reads — empty for LL) of one routing draw,
        through the phase's expert placement, node-limited as the model's config routes
        (`n_group` / `topk_group`)."""
        key = RoutingKey(phase, n, tokens, mode)
        samples = self._routing.get(key)
        if samples is None:
            rng = np.random.default_rng([self.seed, n, tokens, 0 if mode == MoeMode.ht else 1])
            samples = []
            pl = self.costs.placement[phase]
            for _ in range(ROUTING_SAMPLES):
                choice = route(tokens, n, self.costs.experts, self.costs.top_k, self.weights, rng, placed=True,
                               limit=self.group_limit)
                dest, weight = pl.destinations(choice)
                disp, rows = copies(dest, weight, n, per_expert=mode == MoeMode.ll)
                samples.append((disp, rows, group_tokens(dest, n) if mode == MoeMode.ht else ()))
            self._routing[key] = samples
        return samples[index % ROUTING_SAMPLES]

    # ------------------------------------------------------------------ measure
    def _measure(self, trace: Trace, library: str, shape: IterShape | None = None) -> IterStats:
        res = self.ctx.simulate(trace, library)
        self.simulated += 1
        streams = np.array([op.stream for op in trace.ops])
        kv, store, prefix = streams == "kv", streams == POOL_STORE, streams == PREFIX_SEND
        t_iter = float(res.end[~(kv | store | prefix)].max(initial=0.0))  # the next iteration may start; KV still in flight
        exp = res.exposure(window=(0.0, t_iter), ops=~(kv | store | prefix))
        launch = self.graph_launch_s(trace, library)
        kv_ready = float(res.end[~(store | prefix)].max(initial=0.0))  # decode waits for its KV, not for the pool's copy
        if shape is not None:
            self._t_iter[(library, shape)] = t_iter
        # output.counterfactual=false: zeros, and the frame drops the columns (serving.py); probing: nan
        cf = (dict.fromkeys(CF_COLUMNS, 0.0) if not self.ctx.counterfactual_enabled
              else self._split(trace, library, t_iter, launch) if self.split
              else dict.fromkeys(CF_COLUMNS, math.nan))
        return IterStats(exp.time_s + launch, exp.compute_s, exp.exposed_comm_s, exp.copy_s, exp.register_s,
                         exp.vector_core_s, kv_ready_s=kv_ready + launch, launch_s=launch,
                         prefix_ready_s=float(res.end[prefix].max(initial=0.0)), **cf)

    def graph_launch_s(self, trace: Trace, library: str) -> float:
        """Host time before a step's work when the deployment captures decode as a graph
        (`decode_graph_capture`; CloudMatrix-Infer, 2506.12708 §4.2.4): the library's
        `step_graph_launch_s` — one graph launch, or none when an operator that needs the host (the
        library's `needs_host`) makes the step run eagerly. The operators' device→host round trips
        are in the trace (each such collective's `host` phase). 0 for prefill (eager)."""
        if trace.meta["phase"] != ServingPhase.decode or not self.sched.decode_graph_capture:
            return 0.0
        lib = self.ctx.libraries[library]
        syncs = sum(1 for op in trace.ops if op.kind == OpKind.collective and len(op.ranks) > 1
                    and lib.needs_host(op.coll, op.moe_mode))
        return lib.step_graph_launch_s(syncs)


def decode_split_note(ctx: RunContext, cfg: LlmInferConfig) -> str | None:
    """The run's note on its decode stream split (`workloads.common.kernels.split_note`)."""
    dropped = [name for name, lib in ctx.libraries.items() if not lib.cfg.stream_core_split]
    return split_note(cfg.scheduler.decode_stream_layout, cfg.scheduler.tbo, dropped)
