"""The tensors a serving die allocates and frees, in order, as the framework's eager forward does.

Start-up: every weight tensor of the die's shard (sizes from the model's own shard modules:
attention projections and norms per layer, the fused expert tensors of the die's experts, the
shared expert, router, embedding and LM head), then the KV cache, one tensor per layer (SGLang's
and vLLM's per-layer KV buffers), split by each layer type's measured KV bytes per token.

An iteration of T tokens per die: the residual stream (hyper-connection copies of the hidden state
where the model has them) for the whole iteration; per layer and micro-batch, the outputs of the
attention's projections as a chain (each freed once the next is computed), then the MoE block:
router logits and top-k, the dispatch receive buffer sized by the tokens routed to this die's
experts (INT8 + per-token scale), the experts' gate/up, activation and down outputs, the combine
receive buffer (each of the micro-batch's tokens gets its top-k expert outputs back, BF16), the
shared expert and the block's output; the LM head's logits at the end. With two-batch overlap
each micro-batch runs its blocks in turn (ASSUMPTION: the other micro-batch's block temporaries
are not counted as live at the same time, which understates the peak by one block's temporaries).

Each block (attention, FFN) allocates and frees its own tensors, so the die replays a block shape
(tokens, routed rows) it has seen from the same allocator state from a memo.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from workloads.common.quant import weight_class
from workloads.modelcost import ModelCosts
from workloads.modelcost.fakemodel import base_model, rep_layer

Ops = tuple[tuple, ...]  # ("alloc", name, nbytes) | ("free", name)
FP32 = 4
INDEX = 4  # int32 expert ids
BLOCK_MEMO = 1 << 14  # block op lists kept


@dataclass(frozen=True, slots=True)
class BlockKey:
    """A block's op list is the same for every layer of one tensor kind at one shape."""

    kind: int  # the layer's tensor kind (`ServingTensors.kind`)
    micro_batch: int
    tokens: int
    routed: int | None  # rows reaching this die's experts; None: the attention block


@dataclass(frozen=True, slots=True)
class LogitsKey:
    rows: int


@dataclass(frozen=True)
class Layer:
    attention: str  # layer type of the attention block
    ffn: str  # "moe" | "dense_mlp"
    attn_outputs: tuple[int, ...]  # output features of the attention's projections, in order
    ffn_inter: int  # dense MLP intermediate size (dense_mlp)


