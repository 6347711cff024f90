"""A TorchDispatchMode that prices every dispatched aten op: cube vs vector FLOPs and bytes.

Bytes are the sum of each op's distinct input and output tensor bytes: the traffic if every
op round-tripped HBM (no fusion), an upper bound. View/metadata ops and bare allocations
touch no memory and are skipped. Ops are attributed to the tag that is current when they
dispatch (set by module hooks in `measure.py`).

Per tag the totals are also kept by kernel class (`op_class`: gemm, grouped_gemm, attention —
every op inside a layer's attention interface, eager or sdpa —, elementwise, routing), each with
its FLOPs, unfused bytes and the matmul shapes its cube ops ran (`flops.gemm_shapes`: mm, addmm,
bmm, baddbmm — einsum and matmul reach the dispatcher as these —, `_grouped_mm` with its rows
split evenly over the groups, and the CPU flash-attention kernels' QKᵀ/PV); a cube op whose
shapes are not known there clears its class's `shapes_known`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field, fields

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from workloads.common.cost import Part

from .flops import ATTENTION_PACKETS, attention_score_elems, cube_flop_fn, gemm_shapes

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


# Ops a production stack runs as routing kernels (gathers, scatters, top-k selection, sorts and
# the index bookkeeping of token permutes); in a MoE layer also the router's score functions.
_ROUTING = {
    getattr(aten, n)
    for n in (
        "topk", "sort", "argsort", "index", "index_select", "gather", "scatter", "scatter_", "scatter_add",
        "scatter_add_", "scatter_reduce", "index_add", "index_add_", "index_put", "index_put_", "embedding",
        "embedding_dense_backward", "masked_select", "nonzero", "bincount", "histc", "one_hot",
        "repeat_interleave", "_unsafe_index", "index_copy", "index_copy_", "cumsum", "searchsorted",
    )
    if hasattr(aten, n)
}
_ROUTER_SCORES = {getattr(aten, n) for n in ("_softmax", "sigmoid", "_softmax_backward_data", "sigmoid_backward")
                  if hasattr(aten, n)}

# What kind of kernel an aten op belongs to (the `KernelClass` names; "attention" is the fused
# attention kernel, its phase is the shape's).
# The cube unit's contraction per instruction: Ascend's 16×16×16 fractal (fp16/bf16), Hopper's
# wgmma K = 16 for 16-bit inputs (PTX ISA, wgmma.mma_async shapes m64nNk16).
MIN_CUBE_K = 16
OP_CLASSES = ("gemm", "grouped_gemm", "attention", "elementwise", "routing")


@dataclass
class ClassTotals:
    cube_flops: int = 0
    vector_flops: int = 0
    hbm_bytes: int = 0  # the ops' inputs + outputs (unfused)
    # pass classes: the traffic if each chain of element-wise / routing ops of the tag ran as one
    # kernel: inputs from outside the chain read, outputs used outside it (or never) written
    chain_bytes: int = 0
    gemms: dict[tuple, int] = field(default_factory=lambda: defaultdict(int))  # (m,n,k[,1]) -> count
    shapes_known: bool = True  # every cube op of the class had known matmul shapes

    def add(self, other: ClassTotals) -> None:
        _accumulate(self, other)

    def gemm_list(self) -> list[tuple]:
        return sorted((*key[:3], c, *key[3:]) for key, c in self.gemms.items())


@dataclass
class OpTotals:
    cube_flops: int = 0
    vector_flops: int = 0
    hbm_bytes: int = 0
    ops: int = 0
    by_op: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    by_class: dict[str, ClassTotals] = field(default_factory=lambda: defaultdict(ClassTotals))
    attention_io: int = 0  # q, K, V, output bytes at the attention interface (fused-kernel traffic)
    sac_saved_bytes: int = 0  # outputs of the ops selective op AC saves (`OpCounter(sac=True)`)

    def add(self, other: OpTotals) -> None:
        _accumulate(self, other)


def _accumulate(dst: ClassTotals | OpTotals, src: ClassTotals | OpTotals) -> None:
    """Field-wise sum of two totals: numbers add, flags stay true only if both are, count dicts
    add per key and nested totals (`by_class`) add themselves."""
    for f in fields(dst):
        a, b = getattr(dst, f.name), getattr(src, f.name)
        if isinstance(a, bool):
            setattr(dst, f.name, a and b)
        elif isinstance(a, int | float):
            setattr(dst, f.name, a + b)
        else:
            for k, v in b.items():
                if isinstance(v, ClassTotals):
                    a.setdefault(k, ClassTotals()).add(v)
                else:
                    a[k] = a.get(k, 0) + v


def op_class(packet, tag: str | None) -> str:  # noqa: ANN001
    """The kernel class of a non-cube aten op under `tag`: in a MoE layer or the embedding,
    routing (gathers, scatters, top-k, token permutes; in a MoE layer also the router's
    softmax/sigmoid); everything else elementwise (norms, activations, casts, RoPE and its
    cos/sin lookups, residuals, KV-cache writes)."""
    if tag is None or not tag.startswith(("moe", "embedding")):
        return "elementwise"
    if packet in _ROUTING or (packet in _ROUTER_SCORES and tag.startswith("moe")):
        return "routing"
    return "elementwise"


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _storage(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError, AttributeError):
        return None


def _expected_distinct(groups: int, rows: int) -> float:
    """Expected number of groups (experts) hit when `rows` rows land uniformly on `groups`."""
    if groups <= 0:
        return 0.0
    return groups * (1.0 - (1.0 - 1.0 / groups) ** rows)


# torchtitan's selective op activation checkpointing (torchtitan/models/llama3/infra/parallelize.py,
# `_save_list` and `_custom_policy`): the outputs of these ops are saved, except every second mm of
# a block (the 2nd, 4th, ... mm inside one checkpointed block); every other op is recomputed.
# The CPU flash-attention ops stand for the CUDA SDPA kernels of the list; reduce_scatter is not an
# aten op here (the shard model has no collectives).
SAC_SAVE = (aten.mm.default, aten.max.default)


class OpCounter(TorchDispatchMode):
    """Accumulates per-tag totals; `tag=None` means "do not count". `sac`: count only the ops
    selective op AC recomputes, and the output bytes of those it saves (`OpTotals.sac_saved_bytes`);
    `new_block()` restarts the policy's mm count (a block's forward begins)."""

    def __init__(self, sac: bool = False) -> None:
        super().__init__()
        self.sac = sac
        self.block_mm = 0
        # (lo, hi] sequence numbers of the autograd nodes each attention interface call created:
        # their backward is the attention kernel's (attn_hooks.KernelHooks._backward_region)
        self.attention_nodes: list[tuple[int, int]] = []
        self.tag: str | None = None
        self.in_attention = False  # inside a layer's attention interface (eager/sdpa): one kernel
        self.totals: dict[str, OpTotals] = defaultdict(OpTotals)
        # storage -> [tag, class, bytes, tensor, used in its chain] of pass-op outputs not yet
        # known to be written
        self._pending: dict[int, list] = {}

    def __enter__(self):  # noqa: ANN204
        self.active = True
        return super().__enter__()

    def __exit__(self, *exc):  # noqa: ANN002, ANN204
        self.active = False
        for tag, cls, nbytes, _, used in self._pending.values():
            if not used:  # never used again (a result): written out; used only in its chain: on chip
                self.totals[tag].by_class[cls].chain_bytes += nbytes
        self._pending.clear()
        return super().__exit__(*exc)

    def _chain(self, cls: str, ins: list, outs: list) -> None:
        """Chain-fused traffic (`ClassTotals.chain_bytes`) of one op: a pass op reads only inputs
        no pass op of its tag produced and leaves its outputs pending; any other consumer (a
        matmul, the attention kernel, another tag's op) makes a pending output written."""
        is_pass = cls in ("elementwise", "routing")
        tag = self.tag
        part = self.totals[tag].by_class[cls] if is_pass else None
        seen: set[int] = set()
        for t in ins:
            key = _storage(t)
            if key is None or key in seen:
                continue
            seen.add(key)
            hit = self._pending.get(key)
            if hit is not None and is_pass and hit[0] == tag:
                hit[4] = True
                continue  # on chip inside the chain
            if hit is not None:
                self.totals[hit[0]].by_class[hit[1]].chain_bytes += hit[2]
                del self._pending[key]
            if is_pass:
                part.chain_bytes += _tensor_bytes(t)
        if is_pass:
            for t in outs:
                key = _storage(t)
                if key is not None:
                    self._pending[key] = [tag, cls, _tensor_bytes(t), t, False]

    def _in_attention(self) -> bool:
        """Inside an attention interface's forward, or running one of the backward nodes it made."""
        if self.in_attention:
            return True
        if not self.attention_nodes:
            return False
        node = torch._C._current_autograd_node()
        if node is None:
            return False
        seq = node._sequence_nr()
        return any(lo < seq <= hi for lo, hi in self.attention_nodes)

    def new_block(self) -> None:
        self.block_mm = 0

    def _sac_saves(self, func, packet) -> bool:  # noqa: ANN001
        """Does torchtitan's op policy save this op's output (and so not run it again)?"""
        if packet in ATTENTION_PACKETS or self.in_attention:
            return True  # the fused SDPA kernel (its ops, when the interface runs eagerly)
        if func == aten.mm.default:
            self.block_mm += 1
            return self.block_mm % 2 == 1
        return func in SAC_SAVE

    def attention_io(self, *tensors: torch.Tensor) -> None:
        """Add the fused attention kernel's traffic: the bytes of `tensors`, each once."""
        if self.tag is not None and getattr(self, "active", False):
            self.totals[self.tag].attention_io += sum(_tensor_bytes(t) for t in {id(t): t for t in tensors}.values())

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
        if self.sac and self._sac_saves(func, packet):
            if not self.in_attention or packet in ATTENTION_PACKETS:  # an eager interface: its output
                tot.sac_saved_bytes += sum(_tensor_bytes(o) for o in {id(o): o for o in outs}.values())
            return
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
        vector = 0
        shapes = gemm_shapes(packet, args, out) if cube is not None else None
        if shapes and packet not in ATTENTION_PACKETS and all(
                len(g) == 4 and g[3] > 1 and g[0] < MIN_CUBE_K and g[2] < MIN_CUBE_K for g in shapes):
            # Many matmuls each smaller than one cube fractal in rows and contraction are weighted
            # sums kernels run on the vector units (e.g. mHC's per-token 4×4 mixing of residual
            # streams), not tiled GEMMs (one padded tile per token). One large matmul with a short
            # contraction (DLRM's 13 dense features) stays a GEMM with its K padded.
            cube = None
        if cube is not None:
            flops = int(cube(*args, out_val=out, **kwargs))
            cls = "attention" if packet in ATTENTION_PACKETS or self._in_attention() else (
                "grouped_gemm" if str(packet) == "aten._grouped_mm" else "gemm")
            part = tot.by_class[cls]
            part.cube_flops += flops
            tot.cube_flops += flops
            if shapes is None:
                part.shapes_known = False
            else:
                for g in shapes:
                    part.gemms[(*g[:3], *g[4:])] += g[3]
            if packet in ATTENTION_PACKETS:
                q, k = (args[1], args[2]) if "backward" in str(packet) else (args[0], args[1])
                vector = attention_score_elems(q, k)
            if str(packet) == "aten._grouped_mm" and args[1].dim() == 3 and ins[0].dim() == 2:
                # Only the experts that receive rows have their weights read.
                w = args[1]
                hit = _expected_distinct(w.shape[0], args[0].shape[0]) / w.shape[0]
                nbytes -= int(_tensor_bytes(w) * (1.0 - hit))
        else:
            part = tot.by_class["attention" if self._in_attention() else op_class(packet, self.tag)]
            if shapes:  # a short-contraction matmul: a multiply-add per term
                vector = sum(2 * m * n * k * c for m, n, k, c in shapes)
            elif packet not in _MOVE:
                # Elementwise ops: one op per output element; reductions/sorts: per input element.
                vector = max(math.prod(t.shape) for t in ins + outs)
        part.vector_flops += vector
        tot.vector_flops += vector
        part.hbm_bytes += nbytes
        tot.hbm_bytes += nbytes
        self._chain(next(k for k, v in tot.by_class.items() if v is part), ins, outs)


def class_parts(totals: OpTotals, attention_kind: str = "attention_prefill", chains: bool = False) -> dict[str, Part]:
    """The measured work of one tag by kernel class, each with its unfused bytes (its ops' inputs
    and outputs; `chains`: the element-wise and routing classes with their chain-fused bytes) and
    its matmul shapes (none when a cube op's shapes were not known). The fused attention kernel is
    named by the shape's phase (`attention_kind`)."""
    out = {}
    for cls, c in totals.by_class.items():
        kind = attention_kind if cls == "attention" else cls
        nbytes = totals.attention_io if cls == "attention" and totals.attention_io else c.hbm_bytes
        if chains and cls in ("elementwise", "routing"):
            nbytes = c.chain_bytes
        out[kind] = Part(kind, float(c.cube_flops), float(c.vector_flops), float(nbytes),
                         tuple(c.gemm_list()) if c.shapes_known else ())
    return out
