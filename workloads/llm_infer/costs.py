"""Per-layer costs and memory of the served model, from its transformers definition.

Costs are measured by `workloads.modelcost` (real modules on fake tensors) at a few anchor
shapes and interpolated piecewise-linearly in between (FLOPs and bytes are piecewise linear in
batch and context for decode, near-linear between prefill anchors), so a run measures ~12 shapes
however many shape buckets the scheduler visits. Measurements are cached on disk.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from stratacl.errors import ConfigError
from stratacl.schemas.llm_infer import ModelRef
from workloads.modelcost import LayerCost, ModelCosts, load_model_config
from workloads.modelcost.config import CONF_MODEL_DIR, config_from_node
from workloads.modelcost.errors import CostInputError, ModelConfigError

DECODE_BATCH = (1, 8, 32, 128, 512)  # sequences per die
DECODE_CONTEXT = (1024, 8192)  # cached tokens per sequence
PREFILL_TOKENS = (256, 1024, 4096, 16384)  # tokens per die per iteration


@dataclass(frozen=True)
class Cost:
    cube_flops: float
    vector_flops: float
    hbm_bytes: float  # fused estimate: weights read + activations in/out + KV read/write


def load_costs(ref: ModelRef, cache_dir: str) -> ModelCosts:
    try:
        if ref.preset:
            node = OmegaConf.to_container(OmegaConf.load(_preset_path(ref.preset)), resolve=True)
            node["overrides"] = {**(node.get("overrides") or {}), **dict(ref.overrides)}
            hf = config_from_node(node, where=f"conf/model/{ref.preset}.yaml")
        else:
            hf = load_model_config(ref.model_type or None, dict(ref.overrides) or None, ref.config_json or None)
        return ModelCosts(hf, dtype_bytes=ref.dtype_bytes, cache_dir=cache_dir or None)
    except (ModelConfigError, CostInputError, FileNotFoundError, ValueError) as exc:
        raise ConfigError("workload.model", str(exc), "use a conf/model preset, a transformers "
                          "model_type or a config.json path") from None


def _preset_path(name: str) -> Path:
    path = Path(CONF_MODEL_DIR) / f"{name}.yaml"
    if not path.is_file():
        names = sorted(p.stem for p in Path(CONF_MODEL_DIR).glob("*.yaml"))
        raise ConfigError("workload.model.preset", f"no model preset '{name}'", f"use one of {names}")
    return path


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
        self._memo: dict[tuple, dict[str, Cost]] = {}

    def _measure(self, tokens: int, context: int, phase: str) -> dict[str, Cost]:
        key = (tokens, context, phase)
        hit = self._memo.get(key)
        if hit is None:
            ep = self.decode_ep if phase == "decode" else self.prefill_ep
            seq = min(tokens, self.seq_len) if phase == "prefill" else None
            raw = self.mc.costs_for_shape(tokens, context=context, phase=phase, ep=ep, seq_len=seq)
            hit = self._memo[key] = {t: _cost(c) for t, c in raw.items()}
        return hit

    def decode(self, batch: float, context: float) -> dict[str, Cost]:
        """Costs of a decode step of `batch` sequences per die with `context` cached tokens."""
        lo_c, hi_c = DECODE_CONTEXT
        w = (context - lo_c) / (hi_c - lo_c)
        at = [_interp(DECODE_BATCH, [self._measure(b, c, "decode") for b in DECODE_BATCH], batch)
              for c in DECODE_CONTEXT]
        return {t: _lerp(at[0][t], at[1][t], w) for t in at[0]}

    def prefill(self, tokens: float) -> dict[str, Cost]:
        return _interp(PREFILL_TOKENS, [self._measure(t, 0, "prefill") for t in PREFILL_TOKENS], tokens)


def _cost(c: LayerCost) -> Cost:
    return Cost(float(c.cube_flops), float(c.vector_flops), float(c.hbm_bytes_fused))


def _lerp(a: Cost, b: Cost, w: float) -> Cost:
    return Cost(*(max(0.0, x + w * (y - x)) for x, y in ((a.cube_flops, b.cube_flops),
                (a.vector_flops, b.vector_flops), (a.hbm_bytes, b.hbm_bytes))))


def _interp(xs: tuple[int, ...], values: list[dict[str, Cost]], x: float) -> dict[str, Cost]:
    """Piecewise-linear in x between anchors (linear extrapolation beyond the ends)."""
    i = int(np.clip(np.searchsorted(xs, x) - 1, 0, len(xs) - 2))
    w = (x - xs[i]) / (xs[i + 1] - xs[i])
    return {t: _lerp(values[i][t], values[i + 1][t], w) for t in values[i]}