class ServingTensors:
    """Tensor declarations of one model on one die of an EP group of `ep` dies."""

    def __init__(self, mc: ModelCosts, ep: int, dispatch_token_bytes: float) -> None:
        self.mc = mc
        self.ep = ep
        cfg = mc.cfg
        info = mc.moe_info()
        self.hidden = int(cfg.hidden_size)
        self.streams = int(getattr(cfg, "hc_mult", 1) or 1)  # hyper-connections keep several copies
        self.vocab = int(cfg.vocab_size)
        self.act = int(mc.dtype_bytes)
        self.top_k = int(info.get("top_k", 0) or 0)
        self.experts = int(info.get("n_routed_experts", 0) or 0)
        self.moe_inter = int(info.get("moe_intermediate", 0) or 0)
        self.shared_inter = int(info.get("shared_intermediate", 0) or 0) * int(info.get("n_shared_experts", 0) or 0)
        self.dispatch_token = int(round(dispatch_token_bytes))
        self.shard = mc.shard_model(1, ep if self.experts else 1)  # the shard modules the cost model measures
        layout = mc.layout
        self.layers = [self._layer(a, f) for a, f in zip(layout.attention, layout.ffn, strict=True)]
        kinds: dict[Layer, int] = {}
        self._kind = [kinds.setdefault(x, len(kinds)) for x in self.layers]  # layers with the same tensors
        self.moe_layers = sum(1 for x in self.layers if x.ffn == "moe" and self.experts)
        self._blocks: dict[BlockKey | LogitsKey, Ops] = {}  # block ops by shape: iterations repeat shapes
        self.generation = 0  # bumped when `_blocks` is cleared: a shape's ops become a new object

    def _layer(self, attention: str, ffn: str) -> Layer:
        return _layer(self.mc, self.shard, attention, ffn)

    # ------------------------------------------------------------------ start-up
    def weight_tensors(self) -> list[int]:
        """Bytes of every weight tensor of the die, in load order."""
        return [b for b, _ in _weights(self.mc, self.shard)]

    def expert_tensor_ids(self) -> list[int]:
        """Positions in `weight_tensors` of the routed and shared experts' tensors (what an expert
        placement replicates)."""
        return [i for i, (_, expert) in enumerate(_weights(self.mc, self.shard)) if expert]

    def kv_tensors(self, total_bytes: float) -> list[int]:
        """The KV cache split over the layers by their measured KV bytes per token."""
        per_type = self.mc.kv_bytes_per_token_by_type()
        w = [float(per_type.get(x.attention, 0)) for x in self.layers]
        s = sum(w)
        if s <= 0:
            return []
        return [int(total_bytes * x / s) for x in w if x > 0]

    # ------------------------------------------------------------------ iterations
    def kind(self, i: int) -> int:
        """Layer i's tensor kind: layers of one kind allocate the same tensors."""
        return self._kind[i]

    def block_ops(self, i: int, m: int, tokens: int, routed: int | None) -> Ops:
        """Ops of layer i's attention block (`routed` None) or FFN block for micro-batch m of
        `tokens` tokens, `routed` rows of which reach this die's experts; the dispatch / combine
        receive buffers are named `dispatch.m` / `combine.m`."""
        key = BlockKey(self._kind[i], m, tokens, routed)
        ops = self._blocks.get(key)
        if ops is None:
            layer = self.layers[i]
            if len(self._blocks) >= BLOCK_MEMO:
                self._blocks.clear()
                self.generation += 1
            ops = self._blocks[key] = tuple(_attn_ops(self, layer, m, tokens) if routed is None
                                            else _ffn_ops(self, layer, m, tokens, routed))
        return ops

    def open_ops(self, tokens: int) -> Ops:
        return (("alloc", "residual", self.streams * tokens * self.hidden * self.act),)

    def logits_ops(self, rows: int) -> Ops:
        key = LogitsKey(rows)
        ops = self._blocks.get(key)
        if ops is None:
            ops = self._blocks[key] = (("alloc", "logits", rows * self.vocab * FP32), ("free", "logits"))
        return ops

    def close_ops(self) -> Ops:
        return (("free", "residual"),)


@lru_cache(maxsize=64)
def _layer(mc: ModelCosts, shard: torch.nn.Module, attention: str, ffn: str) -> Layer:
    layout = mc.layout
    a = rep_layer(shard, layout.reps[attention])
    outs = tuple(int(m.weight.shape[0]) for _, m in a.self_attn.named_modules()
                 if isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 2)
    inter = 0
    if ffn != "moe":
        f = rep_layer(shard, layout.reps[ffn])
        down = getattr(f.mlp, "down_proj", None)
        inter = int(down.weight.shape[1]) if down is not None else 0
    return Layer(attention, ffn, outs, inter)


