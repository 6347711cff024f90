"""The cost triple of a kernel group on one rank: cube FLOPs, vector FLOPs, HBM bytes.

Cube FLOPs are matrix-unit work (matmuls), vector FLOPs element-wise work (softmax, norms,
activations, reductions); the two run on different core types with different peaks, so they are
kept apart all the way to the trace (see `workloads.common.kernels.add_cost`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cost:
    cube_flops: float = 0.0
    vector_flops: float = 0.0
    hbm_bytes: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.cube_flops + other.cube_flops, self.vector_flops + other.vector_flops,
                    self.hbm_bytes + other.hbm_bytes)

    def __sub__(self, other: Cost) -> Cost:
        return Cost(self.cube_flops - other.cube_flops, self.vector_flops - other.vector_flops,
                    self.hbm_bytes - other.hbm_bytes)

    def scale(self, k: float) -> Cost:
        return Cost(self.cube_flops * k, self.vector_flops * k, self.hbm_bytes * k)

    def clip(self) -> Cost:
        """Negative components (from differencing or extrapolating measurements) set to 0."""
        return Cost(max(self.cube_flops, 0.0), max(self.vector_flops, 0.0), max(self.hbm_bytes, 0.0))

    def lerp(self, other: Cost, w: float) -> Cost:
        """self + w·(other − self), clipped at 0 (w outside [0, 1] extrapolates)."""
        return Cost(self.cube_flops + w * (other.cube_flops - self.cube_flops),
                    self.vector_flops + w * (other.vector_flops - self.vector_flops),
                    self.hbm_bytes + w * (other.hbm_bytes - self.hbm_bytes)).clip()
