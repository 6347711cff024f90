"""Which kernels a layer's work runs as on an Ascend die: cube, vector or mixed (docs/architecture.md).

The engine prices three kernel kinds on a die's core groups (1 AIC + 2 AIV on a 910C; see
`stratacl/machine/compute.py`): a *cube* kernel runs on the AICs, a *vector* kernel on the AIVs, a *mixed*
kernel pairs each AIC with its AIVs in every block, so it loses whole groups when a communication
kernel holds vector cores. Every kernel also states what it does (`Op.kernel`, a `KernelClass`) and, when it runs matmuls,
their shapes (`Op.gemms`, (m, n, k, count) per rank), so the core prices it at the throughput
such a kernel achieves (stratacl/machine/kernel_model.py).

A measured cost (`Cost.parts`, from `workloads/modelcost`: every aten op of the layer type
classified by the counter) becomes one kernel per kernel class (`split_parts`):

* gemm (projections, dense MLP, shared experts, router, LM head; DLRM's MLPs and interaction bmm)
  and grouped_gemm (routed experts: `_grouped_mm`) → cube kernels carrying the fused traffic
  (weights + layer I/O; the routed experts' weights on the grouped GEMM);
* attention_prefill / attention_decode / attention_backward (the fused attention kernel, named by
  the shape's phase, a training backward's being FlashAttention's backward kernel; from the
  sdpa/eager attention interface or the closed-form production core, with its matmul shapes) → a
  mixed kernel (CANN FlashAttentionScore / FusedInferAttentionScore: QKᵀ and PV on the cube
  units, the softmax on the vector units of the same block) carrying the KV read/write, at least
  its q/K/V/output traffic;
* elementwise (norms, RoPE, casts, activations, residuals, quant/dequant) and routing (router
  softmax/top-k, token permute/unpermute, gathers: in MoE layers and the embedding) → vector
  kernels, the unfused passes production runs, each charged the bytes its own ops read and write
  (the counter's unfused count b_u of that class: eager PyTorch's op granularity);
* in a deployment that fuses the MoE layer (`INFERENCE_FUSED`: W8A8 serving's CANN
  npu_grouped_matmul_swiglu_quant) the element-wise work runs inside the grouped GEMM: one mixed
  grouped_gemm kernel with its FLOPs and bytes; its routing stays a pass of its own.

A cost with no breakdown (hand-built triples, the optimizer, DLRM's embedding bags) follows the
older rule on cube FLOPs c, vector FLOPs v, fused bytes b_f (`split`):

1. c = 0: one vector kernel (v, b_f) — routing for embedding gathers and routers
   (`ROUTING_TYPES`), element-wise otherwise;
2. v = 0: one cube kernel (c, b_f);
3. the layer type is fused in the deployment: one mixed kernel (c, v, b_f);
4. otherwise: a cube kernel (c, b_f) followed by a vector kernel (v, max(0, b_u − b_f)).

Fused sets per deployment: `INFERENCE_FUSED` (attention + MoE experts: llm_infer),
`TRAINING_FUSED` (attention only: TorchTitan's bf16 MoE runs grouped_mm and the SwiGLU as separate
kernels: llm_train), `DLRM_FUSED` (none: TorchRec's dense MLPs are nn.Linear GEMMs followed by
separate activation kernels, the pairwise interaction a batched matmul; FBGEMM's table-batched
embedding bags have no matmul: routing kernels). A workload passes its own set when its deployment
fuses differently.

`add_cost` is the one way a workload puts a cost into a trace: the kernels, the matmul format on
the kernels that run matmuls, the shapes scaled with the work a rank gets (`emit_gemms`: routed
rows scale m, or k for a weight gradient; a per-rank scale by its mean), extra bytes (e.g. the
expert weights a die holds) on the main kernel (`MAIN`), and always at least one op to depend on.

Per-stream core limits (`Trace.limit_stream`) are a layout knob: `stream_limits("cloudmatrix_tbo",
(a, b))` gives CloudMatrix-Infer's decode micro-batch split, 16 AIC + 32 AIV for stream `a` and
8 AIC + 16 AIV for stream `b` (2506.12708 §4.2.3, REFERENCE §2); "none" gives no limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from stratacl.errors import ConfigError
from stratacl.trace import Trace
from stratacl.vocab import CoreKind, KernelClass
from workloads.llm_infer.schema import StreamLayout

from .cost import Part

INFERENCE_FUSED: frozenset[str] = frozenset({"attention", "moe"})
TRAINING_FUSED: frozenset[str] = frozenset({"attention"})
DLRM_FUSED: frozenset[str] = frozenset()

# CloudMatrix-Infer decode: the two micro-batch streams split a die's cores (2506.12708 §4.2.3)
CLOUDMATRIX_DECODE_SPLIT: tuple[tuple[int, int], tuple[int, int]] = ((16, 32), (8, 16))

K = KernelClass
# the core kind each kernel class runs as (a fused grouped GEMM becomes mixed, see `split_parts`)
CLASS_CORE: dict[str, CoreKind] = {K.gemm: CoreKind.cube, K.grouped_gemm: CoreKind.cube,
                                   K.attention_prefill: CoreKind.mixed, K.attention_decode: CoreKind.mixed,
                                   K.attention_backward: CoreKind.mixed,
                                   K.elementwise: CoreKind.vector, K.elementwise_eager: CoreKind.vector,
                                   K.elementwise_compiled: CoreKind.vector,
                                   K.routing: CoreKind.vector}
# emission order of a layer's kernels, and the name suffix of each but the main one
ORDER = (K.routing, K.gemm, K.grouped_gemm, K.attention_prefill, K.attention_decode, K.attention_backward,
         K.elementwise)
SUFFIX: dict[str, str] = {K.gemm: ".gemm", K.grouped_gemm: ".grouped", K.attention_prefill: ".attn",
                          K.attention_decode: ".attn", K.attention_backward: ".attn", K.elementwise: ".vec", K.routing: ".route"}
# the kernel that carries a layer's fused traffic and `hbm_extra` (the first present)
MAIN = (K.grouped_gemm, K.gemm, K.attention_prefill, K.attention_decode, K.attention_backward, K.routing,
        K.elementwise)
# layer types (or their family prefix) whose matmul-free work is gathers (token embedding, DLRM
# embedding bags) or routing (a router), not element-wise passes
ROUTING_TYPES = ("embedding", "router", "routing")


class LayerCostLike(Protocol):
    cube_flops: float
    vector_flops: float


@dataclass(frozen=True)
class Kernel:
    kind: str  # cube | vector | mixed
    cube_flops: float = 0.0
    vector_flops: float = 0.0
    hbm_bytes: float = 0.0
    suffix: str = ""  # appended to the op name (".vec" for the vector half of an unfused pair)
    block_dim: int = 0  # cores it launches on (0 = all its stream may use)
    kernel: str = ""  # KernelClass value
    gemms: tuple[tuple[float, int, int, int], ...] = ()  # (m, n, k, count), m real until emitted
    main: bool = False  # carries the layer's `hbm_extra`


def is_fused(layer_type: str, fused: Iterable[str]) -> bool:
    """A layer type is fused when its name or its family prefix is in the set
    (`attention_sparse` counts as `attention`)."""
    return any(layer_type == f or layer_type.startswith(f + "_") or layer_type.startswith(f + ".")
               for f in fused)


def default_class(layer_type: str, kind: str) -> str:
    """The kernel class of a rule kernel when the cost has no measured breakdown."""
    if kind == CoreKind.vector:
        return K.routing if is_fused(layer_type, ROUTING_TYPES) else K.elementwise
    if layer_type.startswith("attention"):
        return K.attention_prefill
    return K.grouped_gemm if is_fused(layer_type, ("moe",)) else K.gemm


def split(layer_type: str, cube_flops: float, vector_flops: float, hbm_fused: float,
          hbm_unfused: float | None = None, fused: Iterable[str] = INFERENCE_FUSED) -> list[Kernel]:
    """The kernels of one layer type's work with no measured breakdown (the module docstring's
    rule), each with its default kernel class (`default_class`)."""
    c, v, b = float(cube_flops), float(vector_flops), float(hbm_fused)
    if c <= 0 and v <= 0:
        out = [Kernel("vector", 0.0, 0.0, b)] if b > 0 else []
    elif c <= 0:
        out = [Kernel("vector", 0.0, v, b)]
    elif v <= 0:
        out = [Kernel("cube", c, 0.0, b)]
    elif is_fused(layer_type, fused):
        out = [Kernel("mixed", c, v, b)]
    else:
        extra = max(0.0, float(hbm_unfused) - b) if hbm_unfused is not None else 0.0
        out = [Kernel("cube", c, 0.0, b), Kernel("vector", 0.0, v, extra, suffix=".vec")]
    return [replace(k, kernel=default_class(layer_type, k.kind), main=i == 0) for i, k in enumerate(out)]


def split_parts(layer_type: str, parts: Sequence[Part], fused: Iterable[str] = INFERENCE_FUSED) -> list[Kernel]:
    """The kernels of a measured breakdown: one kernel per kernel class, on the core kind the class
    runs on (`CLASS_CORE`), in `ORDER`. The main kernel (`MAIN`) keeps the bare name. In a fused MoE
    layer (W8A8 serving: CANN npu_grouped_matmul_swiglu_quant) the element-wise work (SwiGLU,
    quantisation) runs inside the grouped GEMM: one mixed grouped_gemm kernel with its bytes."""
    by = {p.kernel: p for p in parts if not p.empty}
    if is_fused(layer_type, fused) and K.grouped_gemm in by and K.elementwise in by:
        g, e = by[K.grouped_gemm], by.pop(K.elementwise)
        by[K.grouped_gemm] = Part(K.grouped_gemm, g.cube_flops, g.vector_flops + e.vector_flops,
                                  g.hbm_bytes + e.hbm_bytes, g.gemms)
    main = next((k for k in MAIN if k in by), None)
    out = []
    for kind in ORDER:
        p = by.get(kind)
        if p is None:
            continue
        core = CLASS_CORE[kind]
        if core == CoreKind.cube and p.vector_flops > 0:
            core = CoreKind.mixed
        if core == CoreKind.vector and p.cube_flops > 0:  # not produced by the measurement; keep the work
            core = CoreKind.mixed
        out.append(Kernel(core, p.cube_flops, p.vector_flops, p.hbm_bytes, "" if kind == main else SUFFIX[kind],
                          kernel=kind, gemms=p.gemms if p.cube_flops > 0 else (), main=kind == main))
    return out


def split_cost(layer_type: str, cost: LayerCostLike, fused: Iterable[str] = INFERENCE_FUSED) -> list[Kernel]:
    """The kernels of a cost: its measured breakdown (`Cost.parts`, `split_parts`) when it has one,
    else the rule (`split`) for a modelcost LayerCost (hbm_bytes_fused / hbm_bytes) or a cost
    triple with cube_flops / vector_flops / hbm_bytes (whose bytes count as fused)."""
    parts = getattr(cost, "parts", ())
    if parts and isinstance(parts[0], Part):
        return split_parts(layer_type, parts, fused)
    fused_b = getattr(cost, "hbm_bytes_fused", None)
    if fused_b is None:
        return split(layer_type, cost.cube_flops, cost.vector_flops, getattr(cost, "hbm_bytes", 0.0),
                     None, fused)
    return split(layer_type, cost.cube_flops, cost.vector_flops, fused_b, getattr(cost, "hbm_bytes", None),
                 fused)


def emit_gemms(gemms: Iterable[tuple[float, int, int, int]], k: float = 1.0) -> tuple[tuple[int, int, int, int], ...]:
    """Whole-row matmul shapes (m, n, k, count) of `gemms` scaled by `k` (the rows a rank runs):
    each entry's rows (m, or k for a weight gradient: `cost.scale_rows`) times count times `k`,
    rounded to an integer and spread over its `count` as evenly as integers allow; entries left
    with no rows dropped."""
    out: dict[tuple[int, int, int], int] = {}
    for gm in gemms:
        m, n, kk, c = gm[:4]
        c = int(c)
        in_k = len(gm) > 4 and bool(gm[4])  # rows along k (weight gradient)
        rows = int(round(float(kk if in_k else m) * c * k))
        other = m if in_k else kk
        if rows <= 0 or n <= 0 or other <= 0 or c <= 0:
            continue
        q, r = divmod(rows, c)
        for rr, g in ((q + 1, r), (q, c - r)):
            if rr > 0 and g > 0:
                key = (int(other), int(n), rr) if in_k else (rr, int(n), int(other))
                out[key] = out.get(key, 0) + g
    return tuple(sorted((m, n, kk, c) for (m, n, kk), c in out.items()))


def add_kernels(tr: Trace, ranks: Iterable[int], kernels: Sequence[Kernel], *, name: str,
                stream: str = "main", deps: Sequence[int] = (),
                scale: np.ndarray | float | None = None, dtype: str = "",
                hbm_extra: np.ndarray | float = 0.0) -> list[int]:
    """Append kernels one after another on `stream` (SPMD over `ranks`); returns their op ids.
    `scale` multiplies every component, per rank when it is a vector (uneven routed work); the
    matmul shapes scale their rows by it (a vector: by its mean, one shape per op).
    `dtype`: the matmuls' numeric format (picks the die's cube peak; "" = bf16), set on the cube
    and mixed kernels. `hbm_extra`: bytes added after scaling to the main kernel, the one that
    carries the fused traffic (per rank when a vector)."""
    k = 1.0 if scale is None else scale
    k_shape = float(np.mean(k)) if np.ndim(k) else float(k)
    ranks = tuple(ranks)
    ids: list[int] = []
    prev = list(deps)
    main = next((i for i, kern in enumerate(kernels) if kern.main), 0)
    for i, kern in enumerate(kernels):
        if kern.kind == CoreKind.mixed:
            payload = dict(flops=kern.cube_flops * k, vector_flops=kern.vector_flops * k)
        elif kern.kind == CoreKind.cube:
            payload = dict(flops=kern.cube_flops * k)
        else:
            payload = dict(flops=kern.vector_flops * k)
        extra = hbm_extra if i == main else 0.0
        fmt = dtype if kern.kind != CoreKind.vector else ""
        ids.append(tr.compute(ranks, hbm_bytes=kern.hbm_bytes * k + extra, core=kern.kind, stream=stream,
                              deps=prev, name=name + kern.suffix, block_dim=kern.block_dim, dtype=fmt,
                              kernel=kern.kernel, gemms=emit_gemms(kern.gemms, k_shape), **payload))
        prev = [ids[-1]]
    return ids


def add_cost(tr: Trace, ranks: Iterable[int], layer_type: str, cost: LayerCostLike, *,
             fused: Iterable[str], name: str, stream: str = "main", deps: Sequence[int] = (),
             scale: np.ndarray | float | None = None, dtype: str = "",
             hbm_extra: np.ndarray | float = 0.0, elementwise: str = K.elementwise) -> list[int]:
    """Put one layer type's measured work into the trace as its kernels (`split_cost` under the
    deployment's `fused` set, then `add_kernels`). Work the rule drops (all zero) still leaves
    one empty kernel, so callers always get an op to depend on and `hbm_extra` a kernel to ride
    on. `elementwise`: the class the element-wise kernels run as (training: eager ATen or compiled
    Triton kernels, `elementwise_eager` / `elementwise_compiled`)."""
    kernels = split_cost(layer_type, cost, fused) or [Kernel("vector", kernel=default_class(layer_type, "vector"),
                                                             main=True)]
    if elementwise != K.elementwise:
        kernels = [replace(k, kernel=elementwise) if k.kernel == K.elementwise else k for k in kernels]
    return add_kernels(tr, ranks, kernels, name=name, stream=stream, deps=deps, scale=scale, dtype=dtype,
                       hbm_extra=hbm_extra)


def stream_limits(layout: StreamLayout, streams: tuple[str, str]) -> dict[str, tuple[int, int]]:
    """Per-stream (AIC, AIV) limits of a named layout over two streams (first = the larger share)."""
    if StreamLayout(layout) == StreamLayout.none:
        return {}
    (a, b), (c, d) = CLOUDMATRIX_DECODE_SPLIT
    return {streams[0]: (a, b), streams[1]: (c, d)}


def layout_on_die(layout: str, cube_cores: int, vector_cores: int) -> StreamLayout:
    """A named layout as it runs on a die: `auto` is CloudMatrix-Infer's split on the 910C die it
    was made for and no split elsewhere (GPUs, other dies); the others are themselves."""
    if StreamLayout(layout) != StreamLayout.auto:
        return StreamLayout(layout)
    (a, b), (c, d) = CLOUDMATRIX_DECODE_SPLIT
    return StreamLayout.cloudmatrix_tbo if (cube_cores, vector_cores) == (a + c, b + d) else StreamLayout.none


def check_layout(layout: str, cube_cores: int, vector_cores: int, field: str) -> None:
    """A named split is of a particular die: CloudMatrix's is of a 910C die's 24 AIC + 48 AIV."""
    if layout == StreamLayout.cloudmatrix_tbo:
        (a, b), (c, d) = CLOUDMATRIX_DECODE_SPLIT
        if (cube_cores, vector_cores) != (a + c, b + d):
            raise ConfigError(field, f"the cloudmatrix_tbo split ({a}+{c} AIC, {b}+{d} AIV) is of a 910C die, "
                              f"this fabric's die has {cube_cores} cube and {vector_cores} vector cores",
                              "set it to none on this fabric")


def split_note(layout: StreamLayout, tbo: bool, dropped_by: Sequence[str]) -> str | None:
    """What the run's decode streams ran with: the named split, kept by every library unless a
    library's preset drops it (`library.<name>.stream_core_split: false`, a scenario of its own)."""
    if not tbo or StreamLayout(layout) == StreamLayout.none:
        return None
    (a, b), (c, d) = CLOUDMATRIX_DECODE_SPLIT
    who = (f"dropped by {', '.join(dropped_by)} (library.<name>.stream_core_split=false: every kernel on "
           "the whole die), kept by the others") if dropped_by else "kept by every library"
    return (f"decode streams: {StreamLayout(layout).value} split (attention path {a} AIC + {b} AIV, "
            f"MoE path {c} AIC + {d} AIV; 2506.12708 §4.2.3), {who}")


def apply_stream_limits(tr: Trace, limits: dict[str, tuple[int, int]]) -> None:
    for stream, (aic, aiv) in limits.items():
        tr.limit_stream(stream, aic, aiv)
