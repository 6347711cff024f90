"""The DLRM definition in plain torch and its dense-part costs, measured on fake tensors.

The module is built on the meta device (7 TiB of tables are never allocated). The dense part —
bottom MLP, pairwise dot interaction, top MLP — is run forward and backward on FakeTensors under
the model-cost counter, so FLOPs and bytes come from the real aten ops. The embedding-bag lookup
is priced in `embedding_cost` from shapes instead: the counter charges an op's whole input
tensors, which for a gather would be the whole table rather than the rows it touches.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from workloads.common.cost import Cost
from workloads.modelcost.counter import OpCounter, class_parts
from workloads.modelcost.fakemodel import fakeify, torch_dtype


def _mlp(sizes: list[int], last_sigmoid: bool = False) -> nn.Sequential:
    mods: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        last = i == len(sizes) - 2
        mods += [nn.Linear(a, b), nn.Sigmoid() if last and last_sigmoid else nn.ReLU()]
    return nn.Sequential(*mods)


class DLRM(nn.Module):
    """DLRM (Naumov et al. 2019): bottom MLP, sum-pooled embedding bags, dot interaction, top MLP."""

    def __init__(self, dense_in: int, rows: list[int], dim: int, bottom: list[int],
                 top: list[int]) -> None:
        super().__init__()
        self.bottom = _mlp([dense_in, *bottom])
        self.tables = nn.ModuleList(nn.EmbeddingBag(n, dim, mode="sum") for n in rows)
        n_vec = len(rows) + 1
        self.top = _mlp([dim + n_vec * (n_vec - 1) // 2, *top], last_sigmoid=True)
        self.register_buffer("_li", torch.tril_indices(n_vec, n_vec, -1)[0], persistent=False)
        self.register_buffer("_lj", torch.tril_indices(n_vec, n_vec, -1)[1], persistent=False)

    def interact(self, x: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        t = torch.cat([x.unsqueeze(1), pooled], dim=1)  # [B, F+1, D]
        z = torch.bmm(t, t.transpose(1, 2))
        return torch.cat([x, z[:, self._li, self._lj]], dim=1)

    def dense_forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        return self.top(self.interact(self.bottom(dense), pooled))

    def forward(self, dense: torch.Tensor, indices: list[torch.Tensor],
                offsets: list[torch.Tensor]) -> torch.Tensor:
        pooled = torch.stack([t(i, o) for t, i, o in zip(self.tables, indices, offsets, strict=True)], 1)
        return self.dense_forward(dense, pooled)

    def dense_parameters(self) -> list[nn.Parameter]:
        return [*self.bottom.parameters(), *self.top.parameters()]


def build_meta(dense_in: int, rows: list[int], dim: int, bottom: list[int], top: list[int]) -> DLRM:
    with torch.device("meta"):
        return DLRM(dense_in, rows, dim, bottom, top)


@dataclass(frozen=True)
class DenseCosts:
    """Per-rank costs of the data-parallel dense part at one per-worker batch."""

    bottom_fwd: Cost
    top_fwd: Cost  # interaction + top MLP + loss
    top_bwd: Cost
    bottom_bwd: Cost
    params_bottom: tuple[int, ...]  # parameter numels, in registration order
    params_top: tuple[int, ...]
    activation_bytes: float  # tensors the forward leaves for backward (upper bound: all outputs)


@functools.lru_cache(maxsize=32)
def dense_costs(dense_in: int, n_features: int, dim: int, bottom: tuple[int, ...],
                top: tuple[int, ...], batch: int, dtype_bytes: int) -> DenseCosts:
    """Run the dense part forward and backward on FakeTensors under the op counter."""
    model = build_meta(dense_in, [1] * n_features, dim, list(bottom), list(top))
    dtype = torch_dtype(dtype_bytes)
    mode = FakeTensorMode()
    model.bottom.to(dtype)
    model.top.to(dtype)
    fakeify(model.bottom, mode)
    fakeify(model.top, mode)
    with mode:
        li, lj = torch.tril_indices(n_features + 1, n_features + 1, -1)
        model._li, model._lj = li, lj
        dense = torch.empty(batch, dense_in, dtype=dtype)
        pooled = torch.empty(batch, n_features, dim, dtype=dtype, requires_grad=True)
    counter = OpCounter()
    with mode, counter:
        counter.tag = "bottom_fwd"
        x = model.bottom(dense)
        x_top = x.detach().requires_grad_(True)  # cut here so top and bottom backward are separate
        counter.tag = "top_fwd"
        y = model.top(model.interact(x_top, pooled))
        loss = nn.functional.binary_cross_entropy(y, torch.empty_like(y))
        counter.tag = "top_bwd"
        loss.backward()
        counter.tag = "bottom_bwd"
        x.backward(x_top.grad)
    tot = counter.totals

    def stage(tag: str) -> Cost:
        # by kernel class (nn.Linear and the interaction's bmm: gemm; activations, the loss, casts
        # and the interaction's gathers: elementwise), each with the bytes its ops read and write
        t = tot[tag]
        return Cost(float(t.cube_flops), float(t.vector_flops), float(t.hbm_bytes),
                    tuple(class_parts(t).values()))

    return DenseCosts(
        bottom_fwd=stage("bottom_fwd"), top_fwd=stage("top_fwd"), top_bwd=stage("top_bwd"),
        bottom_bwd=stage("bottom_bwd"),
        params_bottom=tuple(p.numel() for p in model.bottom.parameters()),
        params_top=tuple(p.numel() for p in model.top.parameters()),
        activation_bytes=float(tot["bottom_fwd"].hbm_bytes + tot["top_fwd"].hbm_bytes),
    )


@dataclass(frozen=True)
class EmbeddingCost:
    """One die's embedding-bag work for `lookups` rows of width `dim` (fused TBE kernels)."""

    fwd_flops: float
    fwd_bytes: float
    bwd_flops: float
    bwd_bytes: float


def embedding_cost(lookups: float, width: float, out_rows: float, table_bytes: int,
                   state_bytes: int, index_bytes: int, out_bytes: int) -> EmbeddingCost:
    """Forward: read indices and the rows touched, sum-pool, write pooled outputs
    (`out_rows` × `width` values). Backward with the fused row-wise optimizer: read the pooled
    gradients and each touched row and its state, write both back."""
    row = width * table_bytes
    fwd_bytes = lookups * (index_bytes + row) + out_rows * width * out_bytes
    bwd_bytes = out_rows * width * out_bytes + lookups * (index_bytes + 2 * (row + state_bytes))
    return EmbeddingCost(fwd_flops=lookups * width, fwd_bytes=fwd_bytes,
                         bwd_flops=4 * lookups * width, bwd_bytes=bwd_bytes)
