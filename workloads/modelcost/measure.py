"""Run one shape through the fake shard model and price each layer type's ops.

One forward through the representative layers yields every layer type at once. Module
hooks set the counter's tag: ops from a decoder layer's start up to its FFN part belong to
the attention block (norm + attention + residual glue), the rest to the FFN block; the base
model's prologue (embedding lookup, rotary, masks) to "embedding"; the final norm and head
to "lm_head". In backward, full-backward pre-hooks set the same tags as autograd reaches
each module. Decode first fills a KV cache of `context` tokens (not counted).
Training shapes end in the loss, counted as "lm_head" work: cross-entropy over the full vocabulary
on the logits upcast to fp32, as torchtitan computes it (torchtitan/components/loss.py
`cross_entropy_loss`: `cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))`), and the
backward starts from that loss (its softmax gradient and the cast back are the head's too).
With `attention="production"` the attention kernels of sparse, windowed and MLA-decode
layers are cut out (`attn_hooks.py`) and their call records returned for `attention.py`.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from workloads.common.routing import RoutingModel

from .attention import ATTENTION_MODES
from .attn_hooks import KernelHooks, Record
from .counter import OpCounter, OpTotals
from .errors import CostInputError
from .fakemodel import LayerLayout, base_model, decoder_layers, is_moe, rep_layer
from .phase import CostPhase

PHASES = tuple(p.value for p in CostPhase)
_FFN_ENTRY = ("post_attention_layernorm", "ffn_hc", "pre_feedforward_layernorm", "mlp")
_HEAD_ENTRY = ("hc_head", "norm")


@dataclass
class Shape:
    phase: str
    tokens: int          # new tokens on this rank
    context: int = 0     # tokens already cached per sequence
    seq_len: int = 0     # tokens per sequence (prefill/train); decode: always 1

    @property
    def n_seq(self) -> int:
        return self.tokens if self.phase == CostPhase.decode else self.tokens // self.seq_len

    @property
    def q_len(self) -> int:
        return 1 if self.phase == CostPhase.decode else self.seq_len


def make_shape(phase: str, tokens: int, context: int, seq_len: int | None) -> Shape:
    if phase not in PHASES:
        raise CostInputError(f"phase: {phase!r}; valid options: {', '.join(PHASES)}")
    if tokens < 1:
        raise CostInputError(f"tokens: must be >= 1, got {tokens}")
    if context < 0:
        raise CostInputError(f"context: must be >= 0, got {context}")
    if phase.startswith("train") and context:
        raise CostInputError("context: training phases have no KV cache; use seq_len for sequence length")
    seq = 1 if phase == CostPhase.decode else (seq_len or tokens)
    if tokens % seq:
        raise CostInputError(f"seq_len: {seq} does not divide tokens={tokens}")
    return Shape(phase, tokens, context, seq)


@dataclass
class Measured:
    totals: dict[str, OpTotals]
    act_in: dict[str, int] = field(default_factory=dict)    # bytes into each layer type
    act_out: dict[str, int] = field(default_factory=dict)   # bytes out of each layer type
    kv_read: dict[str, int] = field(default_factory=dict)   # cache bytes before the step
    kv_write: dict[str, int] = field(default_factory=dict)  # cache growth in the step
    expert_rows: int = 0
    attn: dict[str, Record] = field(default_factory=dict)   # layers whose kernel was cut out


def _first_tensor(x) -> torch.Tensor | None:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (tuple, list)):
        for v in x:
            t = _first_tensor(v)
            if t is not None:
                return t
    if hasattr(x, "last_hidden_state"):
        return x.last_hidden_state
    return None


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def cache_layer_bytes(layer: object) -> int:
    """Bytes of every tensor a cache layer object holds (keys, values, compressor state)."""
    total = 0
    for v in vars(layer).values():
        if isinstance(v, torch.Tensor):
            total += _nbytes(v)
        elif isinstance(v, (list, tuple)):
            total += sum(_nbytes(x) for x in v if isinstance(x, torch.Tensor))
        elif isinstance(v, dict):
            total += sum(_nbytes(x) for x in v.values() if isinstance(x, torch.Tensor))
    return total


class RoutedExperts(nn.Module):
    """Stands in for `mlp.experts`: runs the real experts module on the routed row count.

    The real call routes T tokens x top_k; here the rank's experts get the rows the routing
    model assigns (uniform: T*top_k), one expert per row, in the module's grouped-mm path.
    """

    def __init__(self, inner: nn.Module, routing: RoutingModel, n_experts: int, ep: int, sink: list) -> None:
        super().__init__()
        self.inner = inner
        self.routing = routing
        self.n_experts = n_experts
        self.ep = ep
        self.sink = sink

    def forward(self, hidden_states, top_k_index, top_k_weights, *args, **kwargs):
        tokens, top_k = top_k_index.shape[0], top_k_index.shape[-1]
        rows = self.routing.rows_on_rank(tokens, top_k, self.n_experts, self.ep)
        x = hidden_states.new_empty(rows, hidden_states.shape[-1])
        if torch.is_grad_enabled() and hidden_states.requires_grad:
            x.requires_grad_(True)
        idx = top_k_index.new_empty(rows, 1)
        w = top_k_weights.new_empty(rows, 1)
        y = self.inner(x, idx, w)
        self.sink.append((rows, y))
        return hidden_states.new_empty(hidden_states.shape)


class _Tagger:
    """Installs hooks that move the counter's tag as modules run (fwd and bwd)."""

    def __init__(self, model: nn.Module, layout: LayerLayout, counter: OpCounter, backward: bool) -> None:
        self.counter = counter
        self.handles: list = []
        self.act_in: dict[str, int] = {}
        self.act_out: dict[str, int] = {}
        reps = layout.reps
        base = base_model(model)
        # In a backward-only measurement the forward runs untagged (train_fwd prices it).
        fwd = not backward
        if fwd:
            self._pre(base, "embedding", backward=False)
        for name in _HEAD_ENTRY:
            if hasattr(base, name):
                self._pre(getattr(base, name), "lm_head", backward)
        self._pre(model.lm_head, "lm_head", backward)
        self._io(model.lm_head, "lm_head")
        if hasattr(base, "embed_tokens"):
            self._pre(base.embed_tokens, "embedding", backward)
            self._io(base.embed_tokens, "embedding")
        self._io(decoder_layers(model)[0], "layer_output")
        for layer in decoder_layers(model):
            i = layer._mc_idx
            attn_tag = layout.attention[i] if reps.get(layout.attention[i]) == i else None
            ffn_tag = layout.ffn[i] if reps.get(layout.ffn[i]) == i else None
            if fwd:
                self._pre(layer, attn_tag, backward=False)
                # a checkpointed block's policy counts its mm from the block's start
                self.handles.append(layer.register_forward_pre_hook(lambda m, a: counter.new_block()))
            else:
                self._pre(layer, ffn_tag, backward=True)  # backward enters a layer at its FFN
                self._pre(layer.self_attn, attn_tag, backward=True)
            for name in _FFN_ENTRY if fwd else ():
                if hasattr(layer, name):
                    self._pre(getattr(layer, name), ffn_tag, backward=False)
            if attn_tag:
                self._io(layer.self_attn, attn_tag)
            if ffn_tag:
                self._io(layer.mlp, ffn_tag)

    def _pre(self, mod: nn.Module, tag: str | None, backward: bool) -> None:
        def set_tag(*_):
            self.counter.tag = tag

        if backward:
            self.handles.append(mod.register_full_backward_pre_hook(lambda m, g: set_tag()))
        else:
            self.handles.append(mod.register_forward_pre_hook(lambda m, a: set_tag()))

    def _io(self, mod: nn.Module, tag: str) -> None:
        def hook(m, args, kwargs, out):
            x = _first_tensor(args) if args else _first_tensor(list(kwargs.values()))
            self.act_in[tag] = _nbytes(x)
            self.act_out[tag] = _nbytes(_first_tensor(out))

        self.handles.append(mod.register_forward_hook(hook, with_kwargs=True))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


