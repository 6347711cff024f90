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

Serving then runs every iteration's tensors through the same allocator (tensors.py), with the
library's registration mechanism listening to its events: registration-on-allocation sees a map
event whenever an iteration needs more memory than the allocator has mapped (a remap); a JIT
registration cache looks up each MoE dispatch / combine receive buffer by address range. Those two
facts per iteration (remapped or not, how many registrations missed) go into the iteration's
simulated trace (iteration.py), which prices them on the fabric.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from stratacl.errors import ConfigError
from stratacl.memory import DieMemory, GiB, MemEvent, OutOfMemoryError
from stratacl.memory.communicators import Communicator, MoeWindows
from stratacl.schemas.llm_infer import LlmInferConfig
from stratacl.workload_api import Library
from workloads.common.cost import Cost
from workloads.common.placement import Placement, contiguous
from workloads.common.routing import by_rank
from workloads.llm_infer.costs import ServingCosts, payload_bytes
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
    if role == "decode" and tensors.experts:
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


@dataclass
class StepMemory:
    maps: int = 0  # map events during the iteration (registration-on-allocation remaps)
    lookups: int = 0  # JIT cache lookups (dispatch / combine receive buffers)
    misses: int = 0
def weight_bytes_per_die(mc: ModelCosts, ep: int, costs: ServingCosts | None = None, phase: str = "") -> float:
    """Weights of one die's shard, each weight class in its numeric format (workload.model.quant).
    With `costs`, the experts follow its `phase` placement: the fullest die's slots (routed,
    redundant and shared-expert replicas) plus the non-expert weights every die holds."""
    if costs is None or not costs.experts:
        return float(sum(mc.weight_bytes_by_role(tp=1, ep=ep).values()))
    by_role = mc.weight_bytes_by_role(tp=1, ep=1)
    rest = sum(v for k, v in by_role.items() if k not in ("moe_experts", "shared_experts"))
    _, _, experts = costs.moe_per_die(phase, Cost(), 0.0, np.zeros(costs.placement[phase].ep))
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
                       seed=seed, mtp_layer=cfg.scheduler.mtp and role == "decode", instance=i,
                       expert_scale=scale, profile=profile, placement=costs.placement.get(role))
            for i in range(instances)]


