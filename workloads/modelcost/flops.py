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

from workloads.common.cost import Gemm  # (m, n, k, count[, 1])

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


# ---- matmul shapes ---------------------------------------------------------------------------
# A matmul D[m×n] = A[m×k]·B[k×n] run `count` times is (m, n, k, count); 2·m·n·k·count FLOPs.
def ragged(total: int, groups: int) -> list[tuple[int, int]]:
    """`total` rows split as evenly as integers allow over `groups`: [(rows, groups with that many)],
    exact (Σ rows·groups = total), empty groups left out."""
    if groups <= 0 or total <= 0:
        return []
    q, r = divmod(int(total), int(groups))
    return [(m, g) for m, g in ((q + 1, r), (q, groups - r)) if m > 0 and g > 0]


def _grouped_shapes(a: tuple[int, ...], b: tuple[int, ...], out: tuple[int, ...]) -> list[Gemm]:
    """`_grouped_mm`'s matmuls (`grouped_mm_flops`' layouts). 2-D x 3-D: the rows of a are split
    over b's groups (one expert per group; the fake tensors carry no offsets, so evenly); 2-D x 2-D
    (weight gradient): each group contracts over its slice of a's columns."""
    if len(a) == 2 and len(b) == 3:
        return [(m, b[2], a[1], g) for m, g in ragged(a[0], b[0])]
    if len(a) == 3 and len(b) == 3:
        return [(a[1], b[2], a[2], a[0])]
    if len(a) == 2 and len(b) == 2:  # rows along k: marked (m, n, k, count, 1)
        groups = out[0] if len(out) == 3 else 1
        return [(a[0], b[1], k, g, 1) for k, g in ragged(a[1], groups)]
    if len(a) == 3 and len(b) == 2:
        return [(out[-2], out[-1], a[2], math.prod(out[:-2]))]
    raise ValueError(f"_grouped_mm: unexpected operand ranks {a} x {b}")


def _attention_shapes(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...], backward: bool) -> list[Gemm]:
    """QKᵀ (q_len, kv_len, d_qk, B·H) and PV (q_len, d_v, kv_len, B·H); backward as torch's
    `sdpa_backward_flop_count` counts it: scores recomputed, dP, dV, dQ, dK."""
    b, h, sq, dq = q
    sk, dv = k[-2], v[-1]
    bh = b * h
    if not backward:
        return [(sq, sk, dq, bh), (sq, dv, sk, bh)]
    return [(sq, sk, dq, bh), (sq, sk, dv, bh), (sk, dv, sq, bh), (sq, dq, sk, bh), (dq, sk, sq, bh)]


def gemm_shapes(packet: Any, args: tuple, out: Any) -> list[Gemm] | None:
    """The matmuls one cube op runs, or None when its shapes are not known here (the op's FLOPs
    then carry no shapes). einsum and matmul reach the dispatcher as mm/bmm."""
    name = str(packet)
    if name == "aten.mm":
        (m, k), n = _shape(args[0]), _shape(args[1])[1]
        return [(m, n, k, 1)]
    if name == "aten.addmm":
        (m, k), n = _shape(args[1]), _shape(args[2])[1]
        return [(m, n, k, 1)]
    if name in ("aten.bmm", "aten.baddbmm"):
        x, y = (args[0], args[1]) if name == "aten.bmm" else (args[1], args[2])
        (bb, m, k), n = _shape(x), _shape(y)[2]
        return [(m, n, k, bb)]
    if name == "aten._grouped_mm":
        return _grouped_shapes(_shape(args[0]), _shape(args[1]), _shape(out))
    if name.startswith("aten._scaled_dot_product_flash_attention_for_cpu"):
        bwd = "backward" in name
        q, k, v = (args[1], args[2], args[3]) if bwd else (args[0], args[1], args[2])
        return _attention_shapes(_shape(q), _shape(k), _shape(v), bwd)
    return None