@lru_cache(maxsize=8)
def _weights(mc: ModelCosts, shard: torch.nn.Module) -> tuple[tuple[int, bool], ...]:
    """(bytes, is an expert tensor) of each weight tensor in load order, each in its class's
    numeric format (workload.model.quant, as ModelCosts.weight_bytes_by_role weighs them): the
    router in the model's dtype, norms and other unquantised parameters in the dtype the module
    declares (some FP32: DeepSeek-V4's hyper-connection mixing, norms, attention sinks)."""
    layout = mc.layout
    f = lambda p, cls: _nbytes(p, mc, cls)  # noqa: E731
    out = [(f(p, weight_class("embedding")), False) for p in base_model(shard).embed_tokens.parameters()]
    for attention, ffn in zip(layout.attention, layout.ffn, strict=True):
        a = rep_layer(shard, layout.reps[attention])
        fl = rep_layer(shard, layout.reps[ffn])
        out += [(f(p, None if "norm" in n else weight_class(attention)), False) for n, p in a.named_parameters()
                if not n.startswith("mlp.")]
        for n, p in fl.mlp.named_parameters():
            if n.startswith("gate."):  # the router, a projection held in the model's dtype: transformers
                # declares DeepSeek-V3's FP32 (_keep_in_fp32_modules_strict), but the checkpoint stores
                # it BF16 and vLLM's GateLinear (a ReplicatedLinear) keeps the model's dtype
                out.append((p.numel() * mc.dtype_bytes, False))
            else:
                out.append((f(p, weight_class(ffn)), ffn == "moe" and n.startswith(("experts.", "shared_experts."))))
    out += [(f(p, None), False) for n, p in base_model(shard).named_parameters()
            if not n.startswith(("layers.", "embed_tokens."))]
    out += [(f(p, weight_class("lm_head")), False) for p in shard.lm_head.parameters()]
    return tuple((b, e) for b, e in out if b > 0)


def _nbytes(p: torch.Tensor, mc: ModelCosts | None = None, cls: str | None = None) -> int:
    """Bytes of a parameter; with a weight class, in that class's format instead of the shard's dtype."""
    per = float(p.element_size()) if mc is None or cls is None else mc.formats.bytes(cls, mc.dtype_bytes)
    return int(round(p.numel() * per))


def _attn_ops(t: ServingTensors, layer: Layer, m: int, tok: int) -> list[tuple]:
    """Attention block: input norm, the projections' outputs as a chain, the block's output (added
    into the residual stream in place)."""
    ops: list[tuple] = []
    a = lambda n, b: ops.append(("alloc", f"{n}.{m}", int(b)))  # noqa: E731
    f = lambda n: ops.append(("free", f"{n}.{m}"))  # noqa: E731
    H, act = t.hidden, t.act
    a("norm", tok * H * act)
    prev = "norm"
    for j, out in enumerate(layer.attn_outputs):
        a(f"p{j}", tok * out * act)
        f(prev)
        prev = f"p{j}"
    a("attn", tok * H * act)
    f(prev)
    f("attn")
    return ops


def _ffn_ops(t: ServingTensors, layer: Layer, m: int, tok: int, rows: int) -> list[tuple]:
    """FFN block: norm, then the MoE (router, dispatch, experts, combine, shared expert) or the
    dense MLP, and the block's output."""
    ops: list[tuple] = []
    a = lambda n, b: ops.append(("alloc", f"{n}.{m}", int(b)))  # noqa: E731
    f = lambda n: ops.append(("free", f"{n}.{m}"))  # noqa: E731
    H, act = t.hidden, t.act
    a("norm2", tok * H * act)
    if layer.ffn == "moe" and t.experts:
        a("logits", tok * t.experts * FP32)
        a("topk", tok * t.top_k * (INDEX + FP32))
        f("logits")
        a("dispatch", rows * t.dispatch_token)  # receive buffer, sized by this layer's routing
        a("gate_up", rows * 2 * t.moe_inter * act)
        a("swiglu", rows * t.moe_inter * act)
        f("gate_up")
        a("down", rows * H * act)
        f("swiglu")
        a("combine", tok * t.top_k * H * act)  # receive buffer of the combine
        f("down")
        f("dispatch")
        if t.shared_inter:
            a("sh_gate_up", tok * 2 * t.shared_inter * act)
            a("sh_act", tok * t.shared_inter * act)
            f("sh_gate_up")
            f("sh_act")
        a("ffn", tok * H * act)
        f("combine")
        f("topk")
    else:
        a("gate_up", tok * 2 * layer.ffn_inter * act)
        a("swiglu", tok * layer.ffn_inter * act)
        f("gate_up")
        a("ffn", tok * H * act)
        f("swiglu")
    f("norm2")
    f("ffn")
    return ops