class ServingDie:
    """One die of an instance (its busiest: the hottest experts) driven iteration by iteration."""

    def __init__(self, tensors: ServingTensors, library: Library, cfg: LlmInferConfig, role: str, dp: int,
                 hbm_bytes: float, *, weights: np.ndarray | None, seed: int, mtp_layer: bool,
                 instance: int = 0, expert_scale: float = 1.0, profile: int | None = None,
                 placement: Placement | None = None) -> None:
        """`profile`: tokens per die of the profiling forward (verified draft tokens included);
        None: the scheduler's largest shape (`profile_tokens`). `placement`: the role's expert
        placement (None: contiguous blocks of experts)."""
        self.t = tensors
        self.expert_scale = expert_scale
        self.role = role
        self.library = library
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
        self.alloc = self.mem.allocator
        self.maps = self.version = self.memo_hits = 0
        self.live: dict = {}
        self._memo: dict[tuple, tuple] = {}
        # layers with the same tensors share memo entries
        kinds: dict = {}
        self.kind = [kinds.setdefault(x, len(kinds)) for x in tensors.layers]
        self.moe = [x.ffn == "moe" and tensors.experts > 0 for x in tensors.layers]
        n_main = len(tensors.layers)
        # tokens per layer: the main layers see the verified draft tokens too, the MTP layer not
        self._row_mult = {v: np.array([v if k < n_main else 1 for k in range(len(tensors.layers) + mtp_layer)],
                                      dtype=np.int64) for v in (1, 2)}
        self.alloc.subscribe(self._on_event)
        self.layers = list(range(len(tensors.layers))) + ([len(tensors.layers) - 1] if mtp_layer else [])
        self.mtp_layer = mtp_layer
        # the die whose experts are hottest holds the largest MoE buffers: it sets the memory peak
        self.p_hot = hot_share(weights, dp, tensors.top_k, placement) if weights is not None and tensors.experts else 0.0
        self.rng = np.random.default_rng([seed, 11, instance, 0 if role == "prefill" else 1])
        self.tbo, self.tbo_min = cfg.scheduler.tbo, cfg.scheduler.tbo_min_tokens
        self.jit_lookups = self.jit_misses = 0
        try:
            tokens = profile_tokens(cfg, role) if profile is None else profile
            self.plan = self._start_up(hbm_bytes, tokens, dp, cfg.allocator.memory_utilization)
        except OutOfMemoryError as exc:
            raise ConfigError(f"workload.layout.{role}_ep", f"the model does not fit a {role} die with "
                              f"'{library.name}': {exc}", fix) from None

    def _on_event(self, ev: MemEvent) -> None:
        self.version += 1  # any change of backing invalidates the layer memo's state
        if ev.kind == "map":
            self.maps += 1

    # ------------------------------------------------------------------ start-up
    def _start_up(self, hbm: float, profile_tokens: int, dp: int, utilisation: float) -> MemoryPlan:
        a, s = self.alloc, self.alloc.stats
        sizes = self._weight_tensors()
        try:
            for i, nbytes in enumerate(sizes):
                self.live[f"w{i}"] = a.malloc(nbytes, 0.0)
        except OutOfMemoryError:  # say what does not fit, not which tensor tipped it over
            raise OutOfMemoryError(f"the shard's weights need {sum(sizes) / GiB:.1f} GiB, more than the "
                                   f"{a.cfg.capacity_bytes / GiB:.1f} GiB the allocator may use ({hbm / GiB:.1f} "
                                   f"GiB HBM − {(self.comm_bytes + self.pool_bytes) / GiB:.1f} GiB held by the "
                                   "library)") from None
        weights = s.allocated_bytes
        verify = self._verify()
        if profile_tokens > 0:  # the profiling forward at the largest shape, expected routing
            seqs = max(1, profile_tokens // verify)
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
            self.live[f"kv{i}"] = a.malloc(nbytes, 0.0)
        kv = float(s.allocated_bytes - weights)
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
    def _verify(self) -> int:
        return 2 if (self.mtp_layer and self.role == "decode") else 1

    def step(self, t: float, tokens: int, tokens_total: int) -> StepMemory:
        """One iteration starting at time t of `tokens` sequences (decode; each verifies a draft
        token with MTP) or prompt tokens (prefill) on this die, `tokens_total` over the instance
        (the routing spreads them over the dies' experts)."""
        maps0, look0, miss0 = self.maps, self.jit_lookups, self.jit_misses
        try:
            self._iteration(t, max(1, int(tokens)), max(1, int(tokens_total)))
        except OutOfMemoryError as exc:
            raise ConfigError(f"workload.layout.{self.role}_ep",
                              f"a {self.role} iteration of {tokens} tokens per die ran out of memory with "
                              f"'{self.library.name}' (more than the profiling forward reserved): {exc}",
                              "lower the scheduler's caps (prefill_token_budget, moe_dispatch_max_tokens)") from None
        return StepMemory(self.maps - maps0, self.jit_lookups - look0, self.jit_misses - miss0)

    def _iteration(self, t: float, tokens: int, tokens_total: int, expected: bool = False) -> None:
        """Run one iteration's tensors. Blocks (and the logits) seen from the same allocator state
        replay from the memo; the iteration's residual stream is allocated for real only when a
        block has to run (every iteration leaves the allocator as it found it unless memory was
        mapped, which bumps `version`)."""
        verify = self._verify()
        n_main = len(self.t.layers)
        mbs = 2 if self.tbo and tokens >= max(2, self.tbo_min) else 1  # as the iteration trace splits
        res_tokens = tokens * verify
        self._open, self._t = None, t
        state = (self.version, res_tokens)  # the allocator state every block starts from
        main = _split(res_tokens, mbs)
        mtp = _split(tokens, mbs)
        rows = self._rows(tokens_total, verify, mbs, expected)
        memo, jit, kinds, moe = self._memo, self.mem.jit, self.kind, self.moe
        for k, li in enumerate(self.layers):
            tok = main if k < n_main else mtp
            r = rows[k] if moe[li] else (0,) * mbs
            for m in range(mbs):  # each micro-batch's attention block, then its FFN block
                for routed in (None, r[m]):
                    key = (state, kinds[li], tok[m], routed, m)
                    hit = memo.get(key)
                    if hit is None:
                        state, hit = self._block(state, key, res_tokens,
                                                 lambda li=li, m=m, tok=tok, routed=routed:
                                                 self.t.block_ops(li, m, tok[m], routed))
                    else:
                        self.memo_hits += 1
                    if hit and jit is not None:
                        for addr, size in hit:
                            self.jit_lookups += 1
                            if jit.lookup(addr, size) > 0:
                                self.jit_misses += 1
        # logits: every verified token on decode, the last token of a prompt on prefill
        rows_out = res_tokens if self.role == "decode" else 1
        key = (state, "logits", rows_out)
        if key not in memo:
            state, _ = self._block(state, key, res_tokens, lambda: self.t.logits_ops(rows_out))
        if self._open is not None:
            self._run(self.t.close_ops(), t)

    def _block(self, state: tuple, key: tuple, res_tokens: int, ops: Callable[[], tuple]) -> tuple[tuple, tuple]:
        """Run a block for real (opening the residual stream first if this iteration has not);
        memoise it if it mapped nothing. Returns the state key that holds afterwards and the
        block's registered buffers."""
        if self._open is None:
            self._run(self.t.open_ops(res_tokens), self._t)
            self._open = res_tokens
            if self.version != state[0]:  # opening mapped memory: a new state
                state = (self.version, res_tokens)
                key = (state, *key[1:])
                hit = self._memo.get(key)
                if hit is not None:
                    return state, hit
        version = self.version
        hit = self._run(ops(), self._t, collect=True)
        if self.version == version:  # quiet: the block left the allocator as it found it
            self._memo[key] = hit
            return state, hit
        return (self.version, res_tokens), hit

    def _rows(self, tokens_total: int, verify: int, mbs: int, expected: bool) -> list[list[int]]:
        """Rows routed to this die's experts per layer and micro-batch: each of the instance's
        tokens picks top_k experts, this die's with probability p_hot (binomial draws)."""
        mult = self._row_mult[verify]
        n = np.repeat((tokens_total * mult * self.t.top_k // mbs)[:, None], mbs, axis=1)
        r = np.rint(n * self.p_hot).astype(np.int64) if expected else self.rng.binomial(n, self.p_hot)
        return r.tolist()

    def _run(self, ops: tuple, t: float, collect: bool = False) -> tuple[tuple[int, int], ...]:
        """Apply ops to the allocator; with `collect`, the (address, size) of the dispatch and
        combine receive buffers (the user buffers a JIT cache registers)."""
        live, a = self.live, self.alloc
        out = []
        for op in ops:
            if op[0] == "alloc":
                b = a.malloc(op[2], t)
                live[op[1]] = b
                if collect and op[2] > 0 and op[1].startswith(("dispatch.", "combine.")):
                    out.append((b.addr, op[2]))
            else:
                a.free(live.pop(op[1]), t)
        return tuple(out)


def profile_tokens(cfg: LlmInferConfig, role: str) -> int:
    """Tokens per die of the largest forward the scheduler runs on a `role` die."""
    s = cfg.scheduler
    if role == "prefill":
        return s.prefill_token_budget
    verify = 2 if s.mtp else 1
    cap = s.moe_dispatch_max_tokens * (2 if s.tbo else 1)  # one fused dispatch per micro-batch
    if s.decode_max_batch:
        cap = min(cap, s.decode_max_batch * verify)
    return cap


def _split(tokens: int, mbs: int) -> tuple[int, ...]:
    if mbs == 1:
        return (tokens,)
    return (tokens - tokens // 2, tokens // 2)
