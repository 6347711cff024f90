"""Plain MLP costs (DLRM bottom/top MLPs) from torch.nn modules at given layer sizes."""

from __future__ import annotations

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from .counter import OpCounter
from .errors import CostInputError
from .fakemodel import fakeify, torch_dtype
from .phase import CostPhase


def mlp_cost(layer_sizes: list[int], batch: int, phase: str = "train_fwd", dtype_bytes: int = 2,
             activation: str = "relu") -> dict[str, int]:
    """Cost of Linear+activation stack `layer_sizes[0] -> ... -> layer_sizes[-1]` on `batch` rows."""
    if len(layer_sizes) < 2 or any(int(s) < 1 for s in layer_sizes):
        raise CostInputError(f"layer_sizes: need >= 2 positive sizes, got {layer_sizes}")
    if phase not in (CostPhase.prefill, CostPhase.train_fwd, CostPhase.train_bwd):
        raise CostInputError(f"phase: {phase!r}; valid options: prefill, train_fwd, train_bwd")
    acts = {"relu": nn.ReLU, "sigmoid": nn.Sigmoid, "gelu": nn.GELU}
    if activation not in acts:
        raise CostInputError(f"activation: {activation!r}; valid options: {', '.join(acts)}")
    dtype = torch_dtype(dtype_bytes)
    mods: list[nn.Module] = []  # built on meta, then given FakeTensor weights: nothing allocated
    for a, b in zip(layer_sizes[:-1], layer_sizes[1:], strict=True):
        mods += [nn.Linear(a, b), acts[activation]()]
    mode = FakeTensorMode()
    with torch.device("meta"):
        net = nn.Sequential(*mods).to(dtype)
    fakeify(net, mode)
    with mode:
        x = torch.empty(batch, layer_sizes[0], dtype=dtype, requires_grad=phase == CostPhase.train_bwd)
    counter = OpCounter()
    with mode, torch.set_grad_enabled(phase.startswith("train")), counter:
        counter.tag = None if phase == CostPhase.train_bwd else "mlp"
        y = net(x)
        if phase == CostPhase.train_bwd:
            counter.tag = "mlp"
            y.backward(torch.empty_like(y))
    t = counter.totals["mlp"]
    weight_bytes = sum(p.numel() * p.element_size() for p in net.parameters())
    return {"cube_flops": t.cube_flops, "vector_flops": t.vector_flops, "hbm_bytes": t.hbm_bytes,
            "weight_bytes": weight_bytes, "params": sum(p.numel() for p in net.parameters())}
