"""Parameter counts by layer type, read off the modules' own parameters.

Roles: embedding, attention, dense_mlp, moe_experts, shared_experts, router, norms
(layer norms, hyper-connections, final norm), lm_head.
"""

from __future__ import annotations

import re
from collections import defaultdict

from torch import nn

from .fakemodel import is_moe

ROLES = ("embedding", "attention", "dense_mlp", "moe_experts", "shared_experts", "router", "norms", "lm_head")
_LAYER = re.compile(r"^(?:model\.)?layers\.(\d+)\.(.*)$")


def param_role(name: str, moe_layers: set[int]) -> str:
    """Role of a parameter from its fully-qualified name in a *ForCausalLM model."""
    if name.startswith("lm_head."):
        return "lm_head"
    if ".embed_tokens." in name or name.startswith("embed_tokens."):
        return "embedding"
    m = _LAYER.match(name)
    if m is None:
        return "norms"
    idx, rest = int(m.group(1)), m.group(2)
    if rest.startswith("self_attn."):
        return "attention"
    if rest.startswith("mlp."):
        sub = rest[len("mlp."):]
        if idx not in moe_layers:
            return "dense_mlp"
        if sub.startswith("experts."):
            return "moe_experts"
        if sub.startswith(("shared_expert", "shared_experts")):
            return "shared_experts"
        return "router"
    return "norms"


def moe_layer_ids(layers: nn.ModuleList) -> set[int]:
    return {i for i, layer in enumerate(layers) if is_moe(layer.mlp)}


def count_by_role(model: nn.Module, layers: nn.ModuleList) -> dict[str, int]:
    moe = moe_layer_ids(layers)
    out: dict[str, int] = defaultdict(int)
    for name, p in model.named_parameters():
        out[param_role(name, moe)] += p.numel()
    return dict(out)


def count_layer_by_role(layer: nn.Module, idx: int) -> dict[str, int]:
    """Roles of one decoder layer's parameters (`idx`: its index in the model)."""
    moe = {idx} if is_moe(layer.mlp) else set()
    out: dict[str, int] = defaultdict(int)
    for name, p in layer.named_parameters():
        out[param_role(f"model.layers.{idx}.{name}", moe)] += p.numel()
    return dict(out)
