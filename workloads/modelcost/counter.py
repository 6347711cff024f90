"""A TorchDispatchMode that prices every dispatched aten op: cube vs vector FLOPs and bytes.

Bytes are the sum of each op's distinct input and output tensor bytes: the traffic if every
op round-tripped HBM (no fusion), an upper bound. View/metadata ops and bare allocations
touch no memory and are skipped. Ops are attributed to the tag that is current when they
dispatch (set by module hooks in `measure.py`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .flops import ATTENTION_PACKETS, attention_score_elems, cube_flop_fn

aten = torch.ops.aten

# Metadata-only or allocation-only: no FLOPs, no HBM traffic.
_FREE = {
    getattr(aten, n)
    for n in (
        "detach", "t", "transpose", "expand", "alias", "_unsafe_view", "view", "reshape",
        "permute", "unsqueeze", "squeeze", "slice", "select", "split", "split_with_sizes",
        "chunk", "unbind", "as_strided", "empty", "empty_like", "new_empty", "empty_strided",
        "new_empty_strided", "lift_fresh", "_reshape_alias", "unfold", "narrow", "diagonal",
        "view_as", "expand_as", "detach_",
    )
    if hasattr(aten, n)
}

# Pure data movement: bytes, but no arithmetic.
_MOVE = {
    getattr(aten, n)
    for n in (
        "copy_", "_to_copy", "clone", "cat", "stack", "index", "index_select", "gather",
        "scatter", "scatter_", "index_put_", "index_put", "embedding", "zeros", "zeros_like",
        "ones", "ones_like", "new_zeros", "new_ones", "fill_", "full", "new_full", "full_like",
        "arange", "slice_scatter", "select_scatter", "constant_pad_nd", "repeat", "contiguous",
        "masked_select", "_unsafe_index", "index_copy", "index_copy_", "repeat_interleave",
        "one_hot", "flip", "roll", "tril", "triu", "scalar_tensor", "lift_fresh_copy",
    )
    if hasattr(aten, n)
}


@dataclass
class OpTotals:
    cube_flops: int = 0
    vector_flops: int = 0
    hbm_bytes: int = 0
    ops: int = 0
    by_op: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, other: OpTotals) -> None:
        self.cube_flops += other.cube_flops
        self.vector_flops += other.vector_flops
        self.hbm_bytes += other.hbm_bytes
        self.ops += other.ops
        for k, v in other.by_op.items():
            self.by_op[k] += v


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _expected_distinct(groups: int, rows: int) -> float:
    """Expected number of groups (experts) hit when `rows` rows land uniformly on `groups`."""
    if groups <= 0:
        return 0.0
    return groups * (1.0 - (1.0 - 1.0 / groups) ** rows)


class OpCounter(TorchDispatchMode):
    """Accumulates per-tag totals; `tag=None` means "do not count"."""

    def __init__(self) -> None:
        super().__init__()
        self.tag: str | None = None
        self.totals: dict[str, OpTotals] = defaultdict(OpTotals)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.tag is not None:
            self._account(func, args, kwargs, out)
        return out

    def _account(self, func, args, kwargs, out) -> None:
        packet = func.overloadpacket
        if func.namespace != "aten" or packet in _FREE or getattr(func, "is_view", False):
            return
        ins = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        if not ins and not outs:
            return
        tot = self.totals[self.tag]
        tot.ops += 1
        tot.by_op[str(packet)] += 1
        seen: set[int] = set()
        nbytes = 0
        for t in ins + outs:
            if id(t) in seen:
                continue
            seen.add(id(t))
            nbytes += _tensor_bytes(t)
        cube = cube_flop_fn(packet)
        if cube is not None:
            flops = int(cube(*args, out_val=out, **kwargs))
            tot.cube_flops += flops
            if packet in ATTENTION_PACKETS:
                q, k = (args[1], args[2]) if "backward" in str(packet) else (args[0], args[1])
                tot.vector_flops += attention_score_elems(q, k)
            if str(packet) == "aten._grouped_mm" and args[1].dim() == 3 and ins[0].dim() == 2:
                # Only the experts that receive rows have their weights read.
                w = args[1]
                hit = _expected_distinct(w.shape[0], args[0].shape[0]) / w.shape[0]
                nbytes -= int(_tensor_bytes(w) * (1.0 - hit))
        elif packet not in _MOVE:
            # Elementwise ops: one op per output element; reductions/sorts: per input element.
            tot.vector_flops += max(math.prod(t.shape) for t in ins + outs)
        tot.hbm_bytes += nbytes
