"""FLOP formulas for cube (matrix-unit) ops, including the ones torch's registry misses.

torch.utils.flop_counter covers mm/bmm/addmm/baddbmm/conv and the CUDA attention kernels;
on CPU the dispatcher hits `_scaled_dot_product_flash_attention_for_cpu` (+ backward) and
MoE experts hit `_grouped_mm`, which it does not know. Formulas count a multiply-add as 2.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import flop_counter as fc

aten = torch.ops.aten

FlopFn = Callable[..., int]
_EXTRA: dict[Any, FlopFn] = {}


def _shape(t: Any) -> tuple[int, ...]:
    return tuple(t.shape)


def grouped_mm_flops(a: tuple[int, ...], b: tuple[int, ...], out: tuple[int, ...]) -> int:
    """FLOPs of `_grouped_mm(a, b, offs)` in its three layouts.

    2-D a [S,K] x 3-D b [G,K,N]: rows of a are split into groups -> 2*S*K*N.
    3-D x 3-D: a plain batched matmul -> 2*G*M*K*N.
    2-D a [M,S] x 2-D b [S,N] (ragged contraction, the weight-gradient case) -> 2*M*S*N
    (output [G,M,N] sums over the groups' disjoint slices of S).
    """
    if len(a) == 2 and len(b) == 3:
        return 2 * a[0] * a[1] * b[2]
    if len(a) == 3 and len(b) == 3:
        return 2 * a[0] * a[1] * a[2] * b[2]
    if len(a) == 2 and len(b) == 2:
        return 2 * a[0] * a[1] * b[1]
    if len(a) == 3 and len(b) == 2:  # a [G,M,K] ragged against b [K,N_total]
        return 2 * math.prod(out) * a[2]
    raise ValueError(f"_grouped_mm: unexpected operand ranks {a} x {b}")


def _grouped_mm(a, b, *args, out_val=None, **kwargs) -> int:
    return grouped_mm_flops(_shape(a), _shape(b), _shape(out_val))


def _cpu_flash(query, key, value, *args, out_val=None, **kwargs) -> int:
    return fc.sdpa_flop_count(_shape(query), _shape(key), _shape(value))


def _cpu_flash_bwd(grad_out, query, key, value, *args, out_val=None, **kwargs) -> int:
    return fc.sdpa_backward_flop_count(_shape(grad_out), _shape(query), _shape(key), _shape(value))


def _register() -> None:
    for name, fn in (
        ("_grouped_mm", _grouped_mm),
        ("_scaled_dot_product_flash_attention_for_cpu", _cpu_flash),
        ("_scaled_dot_product_flash_attention_for_cpu_backward", _cpu_flash_bwd),
    ):
        packet = getattr(aten, name, None)
        if packet is not None:
            _EXTRA[packet] = fn


_register()


def _torch_registry_fn(packet: Any) -> FlopFn | None:
    fn = fc.flop_registry.get(packet)
    if fn is None:
        return None

    def call(*args, out_val=None, **kwargs):
        return fn(*args, out_val=out_val, **kwargs)

    return call


def cube_flop_fn(packet: Any) -> FlopFn | None:
    """The FLOP formula for a matrix-unit op, or None if the op is not cube work."""
    return _EXTRA.get(packet) or _torch_registry_fn(packet)


def attention_score_elems(query: Any, key: Any) -> int:
    """Elements of the B x H x Sq x Skv score matrix: the softmax's vector work."""
    q, k = _shape(query), _shape(key)
    return math.prod(q[:-1]) * k[-2]


# Fused attention kernels also do the softmax (vector work) over the score matrix.
ATTENTION_PACKETS = {
    p
    for p in (
        getattr(aten, n, None)
        for n in (
            "_scaled_dot_product_flash_attention_for_cpu",
            "_scaled_dot_product_flash_attention_for_cpu_backward",
            "_scaled_dot_product_flash_attention",
            "_scaled_dot_product_efficient_attention",
            "_scaled_dot_product_flash_attention_backward",
            "_scaled_dot_product_efficient_attention_backward",
        )
    )
    if p is not None
}
