"""HBM of a serving die, from the device-allocator model, and the registration facts its
iterations produce.

Start-up, as vLLM / SGLang do it on each die (vLLM `determine_available_memory`):
1. the library creates its communicators; a buffer-centric library holds their buffers, sized as
   deployments size them (stratacl/comm/buffers.py), and a pool library its pool — outside the
   PyTorch allocator, so they shrink what the allocator may reserve;
2. the weights are loaded, tensor by tensor, into the allocator;
3. a profiling forward at the scheduler's largest shape (`profile_tokens`: the chunked-prefill
   budget on prefill, the fused dispatch's token cap on decode; the expected routing) runs
   through the allocator; its peak *reserved* memory — allocated tensors
   plus what the allocator could not reuse (fragmentation, far more with expandable segments off)
   — is what the framework keeps for activations: the KV cache gets the rest;
4. `empty_cache`, then the KV cache is allocated (one tensor per layer).

Fixed-shape runs (workload.mode=fixed, fixed.py) start the same die with the fixed shape as the
largest forward (`profile`): one memory model for both modes.

Serving then runs every iteration's tensors (tensors.py; shaped by the scheduler's rules,
scheduling.py, as the iteration's trace is) through the library's `DieMemory` (stratacl/memory),
with the library's registrar (stratacl/memory/mechanism.py) listening to its allocator's events: a map event
whenever an iteration needs more memory than the allocator has mapped (a remap) is what
registration-on-allocation registers; a registrar that pays at use (a JIT registration cache) is
also shown each MoE dispatch / combine receive buffer by address range. Those two facts per
iteration (remapped or not, how many uses paid a registration) go into the iteration's simulated
trace (iteration.py), which prices them on the fabric.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from stratacl.errors import ConfigError
from stratacl.memory import DieMemory, GiB, OutOfMemoryError
from stratacl.memory.communicators import Communicator, MoeWindows
from stratacl.workload_api import Library, RegistrationMechanism
from workloads.common.cost import Cost
from workloads.common.placement import Placement, contiguous
from workloads.common.routing import by_rank
from workloads.llm_infer import scheduling as rules
from workloads.llm_infer.costs import ServingCosts, payload_bytes
from workloads.llm_infer.scheduling import ServingPhase
from workloads.llm_infer.schema import LlmInferConfig
from workloads.llm_infer.tensors import ServingTensors
from workloads.modelcost import ModelCosts

# vLLM-Ascend's buffer sizes per process group (vllm_ascend/utils.py, get_hccl_config_for_pg_options):
# 200 MiB by default; the DP group max(ceil((dp + 1) * 4 B / MiB), 50) MiB; the MoE (MC2) group none
# of its own — it takes HCCL_BUFFSIZE, which the deployment raises to the operator's documented need
DEFAULT_GROUP_MiB = 200.0
DP_GROUP_MIN_MiB = 50.0


def communicators(role: str, dp: int, tensors: ServingTensors, cfg: LlmInferConfig) -> list[Communicator]:
    """The communicators one die of a `role` instance creates (vLLM-Ascend-style DP attention +
    EP): the instance's world group, the DP-attention group, the EP group, on decode the MC2 group
    of the fused dispatch/combine, and the prefill→decode KV-transfer group. TP is 1 with DP
    attention (a one-rank group holds no buffers)."""
    dp_MiB = max(float(np.ceil((dp + 1) * 4 / 2**20)), DP_GROUP_MIN_MiB)
    comms = [Communicator("world", dp, DEFAULT_GROUP_MiB), Communicator("tp", 1, DEFAULT_GROUP_MiB),
             Communicator("dp", dp, dp_MiB), Communicator("ep", dp, DEFAULT_GROUP_MiB),
             Communicator("pd", 2, DEFAULT_GROUP_MiB)]
    if role == ServingPhase.decode and tensors.experts:
        shared = 1 if tensors.shared_inter else 0
        comms.append(Communicator("mc2", dp, None, MoeWindows(
            max_tokens=cfg.scheduler.moe_dispatch_max_tokens, hidden=tensors.hidden, top_k=tensors.top_k,
            local_experts=max(1, tensors.experts // dp), shared_experts=shared)))
    return comms


@dataclass(frozen=True)
class MemoryPlan:
    """Where one die's HBM goes (bytes)."""

    hbm: float
    comm_buffers: float  # library: communicator buffers (outside the allocator)
    pool: float  # library: pre-registered pool (outside the allocator)
    weights: float
    activations: float  # reserved for the profiling forward beyond the weights (incl. fragmentation)
    kv: float
    reserved_peak: float  # allocator: reserved bytes at their peak so far
    fragmentation: float  # allocator: reserved peak - allocated peak
    expandable_segments: bool

    @property
    def library(self) -> float:
        return self.comm_buffers + self.pool


