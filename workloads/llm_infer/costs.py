"""Per-layer costs and memory of the served model, from its transformers definition.

Costs are measured by `workloads.modelcost` (real modules on fake tensors, loaded through
`workloads.common.model`) at a few anchor shapes and interpolated piecewise-linearly in between
(FLOPs and bytes are piecewise linear in batch and context for decode, near-linear between
prefill anchors), so a run measures ~12 shapes however many shape buckets the scheduler visits.
Measurements are cached on disk.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from stratacl.errors import ConfigError
from stratacl.vocab import KernelClass as K
from workloads.common.cost import Cost
from workloads.common.expert_load import DieLoad
from workloads.common.placement import Placement, contiguous, eplb
from workloads.llm_infer.schema import LayoutConfig
from workloads.modelcost import ATTENTION_CORE_FORMAT, ModelCosts
from workloads.modelcost.phase import CostPhase

CORE = ".core"  # suffix of an attention type's core part when it runs in another format

DECODE_BATCH = (1, 8, 32, 128, 512)  # sequences per die
PREFILL_TOKENS = (256, 1024, 4096, 16384)  # tokens per die per iteration
# cached tokens per decode sequence, and those each prefill sequence attends over beyond its own (a
# reused prefix): attention's work is piecewise linear in them (dense keys, compressed entries and
# indexer scores grow with them; a sparse attention's selected keys stop growing at its top-k: at
# 4 × 512 = 2048 tokens for DeepSeek-V4's compressed sparse attention). Interpolated linearly
# between anchors, extrapolated past the last (an anchor per kink keeps that exact: with anchors
# 1024 and 8192 alone, decode at 110K tokens was priced 6.7 % over its own measured shape).
DECODE_CONTEXT = (1024, 2048, 8192, 32768, 131072)
PREFILL_CONTEXT = (0, 2048, 8192, 32768, 131072)


@dataclass(frozen=True)
class MoeWork:
    """A micro-batch's MoE layer on every die (`ServingCosts.moe_per_die`): the gate before the
    dispatch and a local shared expert, both on the die's own tokens; the routed experts at
    `scale` (per die) of the measured rows, with `weights` (per die) of expert weights to read."""

    gate: Cost
    shared: Cost
    routed: Cost
    scale: np.ndarray
    weights: np.ndarray


@dataclass(frozen=True, slots=True)
class MeasuredShape:
    """One measured shape of a phase: tokens per die after `context` cached tokens each."""

    tokens: int
    context: int
    phase: str


class ServingCosts:
    """Interpolated per-die layer costs for prefill and decode on one EP layout."""

    def __init__(self, mc: ModelCosts, prefill_ep: int, decode_ep: int, seq_len: int, *,
                 layout: LayoutConfig | None = None, shares: np.ndarray | None = None) -> None:
        """`layout`: expert placement knobs (None: contiguous experts); `shares`: the expected
        expert popularity an EPLB placement balances (None: uniform)."""
        self.mc = mc
        self.prefill_ep = prefill_ep
        self.decode_ep = decode_ep
        self.seq_len = seq_len
        self.attn_plan = mc.attention_plan()
        self.ffn_plan = mc.layer_plan()
        self.layers = list(zip(self.attn_plan, self.ffn_plan, strict=True))
        self.layer_counts = Counter(self.layers)
        info = mc.moe_info()
        self.experts = int(info.get("n_routed_experts", 0))
        self.top_k = int(info.get("top_k", 0))
        self.hidden = int(mc.cfg.hidden_size)
        self.placement: dict[str, Placement] = {}
        if not self.experts:  # a dense model serves data-parallel: every die holds the whole model
            self.prefill_ep = self.decode_ep = 1
        else:
            self._place(info, layout, shares)
        # the EP size per-die costs are measured at: the placement's, or (ep not dividing the
        # experts) the largest divisor of the expert count below it; `moe_per_die` rescales
        self.measure_ep = {ph: _divisor_at_most(self.experts, ep) if self.experts else 1
                           for ph, ep in (("prefill", self.prefill_ep), ("decode", self.decode_ep))}
        # format each layer type's matmuls run in; an attention layer whose projections are
        # quantised keeps its core (scores, values) in bf16: priced as a separate `<type>.core`
        self.dtypes = mc.matmul_formats()
        self.split_core = mc.core_split_types()
        for t in self.split_core:
            self.dtypes[t + CORE] = ATTENTION_CORE_FORMAT
        self._memo: dict[MeasuredShape, dict[str, Cost]] = {}

    def _measure(self, tokens: int, context: int, phase: str) -> dict[str, Cost]:
        key = MeasuredShape(tokens, context, phase)
        hit = self._memo.get(key)
        if hit is None:
            ep = self.measure_ep[phase]
            seq = min(tokens, self.seq_len) if phase == CostPhase.prefill else None
            raw = self.mc.costs_for_shape(tokens, context=context, phase=phase, ep=ep, seq_len=seq)
            hit = {t: c.cost for t, c in raw.items()}
            if self.split_core:
                cores = self.mc.split_cores(tokens, context=context, phase=phase, ep=ep, seq_len=seq)
                for t in self.split_core:
                    # the core kernel (FusedInferAttentionScore-style: scores and values on the
                    # cube, softmax and top-k on the vector units) takes its own vector work along
                    core = cores.get(t, Cost())
                    hit[t] = hit[t] - core
                    hit[t + CORE] = core
            self._memo[key] = hit
        return hit

    def _place(self, info: dict, layout: LayoutConfig | None, shares: np.ndarray | None) -> None:
        """Expert placement per phase, and the per-layer expert weight bytes it moves around."""
        e = self.experts
        shares = np.full(e, 1.0 / e) if shares is None else np.asarray(shares, dtype=float)
        inter = int(info.get("moe_intermediate", 0)) or 1
        # shared-expert rows per token in routed-expert-row units (its width over a routed expert's)
        self.shared_weight = int(info.get("n_shared_experts", 0)) * int(info.get("shared_intermediate", 0)) / inter
        by_role = self.mc.weight_bytes_by_role(tp=1, ep=1)
        n_moe = max(int(info.get("n_moe_layers", 0)), 1)
        self.expert_bytes = by_role.get("moe_experts", 0.0) / (n_moe * e)  # one routed expert, one layer
        self.shared_bytes = by_role.get("shared_experts", 0.0) / n_moe  # all shared experts, one layer
        self.n_moe_layers = n_moe
        self.expert_imbalance: dict[str, float] = {}
        self.die_load: dict[str, DieLoad] = {}  # expected rows per die with one token on every die
        kind = str(layout.expert_placement) if layout is not None else "contiguous"
        for phase, ep in (("prefill", self.prefill_ep), ("decode", self.decode_ep)):
            red = getattr(layout, f"{phase}_redundant_experts", 0) if layout is not None else 0
            shr = getattr(layout, f"{phase}_shared_expert_replicas", 0) if layout is not None else 0
            if kind == "contiguous":
                if red or shr:
                    raise ConfigError("workload.layout.expert_placement", f"{phase}: redundant experts and "
                                      "shared-expert replicas need a balancing placement", "set it to eplb")
                if e % ep:
                    raise ConfigError(f"workload.layout.{phase}_ep", f"EP {ep} does not divide the model's "
                                      f"{e} routed experts", "choose a divisor of the expert count, or "
                                      "expert_placement=eplb with redundant experts / shared-expert replicas")
                self.placement[phase] = contiguous(e, ep)
            else:
                if shr and not self.shared_weight:
                    raise ConfigError(f"workload.layout.{phase}_shared_expert_replicas",
                                      "the model has no shared expert", "set it to 0")
                self.placement[phase] = eplb(shares, ep, self.top_k, red, shr, self.shared_weight)
            rows = self.placement[phase].die_rows(shares, self.top_k)
            # the busiest die's expected expert rows over the mean: the router skew the placement leaves
            self.expert_imbalance[phase] = float(rows.max() / rows.mean()) if rows.mean() > 0 else 1.0
            self.die_load[phase] = DieLoad.of(rows * ep)

    def load_note(self, exponent: float, derived: str) -> str:
        """The router law and the per-die expert load each phase's placement leaves (expected
        rows with one token on every die; a step's sampled batch adds its noise to these)."""
        lay = (f"{self.placement[p].ep} dies, {len(self.placement[p].slot_expert)} expert slots"
               for p in ("prefill", "decode"))
        loads = "; ".join(self.die_load[p].line(f"{p} ({d})") for p, d in zip(("prefill", "decode"), lay, strict=True))
        return f"router load: Zipf exponent {exponent:.3f} ({derived}); {loads}"

    def moe_per_die(self, phase: str, cost: Cost, tokens: float, rows: np.ndarray) -> MoeWork:
        """One micro-batch's MoE work on every die under the phase's placement. `cost` was
        measured with `tokens` per die on `measure_ep` dies; `rows`: the weighted routed (and
        shared-replica) rows each die received. The gate (router GEMM, top-k and the permutes of
        the die's own token copies) and a local shared expert follow the die's own tokens; the
        routed experts follow the rows it received; a shared expert with replicas runs on the
        replica dies as rows of theirs (in `rows`), so no die runs it for its own tokens."""
        pl = self.placement[phase]
        e_m = self.experts // self.measure_ep[phase]
        var = cost.less_bytes(e_m * self.expert_bytes + self.shared_bytes)  # weights re-added per die
        shared = self.shared_bytes if pl.shared_local else pl.shared_slots_per_die() * self.shared_bytes
        weights = np.broadcast_to(np.asarray(pl.routed_slots_per_die() * self.expert_bytes + shared,
                                             dtype=float), (pl.ep,)).copy()
        ref = tokens * self.top_k
        if not var.parts:  # no measured breakdown: all of it follows the rows, a local shared expert's too
            local = tokens * self.shared_weight if pl.shared_local else 0.0
            scale = (rows + local) / (ref + local) if ref + local > 0 else np.ones(pl.ep)
            return MoeWork(Cost(), Cost(), var, scale, weights)
        router = var.matmuls(K.gemm, lambda g: (g[1], g[2]) == (self.experts, self.hidden))  # a logit per expert
        gate = var.only(K.routing) + router
        local = (var.only(K.gemm) - router).clip() if pl.shared_local else Cost()
        routed = var - var.only(K.routing, K.gemm)
        return MoeWork(gate, local, routed.clip(), rows / ref if ref > 0 else np.ones(pl.ep), weights)

    def decode(self, batch: float, context: float) -> dict[str, Cost]:
        """Costs of a decode step of `batch` sequences per die with `context` cached tokens."""
        return self._in_context(DECODE_CONTEXT, DECODE_BATCH, "decode", batch, context)

    def prefill(self, tokens: float, context: float = 0.0) -> dict[str, Cost]:
        """Costs of a prefill iteration of `tokens` per die whose sequences also attend over
        `context` cached tokens each (a reused prefix; 0: none)."""
        if context <= 0:
            return _interp(PREFILL_TOKENS, [self._measure(t, 0, "prefill") for t in PREFILL_TOKENS], tokens)
        return self._in_context(PREFILL_CONTEXT, PREFILL_TOKENS, "prefill", tokens, context)

    def _in_context(self, contexts: tuple[int, ...], sizes: tuple[int, ...], phase: str, size: float,
                    context: float) -> dict[str, Cost]:
        """Piecewise linear in size at the two context anchors around `context`, then between them."""
        i = int(np.clip(np.searchsorted(contexts, context) - 1, 0, len(contexts) - 2))
        lo, hi = contexts[i], contexts[i + 1]
        at = [_interp(sizes, [self._measure(x, c, phase) for x in sizes], size) for c in (lo, hi)]
        return {t: at[0][t].lerp(at[1][t], (context - lo) / (hi - lo)) for t in at[0]}


