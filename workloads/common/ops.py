"""One way to put a cost triple into a trace, shared by every workload.

A kernel group becomes a cube op (its matmuls, carrying all of its HBM traffic) followed on the
same stream by a vector op (its element-wise work), so vector work occupies vector cores — the
cores a buffer-centric library's transfers also hold — instead of being folded into cube time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from stratacl.trace import Trace
from workloads.common.cost import Cost


def add_compute(tr: Trace, ranks: Iterable[int], cost: Cost, *, name: str, stream: str = "main",
                deps: Sequence[int] = (), scale: np.ndarray | float | None = None,
                dtype: str = "", hbm_extra: np.ndarray | float = 0.0) -> list[int]:
    """Append `cost` on `ranks` as trace ops; returns their ids (cube op first, vector op if any).

    `scale` multiplies every component, per rank when it is a vector (uneven work such as routed
    experts on hot dies). The vector op is named `<name>.vec`. `dtype`: the numeric format of the
    matmuls (picks the die's cube peak; "" = bf16). `hbm_extra`: bytes added to the cube op after
    scaling (per rank when a vector: e.g. the expert weights each die holds).
    """
    k = 1.0 if scale is None else scale
    ranks = tuple(ranks)
    ops = [tr.compute(ranks, flops=cost.cube_flops * k, hbm_bytes=cost.hbm_bytes * k + hbm_extra, core="cube",
                      stream=stream, deps=list(deps), name=name, dtype=dtype)]
    if cost.vector_flops > 0:
        ops.append(tr.compute(ranks, flops=cost.vector_flops * k, core="vector", stream=stream,
                              deps=[ops[0]], name=f"{name}.vec"))
    return ops