@contextmanager
def _uncounted_cache_updates(cache, counter: OpCounter) -> Iterator[None]:  # noqa: ANN001
    """Ops inside the KV cache's `update` are not counted. transformers' dynamic cache appends by
    concatenation: every decode step reads the whole cache and writes it again (458 MB per layer
    and micro-batch on CloudMatrix-Infer's decode shape: 30 % of the step's kernel time), where a
    serving stack's paged cache writes only the new tokens (vLLM's reshape_and_cache); those bytes
    are the measured cache growth (`Measured.kv_write`), which the costs add as the KV write."""
    layers = list(getattr(cache, "layers", None) or [])
    for layer in layers:
        def update(*args, _inner=layer.update, **kwargs):  # noqa: ANN002, ANN003, ANN202
            tag, counter.tag = counter.tag, None
            try:
                return _inner(*args, **kwargs)
            finally:
                counter.tag = tag
        layer.update = update  # an instance attribute shadows the method until deleted
    try:
        yield
    finally:
        for layer in layers:
            del layer.update


def _cache_kwarg(base: nn.Module) -> str:
    params = inspect.signature(base.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _forward(model: nn.Module, ids: torch.Tensor, cache, use_cache: bool, head_last_only: bool):
    base = base_model(model)
    kw = {_cache_kwarg(base): cache} if cache is not None else {}
    out = base(input_ids=ids, use_cache=use_cache, **kw)
    hidden = out.last_hidden_state
    if head_last_only:
        hidden = hidden[:, -1:, :]
    logits = model.lm_head(hidden)
    new_cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
    return logits, new_cache


def measure_shape(
    model: nn.Module, layout: LayerLayout, mode: FakeTensorMode, shape: Shape, routing: RoutingModel,
    n_experts: int, ep: int, attention: str = "reference",
) -> Measured:
    if attention not in ATTENTION_MODES:
        raise CostInputError(f"attention: {attention!r}; valid options: {', '.join(ATTENTION_MODES)}")
    sink: list = []
    originals = {}
    for i, layer in enumerate(decoder_layers(model)):
        if is_moe(layer.mlp):
            originals[i] = layer.mlp.experts
            layer.mlp.experts = RoutedExperts(layer.mlp.experts, routing, n_experts, ep, sink)
    counter = OpCounter(sac=shape.phase == CostPhase.train_sac)
    train = shape.phase.startswith("train")
    tagger = _Tagger(model, layout, counter, backward=shape.phase == CostPhase.train_bwd)
    reps = {t: rep_layer(model, i).self_attn for t, i in layout.reps.items() if t.startswith("attention")}
    hooks = KernelHooks(model, reps if attention == "production" else {}, counter, shape.phase)
    try:
        with mode, torch.set_grad_enabled(train), hooks:
            cache = None
            before: dict[int, int] = {}
            if shape.context:
                prefix = torch.zeros(shape.n_seq, shape.context, dtype=torch.long)
                _, cache = _forward(model, prefix, None, True, True)
                sink.clear()  # the cache fill's expert calls are not the measured step's
                before = {i: cache_layer_bytes(cache.layers[i]) for i in set(layout.reps.values())}
            ids = torch.zeros(shape.n_seq, shape.q_len, dtype=torch.long)
            paged = _uncounted_cache_updates(cache if attention == "production" else None, counter)
            with counter, paged:
                if shape.phase == CostPhase.train_bwd:
                    counter.tag = None  # forward is priced by train_fwd
                logits, cache = _forward(model, ids, cache, not train, shape.phase == CostPhase.prefill)
                if train:
                    if shape.phase == CostPhase.train_fwd:
                        counter.tag = "lm_head"
                    loss = training_loss(logits, ids)
                if shape.phase == CostPhase.train_bwd:
                    fwd_sinks = list(sink)
                    counter.tag = "lm_head"
                    with warnings.catch_warnings():
                        warnings.filterwarnings("ignore", message="Full backward hook")
                        torch.autograd.backward([loss])
                    rows_tags = _expert_tags(model, layout)
                    for tag, (_, y) in zip(rows_tags, fwd_sinks, strict=True):
                        counter.tag = tag
                        if y.requires_grad:
                            torch.autograd.backward([y], [torch.empty_like(y)])
                    # Drop the gradients: a second measurement on this shard would otherwise
                    # accumulate into them (add_ instead of a fresh write) and price differently.
                    for p in model.parameters():
                        p.grad = None
                counter.tag = None
            m = Measured(dict(counter.totals), dict(tagger.act_in), dict(tagger.act_out))
            m.expert_rows = sink[0][0] if sink else 0
            m.attn = hooks.by_tag()
            if cache is not None and not train:
                for tag, i in layout.reps.items():
                    if tag.startswith("attention"):
                        after = cache_layer_bytes(cache.layers[i])
                        m.kv_read[tag] = before.get(i, 0)
                        m.kv_write[tag] = after - before.get(i, 0)
            return m
    finally:
        tagger.remove()
        for i, inner in originals.items():
            decoder_layers(model)[i].mlp.experts = inner


def training_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """torchtitan's loss: mean cross-entropy over the full vocabulary on fp32 logits."""
    return nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


def _expert_tags(model: nn.Module, layout: LayerLayout) -> list[str | None]:
    """Tag for each MoE layer's experts call, in forward order."""
    tags = []
    for layer in decoder_layers(model):
        i = layer._mc_idx
        if is_moe(layer.mlp):
            tags.append(layout.ffn[i] if layout.reps.get(layout.ffn[i]) == i else None)
    return tags
