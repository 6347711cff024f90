"""Vocabularies the core (fabric, trace, library config) and the workload schemas share, each
defined once: numeric formats (`stratacl.fabric.FORMAT_FALLBACK`, workloads/common/quant.py) and
MoE dispatch/combine kernel families (`stratacl.trace.MOE_MODES`, the moe and llm_infer workloads).
StrEnums: a member equals its plain string, which is what traces store."""

from __future__ import annotations

from enum import StrEnum


class NumericFormat(StrEnum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"
    int8 = "int8"
    int4 = "int4"  # group-wise scaled (GPTQ/AWQ-style W4)
    fp4 = "fp4"  # MXFP4


class MoeMode(StrEnum):
    """MoE dispatch/combine kernel families (DeepEP's naming)."""

    ht = "ht"  # normal/high-throughput kernels: receivers learn a packed layout from a count exchange
    ll = "ll"  # low-latency kernels: fixed per-expert receive slots (counts travel with the data)


class KernelClass(StrEnum):
    """What a compute kernel is (`Op.kernel`), which picks its achieved-throughput model
    (stratacl/kernel_model.py); "" on an op = not stated: a generic kernel of its core kind."""

    gemm = "gemm"  # dense matmul
    grouped_gemm = "grouped_gemm"  # MoE experts, contiguous or masked groups
    attention_prefill = "attention_prefill"
    attention_decode = "attention_decode"
    elementwise = "elementwise"  # norms, RoPE, casts, activations, quant/dequant
    routing = "routing"  # router softmax/top-k, token permute/unpermute, gathers
