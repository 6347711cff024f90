"""ModelPlan of a transformers model from the model-cost piece (costs measured, sizes read off).

Costs per layer type and phase come from `ModelCosts` at this rank's shape (a 61-layer model has
five distinct layer types, so a handful of measurements serve every layer; results are cached
per process). Expert-TP is 1 (TorchTitan's default with EP): attention, dense MLPs and shared
experts are TP-sharded over the TP group's `tokens`; routed experts see the 1/tp sequence shard
each rank dispatches. Routed-expert work is linear in received rows: measuring the MoE layer at
two routings (uniform and a Zipf probe) separates router + shared experts from the per-row cost.
"""

from __future__ import annotations

import math
from dataclasses import replace

from stratacl.errors import ConfigError
from workloads.common.model import hf_config
from workloads.common.model import model_costs as load_model_costs
from workloads.common.model_schema import ModelRef
from workloads.common.routing import RoutingModel
from workloads.llm_train.schema import SavedActivations, TrainStepConfig
from workloads.modelcost import ATTENTION_CORE_FORMAT, CostInputError, ModelCosts

from .activations import saved_bytes_by_type
from .blocks import ModelPlan, SubBlock, Unit
from .checkpointing import AcMode
from .layout import Layout
from .saved_deepseek import per_routed_row_bytes, per_token_bytes

_PROBE = RoutingModel("zipf", skew=1.0, seed=0)  # any skew works: it only has to change row counts


def model_ref(cfg: TrainStepConfig) -> ModelRef:
    """The workload's model reference, cut to `num_layers` decoder layers when set."""
    if not cfg.num_layers:
        return cfg.model
    return replace(cfg.model, overrides={**cfg.model.overrides, "num_hidden_layers": int(cfg.num_layers)})


def model_costs(cfg: TrainStepConfig) -> tuple[ModelCosts, ModelCosts]:
    """(uniform-routing costs, Zipf-probe costs) for the configured model, cached per process;
    its element-wise passes eager or fused as the step runs them (`compile`)."""
    ref = model_ref(cfg)
    passes = "fused" if cfg.compile else "eager"
    return load_model_costs(ref, passes=passes), load_model_costs(ref, routing=_PROBE, passes=passes)


def tokens_per_tp_group(cfg: TrainStepConfig) -> int:
    if cfg.global_batch % cfg.fsdp:
        raise ConfigError("workload.global_batch", f"{cfg.global_batch} sequences do not split over "
                          f"fsdp={cfg.fsdp} data-parallel ranks", "use a multiple of workload.fsdp")
    tokens = cfg.global_batch // cfg.fsdp * cfg.seq_len
    if tokens % cfg.tp:
        raise ConfigError("workload.seq_len", f"{tokens} tokens per TP group do not split over tp={cfg.tp}")
    return tokens


INT64_MAX = 2**63 - 1  # torch's element count: the MoE cost is measured as one rank_tokens-long sequence


