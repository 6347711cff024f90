"""Activations DeepSeek-V3's training keeps for backward, per token, from the model's config.

What autograd saves in an eager transformers model (activations.py measures it) is not what
DeepSeek trained with: its report (arXiv 2412.19437) names the mechanisms that let PP16 DualPipe
fit 80 GB H800s without full recomputation. Per decoder layer and token (H hidden, a the compute
dtype's bytes):
- §3.2.3 "Recomputation of RMSNorm and MLA Up-Projection": norm outputs and the up-projections'
  outputs (q, k, v) are recomputed in backward; kept are each RMSNorm's input (the residual, H·a,
  two per layer) and the up-projections' inputs, the latents (q_lora_rank + kv_lora_rank +
  qk_rope_head_dim, at a).
- §3.3.3 "Low-Precision Storage and Communication": the input of the linear after attention in
  E5M6 (12 bits: heads·v_head_dim·1.5 B); the SwiGLU inputs of the MoE cached in FP8 and its
  output recomputed (2·moe_intermediate bytes per routed row and per shared expert, plus
  1×128-tile fp32 scales, §3.3.2); the experts' input linear activations in FP8 (the dispatched
  token, H bytes per routed row, with its scales).
- the attention kernel's log-sum-exp (fp32 per head, as FlashAttention's backward keeps).
ASSUMPTIONS (the report does not say): the dense layers' SwiGLU inputs cached in FP8 as the MoE's;
the router's fp32 affinity scores kept (n_routed_experts·4 B); the gate weights applied before the
experts' down projection (as Megatron-Core's `moe_apply_probs_on_input`), so the combine keeps
no expert outputs.
"""

from __future__ import annotations

from typing import Any

from stratacl.errors import ConfigError

SCALE_TILE = 128  # fine-grained FP8 quantisation: one fp32 scale per 1×128 activation tile (§3.3.2)
E5M6_BYTES = 1.5  # 12-bit format for the attention output (§3.3.3)


def _fp8(n: int) -> float:
    return n + 4.0 * n / SCALE_TILE


def per_token_bytes(cfg: Any, dtype_bytes: int) -> dict[str, float]:
    """Bytes kept per token by layer type ('attention', 'dense_mlp', 'moe'); for 'moe' the part
    per token only — `per_routed_row_bytes` is added per row a die's experts receive."""
    need = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "num_attention_heads")
    if any(getattr(cfg, k, None) is None for k in need):
        raise ConfigError("workload.saved_activations", "deepseek_v3 describes MLA attention (q/kv "
                          "latents); this model has none", "use saved_activations=autograd")
    h, a = cfg.hidden_size, dtype_bytes
    attn = (h * a + (cfg.q_lora_rank + cfg.kv_lora_rank + cfg.qk_rope_head_dim) * a
            + cfg.num_attention_heads * cfg.v_head_dim * E5M6_BYTES + cfg.num_attention_heads * 4.0)
    shared = (getattr(cfg, "n_shared_experts", 0) or 0) * _fp8(2 * cfg.moe_intermediate_size)
    n_exp = getattr(cfg, "n_routed_experts", 0) or 0
    return {"attention": attn,
            "dense_mlp": h * a + _fp8(2 * cfg.intermediate_size),
            "moe": h * a + n_exp * 4.0 + shared}


def per_routed_row_bytes(cfg: Any) -> float:
    """Per row an expert receives: its FP8 input and its FP8 SwiGLU inputs, with scales."""
    return _fp8(cfg.hidden_size) + _fp8(2 * cfg.moe_intermediate_size)
