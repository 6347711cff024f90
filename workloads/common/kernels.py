"""Which kernels a layer's work runs as on an Ascend die: cube, vector or mixed (docs/architecture.md).

The engine prices three kernel kinds on a die's core groups (1 AIC + 2 AIV on a 910C; see
`stratacl/compute.py`): a *cube* kernel runs on the AICs, a *vector* kernel on the AIVs, a *mixed*
kernel pairs each AIC with its AIVs in every block, so it loses whole groups when a communication
kernel holds vector cores. This module turns the model-cost measurement of one layer type (cube
FLOPs c, vector FLOPs v, fused HBM bytes b_f = weights + layer I/O + KV, unfused HBM bytes b_u =
every op's inputs and outputs; `workloads/modelcost`) into kernels by one written rule:

1. c = 0: one vector kernel (v, b_f) — routers' softmax/top-k, norms, element-wise ops, embedding
   gathers;
2. v = 0: one cube kernel (c, b_f);
3. the layer type is fused in the deployment: one mixed kernel (c, v, b_f) — flash attention / MLA
   (CANN FlashAttentionScore / FusedInferAttentionScore: QKᵀ and PV on the cube units, the softmax
   on the vector units of the same block) and, in W8A8 inference, the routed experts as one fused
   grouped matmul with dequantisation, SwiGLU and quantisation (CANN
   npu_grouped_matmul_swiglu_quant);
4. otherwise: a cube kernel (c, b_f) followed by a vector kernel (v, max(0, b_u − b_f)) — dense
   GEMMs (dense MLP, shared experts, LM head, bf16 training's grouped matmul) on the AICs, their
   activation and norm work as separate AIV kernels that write and re-read the intermediates the
   fused byte count leaves out.

Fused sets per deployment: `INFERENCE_FUSED` (attention + MoE experts: llm_infer),
`TRAINING_FUSED` (attention only: TorchTitan's bf16 MoE runs grouped_mm and the SwiGLU as separate
kernels: llm_train), `DLRM_FUSED` (none: TorchRec's dense MLPs are nn.Linear GEMMs followed by
separate activation kernels, the pairwise interaction a batched matmul; FBGEMM's table-batched
embedding bags have no matmul, so rule 1 makes them vector kernels). A workload passes its own set
when its deployment fuses differently.

`add_cost` is the one way a workload puts a cost into a trace: the rule's kernels, the matmul
format on the kernels that run matmuls, extra bytes (e.g. the expert weights a die holds) on the
kernel that carries the fused traffic, and always at least one op to depend on.

Per-stream core limits (`Trace.limit_stream`) are a layout knob: `stream_limits("cloudmatrix_tbo",
(a, b))` gives CloudMatrix-Infer's decode micro-batch split, 16 AIC + 32 AIV for stream `a` and
8 AIC + 16 AIV for stream `b` (2506.12708 §4.2.3, REFERENCE §2); "none" gives no limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from stratacl.errors import ConfigError
from stratacl.schemas.llm_infer import StreamLayout
from stratacl.trace import Trace

INFERENCE_FUSED: frozenset[str] = frozenset({"attention", "moe"})
TRAINING_FUSED: frozenset[str] = frozenset({"attention"})
DLRM_FUSED: frozenset[str] = frozenset()

# CloudMatrix-Infer decode: the two micro-batch streams split a die's cores (2506.12708 §4.2.3)
CLOUDMATRIX_DECODE_SPLIT: tuple[tuple[int, int], tuple[int, int]] = ((16, 32), (8, 16))


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


def is_fused(layer_type: str, fused: Iterable[str]) -> bool:
    """A layer type is fused when its name or its family prefix is in the set
    (`attention_sparse` counts as `attention`)."""
    return any(layer_type == f or layer_type.startswith(f + "_") or layer_type.startswith(f + ".")
               for f in fused)


def split(layer_type: str, cube_flops: float, vector_flops: float, hbm_fused: float,
          hbm_unfused: float | None = None, fused: Iterable[str] = INFERENCE_FUSED) -> list[Kernel]:
    """The kernels of one layer type's measured work (the module docstring's rule)."""
    c, v, b = float(cube_flops), float(vector_flops), float(hbm_fused)
    if c <= 0 and v <= 0:
        return [Kernel("vector", 0.0, 0.0, b)] if b > 0 else []
    if c <= 0:
        return [Kernel("vector", 0.0, v, b)]
    if v <= 0:
        return [Kernel("cube", c, 0.0, b)]
    if is_fused(layer_type, fused):
        return [Kernel("mixed", c, v, b)]
    extra = max(0.0, float(hbm_unfused) - b) if hbm_unfused is not None else 0.0
    return [Kernel("cube", c, 0.0, b), Kernel("vector", 0.0, v, extra, suffix=".vec")]


def split_cost(layer_type: str, cost: LayerCostLike, fused: Iterable[str] = INFERENCE_FUSED) -> list[Kernel]:
    """`split` for a modelcost LayerCost (hbm_bytes_fused / hbm_bytes) or a cost triple with
    cube_flops / vector_flops / hbm_bytes (whose bytes count as fused)."""
    fused_b = getattr(cost, "hbm_bytes_fused", None)
    if fused_b is None:
        return split(layer_type, cost.cube_flops, cost.vector_flops, getattr(cost, "hbm_bytes", 0.0),
                     None, fused)
    return split(layer_type, cost.cube_flops, cost.vector_flops, fused_b, getattr(cost, "hbm_bytes", None),
                 fused)


def add_kernels(tr: Trace, ranks: Iterable[int], kernels: Sequence[Kernel], *, name: str,
                stream: str = "main", deps: Sequence[int] = (),
                scale: np.ndarray | float | None = None, dtype: str = "",
                hbm_extra: np.ndarray | float = 0.0) -> list[int]:
    """Append kernels one after another on `stream` (SPMD over `ranks`); returns their op ids.
    `scale` multiplies every component, per rank when it is a vector (uneven routed work).
    `dtype`: the matmuls' numeric format (picks the die's cube peak; "" = bf16), set on the cube
    and mixed kernels. `hbm_extra`: bytes added after scaling to the first kernel, the one that
    carries the fused traffic (per rank when a vector)."""
    k = 1.0 if scale is None else scale
    ranks = tuple(ranks)
    ids: list[int] = []
    prev = list(deps)
    for i, kern in enumerate(kernels):
        if kern.kind == "mixed":
            payload = dict(flops=kern.cube_flops * k, vector_flops=kern.vector_flops * k)
        elif kern.kind == "cube":
            payload = dict(flops=kern.cube_flops * k)
        else:
            payload = dict(flops=kern.vector_flops * k)
        extra = hbm_extra if i == 0 else 0.0
        fmt = dtype if kern.kind != "vector" else ""
        ids.append(tr.compute(ranks, hbm_bytes=kern.hbm_bytes * k + extra, core=kern.kind, stream=stream,
                              deps=prev, name=name + kern.suffix, block_dim=kern.block_dim, dtype=fmt,
                              **payload))
        prev = [ids[-1]]
    return ids


def add_cost(tr: Trace, ranks: Iterable[int], layer_type: str, cost: LayerCostLike, *,
             fused: Iterable[str], name: str, stream: str = "main", deps: Sequence[int] = (),
             scale: np.ndarray | float | None = None, dtype: str = "",
             hbm_extra: np.ndarray | float = 0.0) -> list[int]:
    """Put one layer type's measured work into the trace as the rule's kernels (`split_cost`
    under the deployment's `fused` set, then `add_kernels`). Work the rule drops (all zero)
    still leaves one empty vector kernel, so callers always get an op to depend on and
    `hbm_extra` a kernel to ride on."""
    kernels = split_cost(layer_type, cost, fused) or [Kernel("vector")]
    return add_kernels(tr, ranks, kernels, name=name, stream=stream, deps=deps, scale=scale, dtype=dtype,
                       hbm_extra=hbm_extra)


def stream_limits(layout: StreamLayout, streams: tuple[str, str]) -> dict[str, tuple[int, int]]:
    """Per-stream (AIC, AIV) limits of a named layout over two streams (first = the larger share)."""
    if StreamLayout(layout) == StreamLayout.none:
        return {}
    (a, b), (c, d) = CLOUDMATRIX_DECODE_SPLIT
    return {streams[0]: (a, b), streams[1]: (c, d)}


def check_layout(layout: str, cube_cores: int, vector_cores: int, field: str) -> None:
    """A named split is of a particular die: CloudMatrix's is of a 910C die's 24 AIC + 48 AIV."""
    if layout == StreamLayout.cloudmatrix_tbo:
        (a, b), (c, d) = CLOUDMATRIX_DECODE_SPLIT
        if (cube_cores, vector_cores) != (a + c, b + d):
            raise ConfigError(field, f"the cloudmatrix_tbo split ({a}+{c} AIC, {b}+{d} AIV) is of a 910C die, "
                              f"this fabric's die has {cube_cores} cube and {vector_cores} vector cores",
                              "set it to none on this fabric")


def apply_stream_limits(tr: Trace, limits: dict[str, tuple[int, int]]) -> None:
    for stream, (aic, aiv) in limits.items():
        tr.limit_stream(stream, aic, aiv)
