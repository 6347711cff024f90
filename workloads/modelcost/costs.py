"""ModelCosts: the cheap, cached question "what does layer X cost at shape S on one rank?"."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import pandas as pd
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from transformers import PretrainedConfig

from workloads.common.cost import Cost, Part
from workloads.common.quant import Formats, TensorClass, weight_class
from workloads.common.routing import RoutingModel

from .attention import ATTENTION_KEY, ATTENTION_MODES, CoreCost, core_cost
from .counter import class_parts
from .diskcache import DiskCache
from .errors import CostInputError
from .fakemodel import (
    LayerLayout,
    base_model,
    build_fake_shard,
    build_meta,
    decoder_layers,
    is_moe,
    layer_layout,
    rep_layer,
    torch_dtype,
)
from .measure import PHASES, Measured, Shape, make_shape, measure_shape
from .phase import CostPhase
from .sizes import ROLES, count_by_role, count_layer_by_role

CACHE_VERSION = "modelcost-11"  # 11: an attention interface's backward is one attention kernel; 10: a training backward's attention is the attention_backward kernel, train_sac; 9: training shapes count the fp32 cross-entropy loss; 8: production decode does not count the dynamic cache's concatenation; 7: matmuls with K < 16 are vector work; 3: per-class numeric formats; 4: per-kernel-class parts with matmul shapes; 5: chain-fused pass bytes; 6: query heads sharing a KV head packed into rows
# how the element-wise and routing passes run: "fused" = each chain of ops as one kernel (CANN's
# fused operators in serving, torch.compile in training); "eager" = every aten op its own kernel
PASS_MODES = ("fused", "eager")
ATTENTION_CORE_FORMAT = "bf16"  # scores/values over the KV cache: bf16 in W8A8 and FP8 stacks


@dataclass(frozen=True, slots=True)
class ShapeKey:
    """One measured shape on one TP/EP shard: what `ModelCosts` memoises costs by."""

    phase: str
    tokens: int
    context: int
    seq_len: int
    tp: int
    ep: int

    @classmethod
    def of(cls, shape: Shape, tp: int, ep: int) -> ShapeKey:
        return cls(shape.phase, shape.tokens, shape.context, shape.seq_len, tp, ep)

    def disk(self) -> str:
        """The disk cache's spelling: the fields' tuple, the phase as its plain value, so the
        cache files on disk stay valid whatever phase type a caller passes."""
        return str((str(self.phase), self.tokens, self.context, self.seq_len, self.tp, self.ep))


@dataclass(frozen=True)
class LayerCost:
    """Per-rank cost of one layer of a type at one shape.

    hbm_bytes: every op's inputs+outputs (no fusion; upper bound).
    hbm_bytes_fused: weights (experts actually hit) + layer input/output + KV read/write
    (training backward: weights + weight grads + activations and their grads).
    """

    cube_flops: int
    vector_flops: int
    hbm_bytes: int
    hbm_bytes_fused: int
    weight_bytes: int
    activation_bytes_out: int
    # the work by kernel class: (kernel, cube, vector, bytes charged, ((m, n, k, count), ...));
    # see `_parts`
    parts: tuple[tuple, ...] = ()
    sac_saved_bytes: int = 0  # train_sac: the outputs selective op AC saves (per rank)

    def __post_init__(self) -> None:  # from the disk cache: lists back to tuples
        object.__setattr__(self, "parts", tuple(
            (p[0], p[1], p[2], p[3], tuple(tuple(int(x) for x in g) for g in p[4])) for p in self.parts))

    @property
    def flops(self) -> int:
        return self.cube_flops + self.vector_flops

    @property
    def cost(self) -> Cost:
        """The cost workloads schedule: cube and vector FLOPs, and by kernel class (`parts`) the
        fused HBM estimate on the matmul and attention kernels plus the unfused passes' own
        bytes (so its bytes are hbm_bytes_fused + the passes')."""
        parts = tuple(Part(k, float(c), float(v), float(b), tuple(g)) for k, c, v, b, g in self.parts)
        if not parts:
            return Cost(float(self.cube_flops), float(self.vector_flops), float(self.hbm_bytes_fused))
        return Cost(float(self.cube_flops), float(self.vector_flops), sum(p.hbm_bytes for p in parts), parts)

    def gemms(self) -> tuple[tuple[int, int, int, int], ...]:
        """Every matmul of the layer (projections, experts, attention core) as (m, n, k, count)."""
        return tuple(tuple(g[:4]) for p in self.parts for g in p[4])


_ATTN_ROLES = ("attention", "norms")  # roles a decoder layer's attention representative holds
_FFN_ROLES = ("dense_mlp", "moe_experts", "shared_experts", "router")


def _pow2(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length() if n > 0 else 0


def _param_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


class ModelCosts:
    """Costs and sizes of one model, measured from its transformers definition.

    attention: "production" (default) prices sparse, windowed and MLA-decode attention as
    production kernels compute it (`attention.py`); "reference" keeps transformers' dense
    masked computation. None: the config's `modelcost_attention` attribute (from the override
    of that name or a model node's `attention` key, see `config.py`), else production.
    """

    def __init__(
        self,
        hf_config: PretrainedConfig,
        dtype_bytes: int = 2,
        routing: RoutingModel | None = None,
        cache_dir: str | None = None,
        bucket: str = "exact",
        attention: str | None = None,
        formats: Formats | None = None,
        passes: str = "fused",
    ) -> None:
        if bucket not in ("exact", "pow2"):
            raise CostInputError(f"bucket: {bucket!r}; valid options: exact, pow2")
        if passes not in PASS_MODES:
            raise CostInputError(f"passes: {passes!r}; valid options: {', '.join(PASS_MODES)}")
        self.passes = passes
        attention = attention or getattr(hf_config, ATTENTION_KEY, None) or "production"
        if attention not in ATTENTION_MODES:
            raise CostInputError(f"attention: {attention!r}; valid options: {', '.join(ATTENTION_MODES)}")
        self.attention = attention
        self.cfg = hf_config
        self.dtype_bytes = dtype_bytes
        # numeric format per tensor class: measured bytes (in `dtype`) are rescaled per class
        self.formats = formats or Formats(native=True)
        self.dtype = torch_dtype(dtype_bytes)
        self.routing = routing or RoutingModel()
        self.bucket = bucket
        self._meta = build_meta(hf_config, self.dtype)
        self._layout: LayerLayout = layer_layout(hf_config, self._meta)
        self._mode = FakeTensorMode()
        self._shards: dict[tuple[int, int], torch.nn.Module] = {}
        self._memo: dict[ShapeKey, dict[str, LayerCost]] = {}
        self._cores: dict[ShapeKey, dict[str, CoreCost]] = {}
        self._disk = DiskCache(cache_dir)
        self._model_key = (f"{CACHE_VERSION}|{dtype_bytes}|{self.formats.key()}|{self.routing}|{attention}|{passes}|"
                           f"{hf_config.to_json_string(use_diff=False)}")

    # ---- structure -------------------------------------------------------------------
    @property
    def layout(self) -> LayerLayout:
        """Per decoder layer: its attention and FFN layer types, and each type's representative."""
        return self._layout

    @property
    def fake_mode(self) -> FakeTensorMode:
        """The FakeTensorMode the shard models' parameters live in (run them under it)."""
        return self._mode

    def layer_types(self) -> list[str]:
        attn = list(dict.fromkeys(self._layout.attention))
        ffn = [k for k in ("dense_mlp", "moe") if k in self._layout.ffn]
        return ["embedding", *attn, *ffn, "lm_head"]

    def layer_plan(self) -> list[str]:
        return list(self._layout.ffn)

    def attention_plan(self) -> list[str]:
        return list(self._layout.attention)

    def moe_info(self) -> dict:
        cfg = self.cfg
        moe_layers = [i for i, k in enumerate(self._layout.ffn) if k == "moe"]
        if not moe_layers:
            return {"n_routed_experts": 0, "top_k": 0, "n_moe_layers": 0}
        layer = decoder_layers(self._meta)[moe_layers[0]]
        gate_up = layer.mlp.experts.gate_up_proj
        shared = getattr(layer.mlp, "shared_experts", None) or getattr(layer.mlp, "shared_expert", None)
        return {
            "n_routed_experts": int(gate_up.shape[0]),
            "top_k": int(cfg.num_experts_per_tok),
            "hidden": int(cfg.hidden_size),
            "moe_intermediate": int(gate_up.shape[1] // 2),
            "n_shared_experts": int(getattr(cfg, "n_shared_experts", 0) or (1 if shared is not None else 0)),
            "shared_intermediate": int(shared.down_proj.weight.shape[1]) if shared is not None else 0,
            "n_moe_layers": len(moe_layers),
            "first_moe_layer": moe_layers[0],
            "routed_scaling_factor": getattr(cfg, "routed_scaling_factor", None),
        }

    # ---- sizes -----------------------------------------------------------------------
    def total_params(self) -> int:
        return sum(p.numel() for p in self._meta.parameters())

    def shard_model(self, tp: int, ep: int) -> torch.nn.Module:
        """One TP/EP rank's shard of the model on fake tensors (reduced depth: one representative
        decoder layer per layer type, `rep_layer`), cached per (tp, ep)."""
        for name, v in (("tp", tp), ("ep", ep)):
            if not isinstance(v, int) or v < 1:
                raise CostInputError(f"{name}: must be a positive int, got {v!r}")
        if ep > 1 and "moe" not in self._layout.ffn:
            raise CostInputError(f"ep: {ep} given but the model has no MoE layers")
        key = (tp, ep)
        if key not in self._shards:
            self._shards[key] = build_fake_shard(self.cfg, self._layout, tp, ep, self.dtype, self._mode)
        return self._shards[key]

    def param_counts(self, tp: int = 1, ep: int = 1, fsdp: int = 1) -> dict[str, dict[str, int]]:
        """Per role: total parameters, parameters per shard (TP/EP split, then FSDP), layers."""
        if not isinstance(fsdp, int) or fsdp < 1:
            raise CostInputError(f"fsdp: must be a positive int, got {fsdp!r}")
        totals = count_by_role(self._meta, decoder_layers(self._meta))
        local: dict[str, int] = dict.fromkeys(ROLES, 0)
        for layer in self.layer_params(tp, ep):
            for role, n in layer.items():
                local[role] += n
        outer = self.outer_params(tp, ep)
        local["embedding"] = outer["embedding"]
        local["lm_head"] = outer["lm_head"]
        local["norms"] += outer["final_norms"]
        out = {}
        for role in ROLES:
            if totals.get(role, 0) == 0:
                continue
            out[role] = {
                "total": totals[role],
                "per_tp_ep_shard": local[role],
                "per_shard": math.ceil(local[role] / fsdp),
            }
        return out

    def layer_params(self, tp: int = 1, ep: int = 1) -> list[dict[str, int]]:
        """Per decoder layer, its parameters on one TP/EP shard by role: attention and norms from
        its attention type's representative layer, the FFN roles (dense_mlp, moe_experts,
        shared_experts, router) from its FFN type's."""
        shard = self.shard_model(tp, ep)
        lay = self._layout
        out = []
        for attn, ffn in zip(lay.attention, lay.ffn, strict=True):
            by_a = count_layer_by_role(rep_layer(shard, lay.reps[attn]), lay.reps[attn])
            by_f = count_layer_by_role(rep_layer(shard, lay.reps[ffn]), lay.reps[ffn])
            roles = {r: by_a.get(r, 0) for r in _ATTN_ROLES}
            roles.update({r: by_f.get(r, 0) for r in _FFN_ROLES})
            out.append(roles)
        return out

    def outer_params(self, tp: int = 1, ep: int = 1) -> dict[str, int]:
        """Parameters outside the decoder layers on one TP/EP shard: the token embedding, the LM
        head, and the final norms (every other parameter of the base model)."""
        shard = self.shard_model(tp, ep)
        base = base_model(shard)
        return {
            "embedding": base.embed_tokens.weight.numel(),
            "lm_head": shard.lm_head.weight.numel(),
            "final_norms": sum(p.numel() for n, p in base.named_parameters()
                               if not n.startswith(("layers.", "embed_tokens."))),
        }

    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token adds over all layers, measured from the model's own cache."""
        if not hasattr(self, "_kv"):
            window = max(int(getattr(self.cfg, "sliding_window", 0) or 0), 128)
            ctx, new = 8 * window, 8 * window  # multiples of any compression rate <= 128
            m = self._measure(make_shape("prefill", new, ctx, None), 1, 1)
            kv = self._ratio("kv_cache")
            self._kv = {t: int(m.kv_write[t] * kv) // new for t in m.kv_write}
        return sum(v * self._layout.count(t) for t, v in self._kv.items())

    def kv_bytes_per_token_by_type(self) -> dict[str, int]:
        self.kv_bytes_per_token()
        return dict(self._kv)

    def activation_bytes_per_token(self) -> int:
        """Residual-stream bytes per token at every decoder-layer boundary, summed over layers
        (what layer-boundary activation checkpointing or pipeline stages keep)."""
        if not hasattr(self, "_act"):
            tokens = 16
            m = self._measure(make_shape("train_fwd", tokens, 0, None), 1, 1)
            self._act = m.act_out["layer_output"] // tokens
        return self._act * len(self._layout.ffn)

    # ---- costs -----------------------------------------------------------------------
    def train_forward(self, tokens: int, seq_len: int, tp: int, ep: int) -> None:
        """Run one training forward of the (tp, ep) shard model (`tokens` in sequences of
        `seq_len`, transformers' reference attention modules, the routed-expert stand-in) for
        callers that observe it with hooks, e.g. the tensors autograd saves for backward."""
        n_exp = self.moe_info()["n_routed_experts"]
        measure_shape(self.shard_model(tp, ep), self._layout, self._mode, make_shape("train_fwd", tokens, 0, seq_len),
                      self.routing, n_exp, ep)

    def _measure(self, shape, tp: int, ep: int) -> Measured:
        n_exp = self.moe_info()["n_routed_experts"]
        return measure_shape(self.shard_model(tp, ep), self._layout, self._mode, shape, self.routing, n_exp, ep,
                             attention=self.attention)

    def _weights(self, tp: int, ep: int, layer_type: str, expert_rows: int) -> tuple[int, int]:
        """(all shard weight bytes, bytes a fused kernel reads: only experts that get rows), each
        weight class in its format (`self.formats`)."""
        return self._weights3(tp, ep, layer_type, expert_rows)[:2]

    def _weights3(self, tp: int, ep: int, layer_type: str, expert_rows: int) -> tuple[int, int, int]:
        """`_weights` and the routed experts' share of the bytes read (the grouped GEMM's)."""
        shard = self.shard_model(tp, ep)
        r = self._ratio(weight_class(layer_type))
        if layer_type == "embedding":
            b = int(_param_bytes(base_model(shard).embed_tokens) * r)
            return b, b, 0
        if layer_type == "lm_head":
            b = int(_param_bytes(shard.lm_head) * r) + _param_bytes(base_model(shard).norm)
            return b, b, 0
        layer = rep_layer(shard, self._layout.reps[layer_type])
        if layer_type.startswith("attention"):
            b = int(_param_bytes(layer.self_attn) * r)
            return b, b, 0
        total = _param_bytes(layer.mlp)
        if not is_moe(layer.mlp):
            b = int(total * r)
            return b, b, 0
        experts = _param_bytes(layer.mlp.experts)
        shared_mod = getattr(layer.mlp, "shared_experts", None) or getattr(layer.mlp, "shared_expert", None)
        shared = _param_bytes(shared_mod) if shared_mod is not None else 0
        rest = total - experts - shared  # router (and its bias) stays in the model's dtype
        e_local = layer.mlp.experts.gate_up_proj.shape[0]
        hit = e_local * (1.0 - (1.0 - 1.0 / e_local) ** expert_rows)
        routed = int(experts * r * hit / e_local)
        return int(rest + (experts + shared) * r), int(rest + shared * r) + routed, routed

    def _ratio(self, cls: str) -> float:
        return self.formats.ratio(cls, self.dtype_bytes)

    def weight_bytes_by_role(self, tp: int = 1, ep: int = 1) -> dict[str, float]:
        """Weight bytes per role on one TP/EP shard, each role in its class's format (norms and
        router stay in the model's dtype)."""
        out = {}
        for role, v in self.param_counts(tp=tp, ep=ep).items():
            cls = weight_class(role)
            b = self.formats.bytes(cls, self.dtype_bytes) if cls else float(self.dtype_bytes)
            out[role] = float(v["per_tp_ep_shard"]) * b
        return out

    def matmul_formats(self) -> dict[str, str]:
        """Format each layer type's matmuls run in (its projections; the attention core is
        `ATTENTION_CORE_FORMAT`): picks the die's cube peak. The embedding gather and the LM head
        run in the embedding's own format."""
        f = self.formats
        out = {}
        for t in self.layer_types():
            cls = weight_class(t)
            if cls == TensorClass.embedding:
                out[t] = "bf16" if f.native else str(f.embedding)
            else:
                out[t] = str(f.matmul(cls))
        return out

    def costs_for_shape(
        self, tokens: int, context: int = 0, phase: str = "prefill", tp: int = 1, ep: int = 1,
        seq_len: int | None = None,
    ) -> dict[str, LayerCost]:
        """Every layer type's cost at one shape (one measured forward/backward, cached)."""
        shape, key = self._shape_key(tokens, context, phase, tp, ep, seq_len)
        if key in self._memo:
            return self._memo[key]
        disk_key = f"{self._model_key}|{key.disk()}"
        cached = self._disk.get(disk_key)
        if cached is not None:
            result = {t: LayerCost(**v) for t, v in cached.items()}
        else:
            result = self._compute(shape, tp, ep)
            self._disk.put(disk_key, {t: asdict(c) for t, c in result.items()})
        self._memo[key] = result
        return result

    def _shape_key(self, tokens: int, context: int, phase: str, tp: int, ep: int,
                   seq_len: int | None) -> tuple[Shape, ShapeKey]:
        if self.bucket == "pow2":
            tokens, context = _pow2(tokens), _pow2(context) if context else 0
            seq_len = _pow2(seq_len) if seq_len else None
        shape = make_shape(phase, tokens, context, seq_len)
        return shape, ShapeKey.of(shape, tp, ep)

    def _compute(self, shape: Shape, tp: int, ep: int) -> dict[str, LayerCost]:
        m = self._measure(shape, tp, ep)
        io = m  # a backward measurement records its (untagged) forward's module boundaries too
        cores = {t: core_cost(r.structure, r.call, shape.phase, shape.n_seq, shape.q_len, shape.context,
                              self.dtype_bytes) for t, r in m.attn.items()}
        self._cores[ShapeKey.of(shape, tp, ep)] = cores
        out = {}
        for t in self.layer_types():
            tot = m.totals.get(t)
            if tot is None:
                raise CostInputError(f"layer_type: {t!r} saw no ops at {shape} (model structure not recognised)")
            core = cores.get(t)
            w_all, w_read, w_routed = self._weights3(tp, ep, t, m.expert_rows)
            acts = io.act_in.get(t, 0) + io.act_out.get(t, 0)
            if shape.phase == CostPhase.train_bwd:
                fused = 2 * w_read + 2 * acts
                kv, routed = 0.0, 2 * w_routed
            else:
                kv_read = m.kv_read.get(t, 0) - (core.kv_unread_bytes if core else 0)
                kv = (max(kv_read, 0) + m.kv_write.get(t, 0)) * self._ratio("kv_cache")
                fused = w_read + acts + kv
                routed = w_routed
            out[t] = LayerCost(
                cube_flops=tot.cube_flops + (core.cube_flops if core else 0),
                vector_flops=tot.vector_flops + (core.vector_flops if core else 0),
                hbm_bytes=tot.hbm_bytes + (core.hbm_bytes if core else 0),
                hbm_bytes_fused=int(fused),
                weight_bytes=w_all,
                activation_bytes_out=io.act_out.get(t, 0),
                parts=_parts(tot, core, shape.phase, int(fused), kv, routed, self.passes == "fused"),
                sac_saved_bytes=tot.sac_saved_bytes,
            )
        return out

    def attention_cores(
        self, tokens: int, context: int = 0, phase: str = "prefill", tp: int = 1, ep: int = 1,
        seq_len: int | None = None,
    ) -> dict[str, CoreCost]:
        """The closed-form kernel part of each replaced attention layer type at one shape
        (empty in reference mode or for dense attention). Included in `layer_cost`."""
        shape, key = self._shape_key(tokens, context, phase, tp, ep, seq_len)
        if key not in self._cores:
            self._compute(shape, tp, ep)
        return dict(self._cores[key])

    def core_split_types(self) -> list[str]:
        """Attention layer types whose projections' matmuls run in another format than the
        attention core (`ATTENTION_CORE_FORMAT`; e.g. INT8 projections under W8A8): their core is
        priced as a kernel of its own, in its own format."""
        fmt = self.matmul_formats()
        return [t for t in dict.fromkeys(self._layout.attention) if fmt[t] != ATTENTION_CORE_FORMAT]

    def split_cores(
        self, tokens: int, context: int = 0, phase: str = "prefill", tp: int = 1, ep: int = 1,
        seq_len: int | None = None,
    ) -> dict[str, Cost]:
        """The attention kernel of each `core_split_types` type at this shape (its part of the
        layer's cost: FLOPs, the KV traffic it carries, its QKᵀ/PV shapes). The projections are
        the layer's cost minus it."""
        costs = self.costs_for_shape(tokens, context, phase, tp, ep, seq_len)
        att = _attention_kind(phase)
        out = {}
        for t in self.core_split_types():
            core = costs[t].cost.only(att)
            if core.cube_flops > 0:
                out[t] = core
        return out

    def layer_cost(
        self, layer_type: str, tokens: int, context: int = 0, phase: str = "prefill", tp: int = 1,
        ep: int = 1, seq_len: int | None = None,
    ) -> LayerCost:
        """Per-rank cost of one `layer_type` layer. prefill/train: `tokens` split into sequences
        of `seq_len` (default: one sequence) after `context` cached tokens; decode: `tokens`
        sequences of one new token each, each with `context` cached tokens."""
        types = self.layer_types()
        if layer_type not in types:
            raise CostInputError(f"layer_type: {layer_type!r}; valid options: {', '.join(types)}")
        return self.costs_for_shape(tokens, context, phase, tp, ep, seq_len)[layer_type]

    def costs_table(self, shapes: list[dict]) -> pd.DataFrame:
        """One row per (shape, layer type). Each shape: dict of layer_cost keyword args."""
        rows = []
        for s in shapes:
            s = {"context": 0, "phase": "prefill", "tp": 1, "ep": 1, **s}
            for t, c in self.costs_for_shape(**s).items():
                rows.append({**s, "layer_type": t, **asdict(c),
                             "intensity_flop_per_byte": round(c.flops / max(c.hbm_bytes_fused, 1), 1)})
        return pd.DataFrame(rows)


def _attention_kind(phase: str) -> str:
    if phase == CostPhase.train_bwd:
        return "attention_backward"  # FlashAttention's backward kernel
    return "attention_decode" if phase == CostPhase.decode else "attention_prefill"


def _parts(tot, core: CoreCost | None, phase: str, fused: int, kv: float,  # noqa: ANN001
           routed: float, chains: bool = True) -> tuple[tuple, ...]:
    """A layer type's work by kernel class (counter.class_parts; the closed-form attention core
    joins the attention class) with the bytes each kernel is charged:

    * the fused traffic (weights + layer I/O + KV: `hbm_bytes_fused`) on the matmul and attention
      kernels: the KV read/write on the attention kernel, the routed experts' weights on the
      grouped GEMM, the rest (projection / MLP / shared-expert / router weights and the layer's
      input and output) on the dense GEMM — a share whose kernel is absent goes to the first
      present of grouped_gemm, gemm, attention, routing, elementwise;
    * each pass (elementwise: norms, RoPE, casts, activations, quant/dequant; routing: router
      softmax/top-k, token permutes, gathers) the bytes it reads and writes when each chain of
      its ops runs as one kernel (CANN's fused operators npu_rms_norm, npu_rotary_mul,
      npu_swiglu, npu_dynamic_quant; torch.compile in training): the counter's `chain_bytes`,
      measured — at most the unfused count b_u of the class; with `chains` False (eager PyTorch,
      `passes="eager"`: every aten op its own kernel) the unfused count b_u itself;
    * the attention kernel at least its measured input/output (q, K/V, output: flash attention's
      traffic; in decode the KV read, which then is not counted twice);
    * a layer with no matmul (the embedding gather) keeps the fused traffic alone, split over its
      kernels in proportion to their measured bytes.

    So the parts' bytes sum to hbm_bytes_fused + the passes' measured bytes + the attention
    kernel's I/O beyond the KV traffic."""
    att = _attention_kind(phase)
    parts = class_parts(tot, att, chains=chains)
    if core is not None:
        p = parts.get(att, Part(att))
        parts[att] = Part(att, p.cube_flops + core.cube_flops, p.vector_flops + core.vector_flops,
                          p.hbm_bytes + core.hbm_bytes, (p.gemms + core.gemms) if (p.gemms or not p.cube_flops) else ())
    parts = {k: p for k, p in parts.items() if not p.empty}
    matmul = [k for k in ("grouped_gemm", "gemm", att) if k in parts and parts[k].cube_flops > 0]
    charged: dict[str, float] = {}
    if matmul:
        share = {att: kv, "grouped_gemm": routed}
        share["gemm"] = max(fused - kv - routed, 0.0)
        order = ["grouped_gemm", "gemm", att, "routing", "elementwise"]
        for k, b in share.items():
            dest = k if k in matmul else next(x for x in order if x in parts)
            charged[dest] = charged.get(dest, 0.0) + b
        for k in ("elementwise", "routing"):
            if k in parts:
                charged[k] = charged.get(k, 0.0) + parts[k].hbm_bytes
        if att in parts:  # the attention kernel reads q and K/V and writes its output: at least
            charged[att] = max(charged.get(att, 0.0), parts[att].hbm_bytes)  # its measured I/O
    elif parts:
        u = sum(p.hbm_bytes for p in parts.values())
        for k, p in parts.items():
            charged[k] = fused * (p.hbm_bytes / u if u > 0 else 1.0 / len(parts))
    return tuple((k, int(p.cube_flops), int(p.vector_flops), int(round(charged.get(k, 0.0))), p.gemms)
                 for k, p in parts.items())


__all__ = ["PHASES", "LayerCost", "ModelCosts"]
