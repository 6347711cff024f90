"""HBM per die: weights of the shard, activation workspace, what the library holds, and the rest
for the KV cache. A library holding more memory loses exactly that much KV cache."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stratacl.errors import ConfigError
from stratacl.workload_api import Library
from workloads.common.cost import Cost
from workloads.llm_infer.costs import ServingCosts
from workloads.modelcost import ModelCosts

COMMUNICATORS_PER_RANK = 2  # the EP communicator and the instance-wide (DP) one


@dataclass(frozen=True)
class DieMemory:
    hbm_bytes: float
    weight_bytes: float
    activation_bytes: float
    library_bytes: float

    @property
    def kv_bytes(self) -> float:
        return self.hbm_bytes - self.weight_bytes - self.activation_bytes - self.library_bytes


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


def activation_workspace(mc: ModelCosts, tokens: int) -> float:
    """Working buffers of one layer for `tokens` tokens: residual in/out plus the dispatch and
    combine buffers that hold top-k copies of each token (an estimate; scale with the reserve knob)."""
    top_k = int(mc.moe_info().get("top_k", 0) or 0)
    return float(tokens * mc.cfg.hidden_size * mc.dtype_bytes * (2 + 2 * top_k))


def die_memory(mc: ModelCosts, ep: int, reserve_tokens: int, library: Library, hbm_bytes: float,
               role: str, costs: ServingCosts | None = None) -> DieMemory:
    mem = DieMemory(hbm_bytes, weight_bytes_per_die(mc, ep, costs, role), activation_workspace(mc, reserve_tokens),
                    library.held_memory_bytes(COMMUNICATORS_PER_RANK, "inference"))
    if mem.kv_bytes <= 0:
        raise ConfigError(f"workload.layout.{role}_ep",
                          f"the model does not fit: {mem.weight_bytes / 1e9:.1f} GB weights + "
                          f"{mem.activation_bytes / 1e9:.1f} GB activations + {mem.library_bytes / 1e9:.1f} GB "
                          f"held by '{library.name}' exceed {hbm_bytes / 1e9:.0f} GB HBM per die",
                          "raise the EP size, lower scheduler.activation_reserve_tokens or use a larger fabric")
    return mem