def registers_user_buffers(library: Library) -> bool:
    """Whether the library registers user buffers (just in time or on allocation): only then do
    the allocator model's events reach its cost."""
    return library.user_buffer_registration != RegistrationMechanism.none


@dataclass
class StepMemory:
    maps: int = 0  # map events during the iteration (registration-on-allocation remaps)
    lookups: int = 0  # uses of dispatch / combine receive buffers shown to a registrar that pays at use
    misses: int = 0  # ... of which paid a registration
def weight_bytes_per_die(mc: ModelCosts, ep: int, costs: ServingCosts | None = None, phase: str = "") -> float:
    """Weights of one die's shard, each weight class in its numeric format (workload.model.quant).
    With `costs`, the experts follow its `phase` placement: the fullest die's slots (routed,
    redundant and shared-expert replicas) plus the non-expert weights every die holds."""
    if costs is None or not costs.experts:
        return float(sum(mc.weight_bytes_by_role(tp=1, ep=ep).values()))
    by_role = mc.weight_bytes_by_role(tp=1, ep=1)
    rest = sum(v for k, v in by_role.items() if k not in ("moe_experts", "shared_experts"))
    experts = costs.moe_per_die(phase, Cost(), 0.0, np.zeros(costs.placement[phase].ep)).weights
    return float(rest + costs.n_moe_layers * experts.max())


def expert_scale(mc: ModelCosts, ep: int, costs: ServingCosts, phase: str) -> float:
    """Expert bytes on the fullest die of the `phase` placement (redundant and shared-expert
    replicas) over those of a plain EP shard: scales the die's expert tensors."""
    roles = mc.weight_bytes_by_role(tp=1, ep=ep)
    plain = roles.get("moe_experts", 0.0) + roles.get("shared_experts", 0.0)
    if plain <= 0:
        return 1.0
    placed = weight_bytes_per_die(mc, ep, costs, phase) - (sum(roles.values()) - plain)
    return placed / plain


def serving_tensors(costs: ServingCosts, cfg: LlmInferConfig, role: str) -> ServingTensors:
    """The tensors a `role` die allocates, from the shard the costs are measured on (an EP size that
    does not divide the experts: the largest divisor below it, the experts then rescaled to the
    placement by `expert_scale`); the dispatch buffer holds the tokens as the trace sends them
    (`payload_bytes`: the dispatch format, with scales when narrower than 16 bits)."""
    token = payload_bytes(costs, cfg.dispatch_scale_ratio)[0]
    return ServingTensors(costs.mc, costs.measure_ep[role], token)


def hot_share(weights: np.ndarray, ep: int, top_k: int, placement: Placement | None = None) -> float:
    """The share of an instance's top-k routed rows its busiest die receives, from the experts'
    expected shares (`weights`, sum 1): its block of experts (contiguous placement), or its slots
    under a balancing placement — a replicated expert's rows split evenly over its replicas, a
    shared-expert replica taking its share of every token's shared-expert row (in routed-row
    units, as the placement weighs it)."""
    experts = len(weights)
    if placement is None or (experts % ep == 0 and placement == contiguous(experts, ep)):
        return float(by_rank(weights, ep).max())
    se, sd = np.asarray(placement.slot_expert), np.asarray(placement.slot_die)
    reps = placement.replicas()
    routed = se < experts
    rows = np.bincount(sd[routed], weights=top_k * weights[se[routed]] / reps[se[routed]], minlength=ep)
    if not placement.shared_local:
        rows += placement.shared_slots_per_die() * placement.shared_weight / placement.shared_replicas
    return float(rows.max()) / top_k


def role_dies(tensors: ServingTensors, library: Library, cfg: LlmInferConfig, role: str, hbm_bytes: float,
              costs: ServingCosts, *, weights: np.ndarray | None, seed: int, instances: int = 1,
              profile: int | None = None) -> list[ServingDie]:
    """One allocator-model die (the busiest) per instance of `role`: the weights in their formats,
    the experts as the role's placement puts them (EPLB replicas), the MTP layer on decode."""
    scale = expert_scale(costs.mc, costs.measure_ep[role], costs, role)
    return [ServingDie(tensors, library, cfg, role, getattr(cfg.layout, f"{role}_dp"), hbm_bytes, weights=weights,
                       seed=seed, instance=i, expert_scale=scale, profile=profile,
                       placement=costs.placement.get(role))
            for i in range(instances)]