def _divisor_at_most(n: int, k: int) -> int:
    return max(d for d in range(1, min(n, k) + 1) if n % d == 0)


def _interp(xs: tuple[int, ...], values: list[dict[str, Cost]], x: float) -> dict[str, Cost]:
    """Piecewise-linear in x between anchors (linear extrapolation beyond the ends)."""
    i = int(np.clip(np.searchsorted(xs, x) - 1, 0, len(xs) - 2))
    w = (x - xs[i]) / (xs[i + 1] - xs[i])
    return {t: values[i][t].lerp(values[i + 1][t], w) for t in values[i]}


def payload_bytes(costs: ServingCosts, scale_ratio: float) -> tuple[float, float]:
    """Bytes per token copy of the dispatch and the combine. The dispatch carries the tokens in
    the dispatch format (the activations entering the experts' matmuls), plus per-group scales
    when it is narrower than 16 bits: INT8 + scales = hidden·(1 + 512/7168) (REFERENCE §5). The
    combine returns expert outputs in its format (BF16: 14 KB per token at hidden 7168)."""
    f, dt = costs.mc.formats, costs.mc.dtype_bytes
    disp = f.bytes("dispatch", dt)
    scales = scale_ratio if disp < 2 else 0.0
    return costs.hidden * (disp + scales), costs.hidden * f.bytes("combine", dt)