def check_batch(cfg: TrainStepConfig, hbm_GB: float) -> None:
    """Refuse a batch no die can hold before the model is measured at it (a billion sequences
    would overflow torch's element count there): one micro-batch's hidden states alone, the die's
    share of tokens/tp (sequence parallel) × hidden_size × dtype_bytes, must fit the die's HBM."""
    microbatches = getattr(cfg, "microbatches", 1)
    per_seq = cfg.seq_len * int(hf_config(model_ref(cfg)).hidden_size) * cfg.model.dtype_bytes
    shards = cfg.fsdp * microbatches * cfg.tp  # a sequence's tokens are spread over tp ranks
    need = cfg.global_batch * per_seq / shards
    rank_tokens = cfg.global_batch * cfg.seq_len // shards
    if need <= hbm_GB * 1e9 and rank_tokens**2 <= INT64_MAX:
        return
    fit = max(1, min(int(hbm_GB * 1e9 * shards // per_seq), math.isqrt(INT64_MAX) * shards // cfg.seq_len))
    raise ConfigError("workload.global_batch", f"{cfg.global_batch:,} sequences of {cfg.seq_len} tokens put "
                      f"{rank_tokens:,} tokens on each die per micro-batch, whose hidden states alone "
                      f"({need / 1e9:,.1f} GB) exceed the die's {hbm_GB:g} GB of HBM",
                      f"use global_batch ≤ {fit:,} (or more fsdp / microbatches, a shorter seq_len)")


def build_plan(cfg: TrainStepConfig, layout: Layout) -> ModelPlan:
    mc, probe = model_costs(cfg)
    try:
        return _build(cfg, layout, mc, probe)
    except CostInputError as exc:
        raise ConfigError("workload.tp", str(exc), "choose tp/ep dividing the model's heads and experts") from None


def _build(cfg: TrainStepConfig, layout: Layout, mc: ModelCosts, probe: ModelCosts) -> ModelPlan:
    tp = layout.tp
    ep = layout.ep
    info = mc.moe_info()
    n_exp, top_k = info["n_routed_experts"], info.get("top_k", 0)
    layout.check(n_exp)
    tokens = tokens_per_tp_group(cfg)
    seq = cfg.seq_len
    fwd = mc.costs_for_shape(tokens, phase="train_fwd", tp=tp, ep=ep, seq_len=seq)
    bwd = mc.costs_for_shape(tokens, phase="train_bwd", tp=tp, ep=ep, seq_len=seq)
    selective = getattr(cfg, "ac", AcMode.full) == AcMode.selective_op
    if selective and cfg.saved_activations == SavedActivations.deepseek_v3:
        raise ConfigError("workload.ac", "selective_op is torchtitan's op policy over what autograd saves; "
                          "saved_activations=deepseek_v3 is DeepSeek's own", "use ac=none with deepseek_v3, "
                          "or saved_activations=autograd")
    sac = mc.costs_for_shape(tokens, phase="train_sac", tp=tp, ep=ep, seq_len=seq) if selective else {}
    saved = saved_bytes_by_type(mc, tokens, seq, tp, ep, cfg.flash_attention)
    routed = ep > 1 and n_exp > 0
    moe_sub = None
    if routed:
        moe_sub, moe_saved = _moe_block(mc, probe, tokens // tp, ep, n_exp, top_k, cfg.flash_attention, selective)
        saved["moe"] = moe_saved
    if cfg.saved_activations == SavedActivations.deepseek_v3:
        saved.update(_deepseek_saved(mc, tokens, tp, top_k if routed else 0))
    sac_saved = {t: float(c.sac_saved_bytes) for t, c in sac.items()}
    if moe_sub is not None and moe_sub.sac is not None:  # at the rank's dispatched tokens, as _moe_block
        rank = tokens // tp
        sac_saved["moe"] = float(mc.costs_for_shape(rank, phase="train_sac", tp=1, ep=ep, seq_len=rank)["moe"]
                                 .sac_saved_bytes)

    # the format each layer type's matmuls run in (workload.model.quant): forward, recompute and
    # backward alike (DeepSeek-V3 report §3.3.1: Fprop, Dgrad and Wgrad GEMMs all in FP8; torchao
    # float8 training likewise). An attention type whose projections are quantised keeps its core
    # in bf16 (as in serving): that part is priced separately.
    dtypes = mc.matmul_formats()
    cores = {ph: mc.split_cores(tokens, phase=ph, tp=tp, ep=ep, seq_len=seq) for ph in ("train_fwd", "train_bwd")}

    def sub(kind: str, style: str = "block") -> SubBlock:
        if kind == "moe" and moe_sub is not None:
            return replace(moe_sub, dtype=dtypes.get("moe", ""))
        dt = dtypes.get(kind, "")
        core_f, core_b = (cores[ph].get(kind) for ph in ("train_fwd", "train_bwd"))
        split = core_f is not None and core_b is not None
        return SubBlock(kind, fwd[kind].cost, bwd[kind].cost, style if tp > 1 else "none", dtype=dt,
                        core_fwd=core_f if split else None, core_bwd=core_b if split else None,
                        core_dtype=ATTENTION_CORE_FORMAT if split else "",
                        sac=sac[kind].cost if kind in sac else None)

    # this rank's TP/EP shard by role, per decoder layer (the model-cost piece's shard model)
    outer = mc.outer_params(tp, ep)
    units: list[Unit] = [Unit("embedding", (sub("embedding", "embedding"),), outer["embedding"], 0,
                              saved.get("embedding", 0.0), decoder=False)]
    layers = zip(mc.layout.attention, mc.layout.ffn, mc.layer_params(tp, ep), strict=True)
    for i, (attn, ffn, roles) in enumerate(layers):
        experts = roles["moe_experts"]
        params = sum(n for r, n in roles.items() if r != "moe_experts")
        if not routed:  # experts TP-sharded inside the block's own FSDP unit
            params, experts = params + experts, 0
        units.append(Unit(f"layer{i}", (sub(attn), sub(ffn)), params, experts,
                          saved.get(attn, 0.0) + saved.get(ffn, 0.0),
                          sac_saved_bytes=sac_saved.get(attn, 0.0) + sac_saved.get(ffn, 0.0)))
    units.append(Unit("lm_head", (sub("lm_head", "head"),), outer["lm_head"] + outer["final_norms"], 0,
                      saved.get("lm_head", 0.0), decoder=False))
    sp_tokens = tokens // tp if cfg.sequence_parallel else tokens
    return ModelPlan(tuple(units), int(mc.cfg.hidden_size), tokens, top_k if routed else 0,
                     n_exp if routed else 0, float(mc.activation_bytes_per_token() * sp_tokens))


def _deepseek_saved(mc: ModelCosts, tokens: int, tp: int, top_k: int) -> dict[str, float]:
    """Saved bytes per decoder layer type as DeepSeek-V3 keeps them (saved_deepseek.py)."""
    if tp != 1:
        raise ConfigError("workload.saved_activations", f"deepseek_v3 is DeepSeek-V3's training without TP, "
                          f"got tp={tp}", "use tp=1 or saved_activations=autograd")
    per_tok = per_token_bytes(mc.cfg, mc.dtype_bytes)
    out = {t: tokens * per_tok["attention"] for t in set(mc.layout.attention)}
    out["dense_mlp"] = tokens * per_tok["dense_mlp"]
    out["moe"] = tokens * (per_tok["moe"] + top_k * per_routed_row_bytes(mc.cfg))
    return out


def _moe_block(mc: ModelCosts, probe: ModelCosts, rank_tokens: int, ep: int, n_exp: int, top_k: int,
               flash: bool, selective: bool = False) -> tuple[SubBlock, float]:
    """MoE sub-block at the rank's dispatched tokens (tp=1 shard: experts are not TP-split);
    `selective`: with the part selective op AC runs again (router + shared, per row)."""
    rows_u = mc.routing.rows_on_rank(rank_tokens, top_k, n_exp, ep)
    rows_z = probe.routing.rows_on_rank(rank_tokens, top_k, n_exp, ep)
    out = []
    for phase in ("train_fwd", "train_bwd", *(("train_sac",) if selective else ())):
        u = mc.costs_for_shape(rank_tokens, phase=phase, tp=1, ep=ep, seq_len=rank_tokens)["moe"].cost
        z = probe.costs_for_shape(rank_tokens, phase=phase, tp=1, ep=ep, seq_len=rank_tokens)["moe"].cost
        row = (z - u).scale(1.0 / (rows_z - rows_u)).clip()
        out.append(((u - row.scale(rows_u)).clip(), row))
    (fb, fr), (bb, br) = out[:2]
    sb, sr = out[2] if selective else (None, None)
    saved = saved_bytes_by_type(mc, rank_tokens, rank_tokens, 1, ep, flash).get("moe", 0.0)
    return SubBlock("moe", fb, bb, "block", row_fwd=fr, row_bwd=br, sac=sb, row_sac=sr), saved