# Blocks seen from one allocator state replay from DieMemory's memo; a serving die sees many
# (layer kinds × micro-batch tokens × routed rows), more than DieMemory's default keeps.
MEMO_MAX = 4096
QUIET_MAX = 1 << 10  # residual sizes whose quiet blocks are kept (_iteration)
USER_BUFFERS = ("dispatch.", "combine.")  # the receive buffers a registrar is asked about at use


class ServingDie:
    """One die of an instance (its busiest: the hottest experts) driven iteration by iteration
    through the library's `DieMemory`: what is serving's own is the start-up order, the KV cache's
    size and each iteration's tensor lists."""

    def __init__(self, tensors: ServingTensors, library: Library, cfg: LlmInferConfig, role: str, dp: int,
                 hbm_bytes: float, *, weights: np.ndarray | None, seed: int, instance: int = 0,
                 expert_scale: float = 1.0, profile: int | None = None, placement: Placement | None = None) -> None:
        """`profile`: tokens per die of the profiling forward (verified draft tokens included);
        None: the scheduler's largest shape (`profile_tokens`). `placement`: the role's expert
        placement (None: contiguous blocks of experts)."""
        self.t = tensors
        self.expert_scale = expert_scale
        self.role = role
        self.library = library
        self.sched = cfg.scheduler
        comms = communicators(role, dp, tensors, cfg)
        self.comm_bytes = library.communicator_buffer_bytes(comms)
        self.pool_bytes = library.pool_bytes
        capacity = hbm_bytes - self.comm_bytes - self.pool_bytes
        shapes = ("the fixed shapes (workload.fixed)" if profile is not None
                  else "scheduler.prefill_token_budget or moe_dispatch_max_tokens")
        fix = f"raise the EP size, narrow the weights (workload.model.quant) or lower {shapes}"
        if capacity <= 0:
            raise ConfigError(f"workload.layout.{role}_ep", f"'{library.name}' holds {self.comm_bytes / GiB:.1f} GiB "
                              f"of buffers + {self.pool_bytes / GiB:.1f} GiB pool, more than the die's HBM", fix)
        self.mem: DieMemory = library.die_memory(capacity, dp - 1, expandable_segments=cfg.allocator.expandable_segments)
        self.mem.memo_max = MEMO_MAX
        self.alloc = self.mem.allocator
        self.moe = [x.ffn == "moe" and tensors.experts > 0 for x in tensors.layers]
        n_main = len(tensors.layers)
        mtp_layer = rules.runs_mtp_layer(self.sched, role)
        # the layers an iteration runs (the MTP module repeats the last layer's tensors)
        self.layers = list(range(n_main)) + ([n_main - 1] if mtp_layer else [])
        self._main = np.arange(len(self.layers)) < n_main
        # the die whose experts are hottest holds the largest MoE buffers: it sets the memory peak
        self.p_hot = hot_share(weights, dp, tensors.top_k, placement) if weights is not None and tensors.experts else 0.0
        self.rng = np.random.default_rng([seed, 11, instance, 0 if role == ServingPhase.prefill else 1])
        self.lookups = self.misses = 0  # uses shown to the registrar; those that paid a registration
        self._quiet: dict[int, dict[int, tuple[tuple, tuple[int, ...]]]] = {}  # see _iteration
        self._index: dict[int, QuietIndex] = {}  # by residual size: which blocks `_quiet` holds
        self._trials: dict[tuple, np.ndarray] = {}  # binomial trials per (layer, micro-batch), by shape
        self._quiet_calls = -1
        self.moe_pos = np.array([self.moe[li] for li in self.layers], dtype=bool)  # by layer position
        try:
            tokens = rules.profile_tokens(self.sched, role) if profile is None else profile
            self.plan = self._start_up(hbm_bytes, tokens, dp, cfg.allocator.memory_utilization)
        except OutOfMemoryError as exc:
            raise ConfigError(f"workload.layout.{role}_ep", f"the model does not fit a {role} die with "
                              f"'{library.name}': {exc}", fix) from None

    @property
    def maps(self) -> int:
        """Map events so far (cudaMalloc / page mappings): what registration-on-allocation sees."""
        return self.alloc.stats.num_device_alloc

    # ------------------------------------------------------------------ start-up
    def _start_up(self, hbm: float, profile_tokens: int, dp: int, utilisation: float) -> MemoryPlan:
        a, s, mem = self.alloc, self.alloc.stats, self.mem
        sizes = self._weight_tensors()
        try:
            for i, nbytes in enumerate(sizes):
                mem.alloc(f"w{i}", nbytes)
        except OutOfMemoryError:  # say what does not fit, not which tensor tipped it over
            raise OutOfMemoryError(f"the shard's weights need {sum(sizes) / GiB:.1f} GiB, more than the "
                                   f"{a.cfg.capacity_bytes / GiB:.1f} GiB the allocator may use ({hbm / GiB:.1f} "
                                   f"GiB HBM − {(self.comm_bytes + self.pool_bytes) / GiB:.1f} GiB held by the "
                                   "library)") from None
        weights = s.allocated_bytes
        if profile_tokens > 0:  # the profiling forward at the largest shape, expected routing
            seqs = max(1, profile_tokens // rules.verify_factor(self.sched, self.role))
            self._iteration(0.0, seqs, seqs * dp, expected=True)
        kv_budget = utilisation * hbm - self.comm_bytes - self.pool_bytes - s.reserved_bytes_peak
        if kv_budget <= self._kv_slack():
            raise OutOfMemoryError(f"{s.reserved_bytes_peak / GiB:.1f} GiB reserved by weights and the "
                                   f"profiling forward and {(self.comm_bytes + self.pool_bytes) / GiB:.1f} GiB "
                                   f"held by the library leave no KV cache in {utilisation:g} of "
                                   f"{hbm / GiB:.1f} GiB")
        activations = s.reserved_bytes_peak - weights
        a.empty_cache(0.0)
        for i, nbytes in enumerate(self.t.kv_tensors(kv_budget - self._kv_slack())):
            mem.alloc(f"kv{i}", nbytes)
        kv = float(s.allocated_bytes - weights)
        self._quiet.clear()  # the KV cache moved the state (perhaps without a device call)
        self._index.clear()
        return MemoryPlan(hbm, self.comm_bytes, self.pool_bytes, float(weights), float(activations), kv,
                          float(s.reserved_bytes_peak), float(s.fragmentation_bytes),
                          a.cfg.expandable_segments)

    def _weight_tensors(self) -> list[int]:
        """The shard's weight tensors, each in its class's format (tensors.py); the expert tensors
        scaled to the fullest die's slots of the role's placement (`expert_scale`, placement.py)."""
        sizes = self.t.weight_tensors()
        if self.expert_scale == 1.0:
            return sizes
        ids = set(self.t.expert_tensor_ids())
        return [int(round(b * self.expert_scale)) if i in ids else b for i, b in enumerate(sizes)]

    def _kv_slack(self) -> int:
        """Rounding of the per-layer KV tensors to whole segments (2 MiB each)."""
        return 2 * 2**20 * len(self.t.layers)

    def stats(self) -> MemoryPlan:
        s = self.alloc.stats
        p = self.plan
        return MemoryPlan(p.hbm, p.comm_buffers, p.pool, p.weights, p.activations, p.kv,
                          float(s.reserved_bytes_peak), float(s.fragmentation_bytes), p.expandable_segments)

    # ------------------------------------------------------------------ iterations
    def step(self, t: float, tokens: int, tokens_total: int) -> StepMemory:
        """One iteration starting at time t of `tokens` sequences (decode; each verifies a draft
        token with MTP) or prompt tokens (prefill) on this die, `tokens_total` over the instance
        (the routing spreads them over the dies' experts)."""
        maps0, look0, miss0 = self.maps, self.lookups, self.misses
        try:
            self._iteration(t, max(1, int(tokens)), max(1, int(tokens_total)))
        except OutOfMemoryError as exc:
            raise ConfigError(f"workload.layout.{self.role}_ep",
                              f"a {self.role} iteration of {tokens} tokens per die ran out of memory with "
                              f"'{self.library.name}' (more than the profiling forward reserved): {exc}",
                              "lower the scheduler's caps (prefill_token_budget, moe_dispatch_max_tokens)") from None
        return StepMemory(self.maps - maps0, self.lookups - look0, self.misses - miss0)

    def iteration_ops(self, tokens: int, tokens_total: int, expected: bool = False) -> Iterator[tuple]:
        """One iteration's tensor lists, in order: the residual stream opened, each layer's
        attention then FFN block per micro-batch (the scheduler's split, `scheduling.py`), the
        logits, the residual stream closed. Routed rows are drawn here (`expected`: their means)."""
        shape = self._shape(tokens, tokens_total, expected)
        yield self.t.open_ops(shape.res)
        for ops, _ in self._blocks(shape):
            yield ops
        yield self._logits(shape)
        yield self.t.close_ops()

    def _shape(self, tokens: int, tokens_total: int, expected: bool) -> _Shape:
        """An iteration's micro-batch split and its routed rows (drawn: the die's random stream)."""
        verify = rules.verify_factor(self.sched, self.role)
        mbs = rules.micro_batches(self.sched, tokens)
        res = tokens * verify
        main, mtp = rules.micro_batch_tokens(res, mbs), rules.micro_batch_tokens(tokens, mbs)
        return _Shape(res, mbs, main, mtp, self._rows(tokens_total, verify, mbs, expected))

    def _blocks(self, shape: _Shape) -> Iterator[tuple[tuple, tuple[int, int, int | None]]]:
        """Each layer's attention then FFN block per micro-batch: (ops, (position, micro-batch,
        routed rows — None for the attention block, 0 for a dense FFN))."""
        block, moe, n_main = self.t.block_ops, self.moe, len(self.t.layers)
        rows = shape.rows.tolist()
        for k, li in enumerate(self.layers):
            tok, r = (shape.main if k < n_main else shape.mtp), rows[k]
            for m in range(shape.mbs):
                yield block(li, m, tok[m], None), (k, m, None)
                routed = r[m] if moe[li] else 0
                yield block(li, m, tok[m], routed), (k, m, routed)

    def _logits(self, shape: _Shape) -> tuple:
        # every verified token on decode, the last token of a prompt on prefill
        return self.t.logits_ops(shape.res if self.role == ServingPhase.decode else 1)

    def _iteration(self, t: float, tokens: int, tokens_total: int, expected: bool = False) -> None:
        """Run one iteration's tensor lists through the die's memory (blocks seen from the same
        allocator state replay from its memo); a registrar that pays at use is shown each MoE receive
        buffer."""
        # A block (it frees what it allocates) that made no device call leaves the allocator's free
        # ranges as it found them: until the next device call, the same block after the same
        # residual stream gets the same addresses, and is not replayed (DieMemory's memo would
        # answer the same, at the price of hashing the allocator state and the op list).
        # Block op lists are shared objects (tensors.py): a repeat is found by identity.
        s = self.alloc.stats
        if s.num_device_alloc + s.num_device_free != self._quiet_calls or len(self._quiet) > QUIET_MAX:
            self._forget(s.num_device_alloc + s.num_device_free)  # by residual size
        shape = self._shape(tokens, tokens_total, expected)
        self._run(self.t.open_ops(shape.res), t, shape.res)
        index = self._index_of(shape)
        # a step whose every block is in `_quiet` replays nothing and, unless the registrar pays at
        # use, shows it nothing: the index answers for all its blocks at once (decode repeats its shapes)
        if self.mem.registrar.pays_at_use or not index.all_quiet(shape.rows, self.moe_pos):
            for ops, key in self._blocks(shape):
                if self._run(ops, t, shape.res):
                    self._index_of(shape).mark(*key)
        self._run(self._logits(shape), t, shape.res)
        self._run(self.t.close_ops(), t, shape.res)

    def _run(self, ops: tuple, t: float, res: int) -> bool:
        """One tensor list through the die's memory, unless `_quiet` holds it; whether it is (now) there."""
        mem, s = self.mem, self.alloc.stats
        at_use = mem.registrar.pays_at_use
        quiet = self._quiet.setdefault(res, {})
        seen = quiet.get(id(ops))
        if seen is not None:
            if not at_use:
                return True  # nothing to show the registrar
            addrs = seen[1]
        else:
            addrs = mem.run(ops, t) if len(ops) > 1 else _single(mem, ops[0], t)
            now = s.num_device_alloc + s.num_device_free
            if now != self._quiet_calls:
                self._forget(now)
            elif ops[0][0] == "alloc" and ops[-1][0] == "free":  # a block, not open / close
                quiet[id(ops)] = (ops, addrs)  # holding ops keeps its id unique
                seen = quiet[id(ops)]
        if at_use:
            for addr, size in _user_buffers(ops, addrs):
                self.lookups += 1
                if mem.registrar.wait_s(addr, size, t) > 0:
                    self.misses += 1
        return seen is not None

    def _forget(self, calls: int) -> None:
        """A device call moved the allocator's free ranges: no block is quiet any more."""
        self._quiet.clear()
        self._index.clear()
        self._quiet_calls = calls

    def _index_of(self, shape: _Shape) -> QuietIndex:
        """The index of `_quiet[shape.res]`; a new, empty one when the block lists were rebuilt (their
        new objects are not in `_quiet` until a block runs or is found there)."""
        index = self._index.get(shape.res)
        if index is None or index.generation != self.t.generation:
            index = self._index[shape.res] = QuietIndex(self._classes(shape), self.t.generation)
        return index

    def _classes(self, shape: _Shape) -> np.ndarray:
        """(position, micro-batch) → a class number: blocks of one class and routed rows are one
        op list (tensors.py: one per layer kind, tokens and routed rows)."""
        n_main, names = len(self.t.layers), {}
        return np.array([[names.setdefault((self.t.kind(li), (shape.main if k < n_main else shape.mtp)[m]),
                                           len(names)) for m in range(shape.mbs)]
                         for k, li in enumerate(self.layers)], dtype=np.int64).reshape(len(self.layers), shape.mbs)

    def _rows(self, tokens_total: int, verify: int, mbs: int, expected: bool) -> np.ndarray:
        """Rows routed to this die's experts per layer and micro-batch: each of the instance's
        tokens (`verify` per sequence in the main layers, one in the MTP layer) picks top_k
        experts, this die's with probability p_hot (binomial draws)."""
        n = self._trials.get((tokens_total, verify, mbs))
        if n is None:
            if len(self._trials) > QUIET_MAX:
                self._trials.clear()
            mult = np.where(self._main, verify, 1)
            n = self._trials[(tokens_total, verify, mbs)] = np.repeat(
                (tokens_total * mult * self.t.top_k // mbs)[:, None], mbs, axis=1)
        return np.rint(n * self.p_hot).astype(np.int64) if expected else self.rng.binomial(n, self.p_hot)


@dataclass
class _Shape:
    res: int  # tokens of the residual stream (verified tokens included)
    mbs: int
    main: tuple[int, ...]  # tokens per micro-batch in the main layers
    mtp: tuple[int, ...]  # ... in the MTP layer
    rows: np.ndarray  # routed rows per (layer position, micro-batch)


class QuietIndex:
    """Which blocks of one residual size `ServingDie._quiet` holds, as arrays a whole iteration is
    checked against at once: attention blocks by class, FFN blocks by (class, routed rows). Valid
    for one generation of the block lists (their objects are what `_quiet` holds)."""

    def __init__(self, classes: np.ndarray, generation: int) -> None:
        self.classes = classes
        self.generation = generation
        n = int(classes.max(initial=-1)) + 1
        self.attn = np.zeros(n, dtype=bool)
        self.ffn = np.zeros((n, 64), dtype=bool)

    def mark(self, k: int, m: int, routed: int | None) -> None:
        c = self.classes[k, m]
        if routed is None:
            self.attn[c] = True
            return
        if routed >= self.ffn.shape[1]:
            self.ffn = np.pad(self.ffn, ((0, 0), (0, max(routed + 1, 2 * self.ffn.shape[1]) - self.ffn.shape[1])))
        self.ffn[c, routed] = True

    def all_quiet(self, rows: np.ndarray, moe: np.ndarray) -> bool:
        """Whether every block of an iteration with these routed rows is held (`moe`: positions
        whose FFN routes; a dense FFN block is its class's routed 0)."""
        routed = np.where(moe[:, None], rows, 0)
        if not self.attn[self.classes].all() or routed.max(initial=0) >= self.ffn.shape[1]:
            return False
        return bool(self.ffn[self.classes, routed].all())


def _single(mem: DieMemory, op: tuple, t: float) -> tuple[int, ...]:
    """`mem.run((op,), t)` for one op, without its memo: a lone alloc or free is never memoised
    (it leaves a tensor live, or frees one it did not allocate)."""
    if op[0] == "alloc":
        return (mem.alloc(op[1], op[2], t).addr,)
    if op[0] == "free":
        mem.free(op[1], t)
        return ()
    return mem.run((op,), t)


def _user_buffers(ops: tuple, addrs: tuple[int, ...]) -> list[tuple[int, int]]:
    """(address, size) of the dispatch / combine receive buffers among a block's allocations."""
    allocs = [op for op in ops if op[0] == "alloc"]
    return [(a, op[2]) for op, a in zip(allocs, addrs, strict=True) if op[2] > 0 and op[1].startswith(USER_BUFFERS)]
