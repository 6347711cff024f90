"""Vocabularies the core (fabric, trace, library config) and the workloads share, each defined
once: what an op is (`Op.kind`), collective types (`Op.coll`), the core kinds a kernel runs on
(`Op.core`), host copies (`Op.peer`, `Op.direction`), numeric formats
(`stratacl.machine.fabric.FORMAT_FALLBACK`, workloads/common/quant.py), MoE dispatch/combine kernel
families (`Op.moe_mode`) and kernel classes (`Op.kernel`). StrEnums: a member equals (and hashes
as) its plain string, which is what traces, configs and tables store; stratacl.trace lists the
plain values for its checks and messages."""

from __future__ import annotations

from enum import StrEnum


class OpKind(StrEnum):
    compute = "compute"
    collective = "collective"
    p2p = "p2p"
    memcpy = "memcpy"


class Collective(StrEnum):
    """Collective types (`Op.coll`); sizes follow nccl-tests (stratacl/comm/library.py)."""

    allreduce = "allreduce"
    allgather = "allgather"
    reducescatter = "reducescatter"
    alltoall = "alltoall"
    alltoallv = "alltoallv"  # uneven: the op's peer_bytes matrix
    broadcast = "broadcast"
    dispatch = "dispatch"  # MoE token dispatch (needs the trace's MoeShape)
    combine = "combine"  # MoE token combine


class CoreKind(StrEnum):
    """The cores a compute kernel runs on (`Op.core`); stratacl/machine/compute.py prices them on the
    die's core groups."""

    cube = "cube"  # matmul units (Ascend AIC, tensor cores)
    vector = "vector"  # vector units (AIV)
    mixed = "mixed"  # each block pairs one cube core with its vector cores (fused attention)


class HostPeer(StrEnum):
    """Where a memcpy's other end is (`Op.peer`)."""

    device = ""  # a device-local copy
    host = "host"  # the DRAM of the die's own CPU
    pool = "pool"  # the DRAM pool striped over every CPU of the supernode


class PhaseCategory(StrEnum):
    """Where a phase's time goes (`stratacl.machine.phases.Phase.category`, the replay's time split)."""

    compute = "compute"
    wire = "wire"  # bytes on links
    copy = "copy"  # staging copies
    sync = "sync"  # handshakes and flags
    register = "register"  # buffer registration
    launch = "launch"  # kernel and graph launches
    host = "host"  # the host in the loop (device->host round trips)


class CopyDirection(StrEnum):
    """A host copy's direction (`Op.direction`)."""

    h2d = "h2d"
    d2h = "d2h"


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
    (stratacl/machine/kernel_model.py); "" on an op = not stated: a generic kernel of its core kind."""

    gemm = "gemm"  # dense matmul
    grouped_gemm = "grouped_gemm"  # MoE experts, contiguous or masked groups
    attention_prefill = "attention_prefill"
    attention_decode = "attention_decode"
    attention_backward = "attention_backward"  # FlashAttention's backward: dQ, dK, dV from Q, K, V, O, dO
    elementwise = "elementwise"  # norms, RoPE, casts, activations, quant/dequant (serving engines' fused kernels)
    elementwise_eager = "elementwise_eager"  # the same work as eager PyTorch's own ATen kernels, one op each
    elementwise_compiled = "elementwise_compiled"  # ... as torch.compile's generated Triton kernels, one per chain
    routing = "routing"  # router softmax/top-k, token permute/unpermute, gathers
