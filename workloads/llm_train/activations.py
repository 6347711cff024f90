"""Bytes autograd saves for backward, per layer type, measured on the fake shard model.

Runs the model-cost piece's own forward (its routed-expert stand-in included) under
`saved_tensors_hooks` and attributes each saved tensor to the module running when it was saved.
Parameters are not activations and are skipped; a storage saved twice counts once. With
`flash_attention` (fused kernels, as training runs them), S×S attention scores (which eager
attention saves) are skipped: a fused attention kernel keeps only its inputs, output and the
log-sum-exp; and the fp32 copies eager code makes for numerics in a bf16 model (RMSNorm's
`hidden_states.to(torch.float32)`, upcast q / k / v) count at the compute dtype: a fused RMSNorm
or attention kernel upcasts in registers and keeps its bf16 input (e.g. FlashAttention's backward
takes q, k, v, out and the log-sum-exp).
"""

from __future__ import annotations

import torch

from workloads.modelcost import ModelCosts
from workloads.modelcost.fakemodel import base_model, decoder_layers


def saved_bytes_by_type(mc: ModelCosts, tokens: int, seq_len: int, tp: int, ep: int,
                        flash_attention: bool = True) -> dict[str, float]:
    """Saved activation bytes per layer type (attention*, dense_mlp, moe, embedding, lm_head)."""
    # the model-cost piece's shard model and its forward, observed by autograd's saved-tensor hooks
    shard = mc.shard_model(tp, ep)
    layout = mc.layout
    params = {p.untyped_storage()._cdata for p in shard.parameters()}
    state: dict[str, str | None] = {"tag": None}
    handles = []

    def tag(mod: torch.nn.Module, name: str | None) -> None:
        handles.append(mod.register_forward_pre_hook(lambda m, a: state.__setitem__("tag", name)))

    base = base_model(shard)
    tag(base, "embedding")
    for layer in decoder_layers(shard):
        i = layer._mc_idx
        attn = layout.attention[i] if layout.reps.get(layout.attention[i]) == i else None
        ffn = layout.ffn[i] if layout.reps.get(layout.ffn[i]) == i else None
        tag(layer, attn)
        tag(layer.mlp, ffn)
    if hasattr(base, "norm"):
        tag(base.norm, "lm_head")
    tag(shard.lm_head, "lm_head")

    saved: dict[str, float] = {}
    seen: set[int] = set()
    keep: list[torch.Tensor] = []  # hold every saved tensor: a freed storage's address could recur

    def pack(x: torch.Tensor) -> torch.Tensor:
        name = state["tag"]
        keep.append(x)
        storage = x.untyped_storage()
        key = storage._cdata
        if name is None or key in params or key in seen:
            return x
        if flash_attention and x.dim() >= 2 and x.shape[-1] == x.shape[-2] == seq_len and seq_len > 1:
            return x
        seen.add(key)
        nbytes = float(storage.nbytes())
        if flash_attention and x.dtype == torch.float32 and mc.dtype_bytes < 4:
            nbytes *= mc.dtype_bytes / 4
        saved[name] = saved.get(name, 0.0) + nbytes
        return x

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            mc.train_forward(tokens, seq_len, tp, ep)
    finally:
        for h in handles:
            h.remove()
    return saved
