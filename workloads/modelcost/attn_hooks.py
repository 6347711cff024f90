"""Cut the attention kernel out of a measurement, so `attention.py` can price it in closed form.

For one measurement of the representative layers, on each layer the production rule replaces
(`AttnStructure.replaced`):

* the attention interface (transformers' `ALL_ATTENTION_FUNCTIONS`, sdpa or eager) returns an
  empty output of the right shape through `_Empty`, an autograd function whose backward
  returns empty gradients: no kernel ops are counted, forward or backward, and gradients still
  reach the projections. The call's q/k/v shapes and `sliding_window` are recorded;
* MLA: `kv_b_proj` (the reference's re-expansion of every cached latent) is stubbed the same
  way; absorption or expansion is priced in closed form;
* the reference's masked-dense artefacts between the kernel's inputs and its call (indexer
  scores and top-k, block masks, the gathered KV concatenation) are counted under a separate
  "<tag>~core" tag that costs ignore. That region opens at `kv_b_proj` (MLA), at the indexer's
  `scorer` (V4 CSA), after the `compressor` (V4 HCA), and closes when the interface returns;
  parameterised leaf modules inside it (the indexer's projections and norms) stay counted.

Layers with a window but no compressor or indexer are recognised at the call (the window is
an interface argument); only the interface is stubbed there. Everything is undone on exit.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .attention import AttnCall, AttnStructure, find_indexer, read_structure
from .counter import OpCounter
from .errors import CostInputError


class _Empty(torch.autograd.Function):
    """Output of a given shape with no ops; backward hands back empty gradients."""

    @staticmethod
    def forward(ctx, shape, *inputs):  # noqa: ANN001, ANN205
        ctx.metas = [(x.shape, x.dtype) for x in inputs]
        return inputs[0].new_empty(shape)

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        grads = [grad.new_empty(shape, dtype=dtype) if need else None
                 for (shape, dtype), need in zip(ctx.metas, ctx.needs_input_grad[1:], strict=True)]
        return (None, *grads)


@dataclass
class Record:
    tag: str
    structure: AttnStructure
    call: AttnCall | None = None
    replaced: bool = False

    @property
    def core_tag(self) -> str:
        return f"{self.tag}~core"


class KernelHooks:
    """Context manager installing the stubs and region hooks for one measurement."""

    def __init__(self, model: nn.Module, reps: dict[str, nn.Module], counter: OpCounter, phase: str) -> None:
        self.model = model
        self.counter = counter
        self.phase = phase
        self.records: dict[int, Record] = {}
        self.attn: dict[int, nn.Module] = {}
        for tag, attn in reps.items():
            self.records[id(attn)] = Record(tag, read_structure(attn))
            self.attn[id(attn)] = attn
        self._handles: list = []
        self._stubbed: list[nn.Module] = []
        self._impl: str | None = None
        self._saved_local = None

    # ---- install / remove ---------------------------------------------------------------
    def __enter__(self) -> KernelHooks:
        # the interface is wrapped in every mode: its ops are the attention kernel's (counter)
        impl = self.model.config._attn_implementation
        self._impl = impl
        self._saved_local = ALL_ATTENTION_FUNCTIONS._local_mapping.get(impl)
        original = None if impl == "eager" else ALL_ATTENTION_FUNCTIONS[impl]
        ALL_ATTENTION_FUNCTIONS[impl] = self._wrap(original)
        for key, rec in self.records.items():
            if rec.structure.replaced(self.phase):
                self._install_region(self.attn[key], rec)
        return self

    def __exit__(self, *exc) -> None:
        if self._impl is None:
            return
        for h in self._handles:
            h.remove()
        for lin in self._stubbed:
            del lin.forward
        if self._saved_local is None:
            del ALL_ATTENTION_FUNCTIONS[self._impl]
        else:
            ALL_ATTENTION_FUNCTIONS[self._impl] = self._saved_local

    def by_tag(self) -> dict[str, Record]:
        return {r.tag: r for r in self.records.values() if r.replaced}

    # ---- the interface ------------------------------------------------------------------
    def _wrap(self, original):  # noqa: ANN001, ANN202
        def attention(module, query, key, value, attention_mask, *args, **kwargs):  # noqa: ANN001, ANN202
            rec = self.records.get(id(module))
            window = kwargs.get("sliding_window") or None
            if rec is None or not rec.structure.replaced(self.phase, window):
                fn = original or _eager_default(module)
                self.counter.in_attention = True  # its ops are the attention kernel's
                try:
                    out = fn(module, query, key, value, attention_mask, *args, **kwargs)
                finally:
                    self.counter.in_attention = False
                # a fused kernel's traffic: q, K, V in, the output out (eager's scores stay on chip)
                self.counter.attention_io(query, key, value, out[0])
                self._backward_region(query, key, value, out[0])
                return out
            if rec.structure.mla is not None and not rec.structure.replaced(self.phase):
                # kv_b_proj was not cut out, so the expansion would be counted twice.
                raise CostInputError(f"attention: {rec.tag} is MLA with a sliding window, which the "
                                     "production rule does not cover; use attention=reference")
            rec.call = AttnCall(int(query.shape[1]), int(key.shape[1]), int(query.shape[-1]),
                                int(value.shape[-1]), window, key is value)
            rec.replaced = True
            b, h, s = query.shape[0], query.shape[1], query.shape[2]
            out = _Empty.apply((b, s, h, value.shape[-1]), query, key, value)
            if self.counter.tag == rec.core_tag:
                self.counter.tag = rec.tag
            return out, None

        return attention

    def _backward_region(self, *tensors: torch.Tensor) -> None:
        """The interface's backward is the attention kernel's too: the autograd nodes the call
        created (sequence numbers above its inputs' nodes, up to its output's) run as one backward
        attention kernel (`OpCounter.attention_nodes`; a reference implementation's bmm / softmax
        backward included: FlashAttention's backward recomputes the scores on chip), whose traffic
        is a fused kernel's: q, K, V, the output and its gradient in, the gradients of q, K, V out."""
        q, k, v, out = tensors
        if not (torch.is_grad_enabled() and out.requires_grad and out.grad_fn is not None):
            return
        counter = self.counter
        lo = max((t.grad_fn._sequence_nr() for t in (q, k, v) if t.grad_fn is not None), default=-1)
        counter.attention_nodes.append((lo, out.grad_fn._sequence_nr()))

        def enter(grad: torch.Tensor) -> None:
            counter.attention_io(q, k, v, out, grad)
            counter.attention_io(q, k, v)  # dQ, dK, dV written, as large as q, K, V

        out.register_hook(enter)

    # ---- region of reference-only ops -----------------------------------------------------
    def _install_region(self, attn: nn.Module, rec: Record) -> None:
        s = rec.structure
        ix = find_indexer(attn)
        if s.mla is not None:
            self._stub_linear(attn.kv_b_proj)
            self._on(attn.kv_b_proj, rec, pre=True)
        elif ix is not None and hasattr(ix, "scorer"):
            self._on(ix.scorer, rec, pre=True)
        elif ix is not None:
            self._on(ix, rec, pre=True)
        elif getattr(attn, "compressor", None) is not None:
            self._on(attn.compressor, rec, pre=False)
        for mod in attn.modules():
            if mod is getattr(attn, "kv_b_proj", None) or any(True for _ in mod.children()):
                continue
            if any(True for _ in mod.parameters(recurse=False)):
                self._keep_counted(mod, rec)

    def _on(self, mod: nn.Module, rec: Record, pre: bool) -> None:
        def enter(*_):
            if self.counter.tag == rec.tag:
                self.counter.tag = rec.core_tag

        if pre:
            self._handles.append(mod.register_forward_pre_hook(lambda m, a: enter()))
        else:
            self._handles.append(mod.register_forward_hook(lambda m, a, o: enter()))

    def _keep_counted(self, mod: nn.Module, rec: Record) -> None:
        """A projection inside the region is real work: count it under the layer's tag."""
        state = {"inside": False}

        def pre(m, a):  # noqa: ANN001
            if self.counter.tag == rec.core_tag:
                state["inside"] = True
                self.counter.tag = rec.tag

        def post(m, a, o):  # noqa: ANN001
            if state["inside"]:
                state["inside"] = False
                self.counter.tag = rec.core_tag

        self._handles.append(mod.register_forward_pre_hook(pre))
        self._handles.append(mod.register_forward_hook(post))

    def _stub_linear(self, lin: nn.Linear) -> None:
        def forward(x: torch.Tensor) -> torch.Tensor:
            return _Empty.apply((*x.shape[:-1], lin.out_features), x, lin.weight)

        lin.forward = forward
        self._stubbed.append(lin)


def _eager_default(module: nn.Module):  # noqa: ANN202
    """The modelling file's own eager attention (what `get_interface(..., default)` falls back to)."""
    fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if fn is None:
        raise RuntimeError(f"{type(module).__name__}: no eager_attention_forward in {type(module).__module__}")
    return fn
