"""Per-layer costs and memory of the served model, from its transformers definition.

Costs are measured by `workloads.modelcost` (real modules on fake tensors, loaded through
`workloads.common.model`) at a few anchor shapes and interpolated piecewise-linearly in between
(FLOPs and bytes are piecewise linear in batch and context for decode, near-linear between
prefill anchors), so a run measures ~12 shapes however many shape buckets the scheduler visits.
Measurements are cached on disk.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from stratacl.errors import ConfigError
from workloads.common.cost import Cost
from workloads.modelcost import ModelCosts
from workloads.modelcost.costs import ATTENTION_CORE_FORMAT

CORE = ".core"  # suffix of an attention type's core part when it runs in another format

DECODE_BATCH = (1, 8, 32, 128, 512)  # sequences per die
DECODE_CONTEXT = (1024, 8192)  # cached tokens per sequence
PREFILL_TOKENS = (256, 1024, 4096, 16384)  # tokens per die per iteration


class ServingCosts:
    """Interpolated per-die layer costs for prefill and decode on one EP layout."""

    def __init__(self, mc: ModelCosts, prefill_ep: int, decode_ep: int, seq_len: int) -> None:
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
        if not self.experts:  # a dense model serves data-parallel: every die holds the whole model
            self.prefill_ep = self.decode_ep = 1
        for ep, field in ((prefill_ep, "prefill_ep"), (decode_ep, "decode_ep")):
            if self.experts and self.experts % ep:
                raise ConfigError(f"workload.layout.{field}", f"EP {ep} does not divide the model's "
                                  f"{self.experts} routed experts", "choose a divisor of the expert count")
        # format each layer type's matmuls run in; an attention layer whose projections are
        # quantised keeps its core (scores, values) in bf16: priced as a separate `<type>.core`
        self.dtypes = mc.matmul_formats()
        self.split_core = {t for t in dict.fromkeys(self.attn_plan) if self.dtypes[t] != ATTENTION_CORE_FORMAT}
        for t in self.split_core:
            self.dtypes[t + CORE] = ATTENTION_CORE_FORMAT
        self._memo: dict[tuple, dict[str, Cost]] = {}

    def _measure(self, tokens: int, context: int, phase: str) -> dict[str, Cost]:
        key = (tokens, context, phase)
        hit = self._memo.get(key)
        if hit is None:
            ep = self.decode_ep if phase == "decode" else self.prefill_ep
            seq = min(tokens, self.seq_len) if phase == "prefill" else None
            raw = self.mc.costs_for_shape(tokens, context=context, phase=phase, ep=ep, seq_len=seq)
            hit = {t: c.cost for t, c in raw.items()}
            if self.split_core:
                cores = self.mc.attention_cores(tokens, context=context, phase=phase, ep=ep, seq_len=seq)
                for t in self.split_core:
                    core = Cost(float(cores[t].cube_flops)) if t in cores else Cost()
                    hit[t] = hit[t] - core
                    hit[t + CORE] = core
            self._memo[key] = hit
        return hit

    def decode(self, batch: float, context: float) -> dict[str, Cost]:
        """Costs of a decode step of `batch` sequences per die with `context` cached tokens."""
        lo_c, hi_c = DECODE_CONTEXT
        w = (context - lo_c) / (hi_c - lo_c)
        at = [_interp(DECODE_BATCH, [self._measure(b, c, "decode") for b in DECODE_BATCH], batch)
              for c in DECODE_CONTEXT]
        return {t: at[0][t].lerp(at[1][t], w) for t in at[0]}

    def prefill(self, tokens: float) -> dict[str, Cost]:
        return _interp(PREFILL_TOKENS, [self._measure(t, 0, "prefill") for t in PREFILL_TOKENS], tokens)


def _interp(xs: tuple[int, ...], values: list[dict[str, Cost]], x: float) -> dict[str, Cost]:
    """Piecewise-linear in x between anchors (linear extrapolation beyond the ends)."""
    i = int(np.clip(np.searchsorted(xs, x) - 1, 0, len(xs) - 2))
    w = (x - xs[i]) / (xs[i + 1] - xs[i])
    return {t: values[i][t].lerp(values[i + 1][t], w) for t in values[i]}
