"""Numeric formats per tensor class and expert placement with redundancy (issue 13 items 1, 3, 4)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from helpers import compose_run, make_library

from stratacl.errors import ConfigError
from stratacl.machine.fabric import Fabric
from stratacl.workload_api import RunContext
from workloads.common.model import model_costs
from workloads.common.model_schema import ModelRef
from workloads.common.placement import contiguous, copies, eplb
from workloads.common.quant import resolve
from workloads.common.routing import expert_weights, route
from workloads.llm_infer.costs import ServingCosts, payload_bytes
from workloads.llm_infer.iteration import IterationModel
from workloads.llm_infer.memory import role_dies, serving_tensors, weight_bytes_per_die
from workloads.llm_infer.tensors import ServingTensors
from workloads.llm_infer.workload import serving_costs

TINY = {"num_hidden_layers": 3, "first_k_dense_replace": 1, "hidden_size": 256, "intermediate_size": 512,
        "moe_intermediate_size": 128, "n_routed_experts": 16, "num_experts_per_tok": 4, "n_group": 1,
        "topk_group": 1, "num_attention_heads": 4, "num_key_value_heads": 4, "kv_lora_rank": 64,
        "q_lora_rank": 64, "qk_rope_head_dim": 16, "qk_nope_head_dim": 32, "v_head_dim": 32, "vocab_size": 1024}


def tiny(quant: str = "", formats: dict | None = None, **over: int):  # noqa: ANN201
    return model_costs(ModelRef(preset="deepseek_v3", overrides={**TINY, **over}, quant=quant,
                                formats=formats or {}))


# ---------------------------------------------------------------------------- formats
def test_weight_bytes_per_die_follow_each_class_format() -> None:
    bf, w8, w4 = tiny("bf16"), tiny("w8a8"), tiny("w4a8")
    # parameters on one die of EP4 (TP1), counted by hand from TINY's DeepSeek-V3 layout: 3 layers,
    # layer 0 dense, layers 1-2 MoE with 16 routed experts (4 per die) and one shared expert
    h, heads = 256, 4
    attention = 3 * (h * 64 + 64  # MLA per layer: q_a_proj + q_a_layernorm (q_lora_rank 64)
                     + 64 * heads * (32 + 16)  # q_b_proj: nope 32 + rope 16 per head
                     + h * (64 + 16) + 64  # kv_a_proj_with_mqa (kv_lora_rank 64 + rope 16) + its norm
                     + 64 * heads * (32 + 32)  # kv_b_proj: nope key + value per head
                     + heads * 32 * h)  # o_proj
    dense = 3 * h * 512  # gate, up, down of layer 0
    experts = 2 * 4 * 3 * h * 128  # 2 MoE layers × 4 experts × (gate, up, down)
    shared = 2 * 3 * h * 128
    router = 2 * 16 * h
    norms = 3 * 2 * h + h  # input + post-attention norm per layer, final norm
    embed = head = 1024 * h
    bf16_bytes = 2 * (attention + dense + experts + shared + router + norms + embed + head)
    assert weight_bytes_per_die(bf, 4) == pytest.approx(bf16_bytes)
    # w8a8: experts, attention (its LoRA norms filed with it), dense MLP at 1 byte; embedding,
    # LM head, norms, router at 2
    one = experts + shared + attention + dense
    assert weight_bytes_per_die(w8, 4) == pytest.approx(bf16_bytes - one)
    # w4a8: routed + shared experts at int4 with a bf16 scale per 128-weight group: 0.5 + 2/128 B
    assert weight_bytes_per_die(w4, 4) == pytest.approx(bf16_bytes - one - (experts + shared) * (1 - (0.5 + 2 / 128)))
    # the layer costs read the narrower weights too: a weight-bound decode layer reads less
    moe_bf = bf.layer_cost("moe", 64, context=1024, phase="decode", ep=4).hbm_bytes_fused
    moe_w8 = w8.layer_cost("moe", 64, context=1024, phase="decode", ep=4).hbm_bytes_fused
    assert moe_w8 < 0.75 * moe_bf


def test_kv_bytes_per_token_follow_the_kv_format() -> None:
    assert tiny("w8a8").kv_bytes_per_token() == tiny("bf16").kv_bytes_per_token()  # w8a8 keeps a bf16 cache
    assert tiny("bf16", {"kv_cache": "int8"}).kv_bytes_per_token() == pytest.approx(
        tiny("bf16").kv_bytes_per_token() / 2, rel=1e-3)


def test_dispatch_payload_follows_the_activation_format() -> None:
    hidden, ratio = TINY["hidden_size"], 0.0714
    w = compose_run(["workload=llm_infer"]).workload
    for quant, disp, comb in (("bf16", 2 * hidden, 2 * hidden), ("w8a8", hidden * (1 + ratio), 2 * hidden),
                              ("fp8", hidden * (1 + ratio), 2 * hidden), ("", hidden * (1 + ratio), 2 * hidden)):
        costs = ServingCosts(tiny(quant), 4, 4, 1024)
        assert payload_bytes(costs, ratio) == pytest.approx((disp, comb)), quant
        # the allocator's dispatch buffer holds what the trace sends (it assumed INT8 before)
        w.dispatch_scale_ratio = ratio
        assert serving_tensors(costs, w, "decode").dispatch_token == round(disp), quant


def test_each_layer_type_takes_its_own_weight_class_format() -> None:
    """Experts alone in INT8 (their weights and the activations entering them): the MoE layer's
    matmuls and weights move, no other layer type's; the MoE layer holds one byte less per expert
    parameter."""
    base = tiny("bf16")
    mixed = tiny("bf16", {"expert_weights": "int8", "activations": "int8"})
    assert mixed.matmul_formats() == {t: ("int8" if t == "moe" else "bf16") for t in base.layer_types()}
    n = base.param_counts(tp=1, ep=1)
    per_layer = (n["moe_experts"]["per_tp_ep_shard"] + n["shared_experts"]["per_tp_ep_shard"]) \
        // base.moe_info()["n_moe_layers"]
    for t in base.layer_types():
        drop = base.layer_cost(t, 64).weight_bytes - mixed.layer_cost(t, 64).weight_bytes
        assert drop == (per_layer if t == "moe" else 0), t


def test_matmuls_pick_the_die_peak_of_their_format() -> None:
    assert tiny("w8a8").matmul_formats()["moe"] == "int8"
    assert tiny("bf16", {"expert_weights": "int4"}).matmul_formats()["moe"] == "bf16"  # weight-only: dequantised
    assert tiny("w4a8").matmul_formats()["moe"] == "int8"
    ascend = Fabric(compose_run([]).fabric)
    assert ascend.cube_peak("int8") == pytest.approx(2 * ascend.cube_peak("bf16"))
    assert ascend.cube_format("fp8") == "bf16"  # the 910C has no FP8: dequantised to bf16
    assert ascend.cube_format("int4") == "int8"
    b200 = Fabric(compose_run(["fabric=dgx_b200"]).fabric)
    assert b200.cube_peak("fp8") == pytest.approx(2 * b200.cube_peak("bf16"))


def test_bad_quant_names_the_field() -> None:
    with pytest.raises(ConfigError, match="workload.model.quant"):
        resolve("int3")
    with pytest.raises(ConfigError, match="workload.model.formats"):
        resolve("w8a8", {"kv_cache": "int3"})


def cloudmatrix_prefill_die(quant: str):  # noqa: ANN201
    """The prefill die of `+experiment=cloudmatrix_infer` (EP32, 4K-token prompts per die) as fixed
    mode starts it: the serving allocator model with the fixed shape as its largest forward."""
    cfg = compose_run(["+experiment=cloudmatrix_infer"])
    w = cfg.workload
    w.model.quant = quant
    fab = Fabric(cfg.fabric)
    mc = model_costs(w.model)
    costs = serving_costs(mc, w, 0)
    shares = expert_weights(costs.experts, w.skew, w.zipf_s, seed=0)
    dies = role_dies(serving_tensors(costs, w, "prefill"), make_library(fab, "cann_ep"), w, "prefill",
                     fab.hbm_bytes, costs, weights=shares, seed=0, profile=w.fixed.prefill_tokens_per_die)
    return dies[0], mc, costs


def test_w8a8_deepseek_v3_fits_a_32_die_prefill_instance_and_bf16_does_not() -> None:
    die, _, _ = cloudmatrix_prefill_die("w8a8")
    p = die.plan
    assert 30e9 < p.weights < 45e9 and p.kv > 10e9
    assert p.activations > 0 and p.comm_buffers > 0  # the profiling forward and HCCL's buffers took their share
    assert p.weights + p.activations + p.kv + p.library <= 0.9 * p.hbm  # memory_utilization 0.9
    with pytest.raises(ConfigError) as bf16:
        cloudmatrix_prefill_die("bf16")
    e = bf16.value
    assert e.field == "workload.layout.prefill_ep"
    assert "does not fit a prefill die with 'cann_ep'" in e.problem
    need = float(e.problem.split("weights need ")[1].split(" GiB")[0])
    # DeepSeek-V3's parameters on one die of EP32 (config.json: hidden 7168, 61 layers of which 3
    # dense, 256 routed experts of intermediate 2048 → 8 per die, one shared expert, vocab 129280)
    h = 7168
    mla = (h * 1536 + 1536 + 1536 * 128 * (128 + 64)  # q_a_proj + q_a_layernorm + q_b_proj
           + h * (512 + 64) + 512 + 512 * 128 * (128 + 128)  # kv_a_proj_with_mqa + kv_a_layernorm + kv_b_proj
           + 128 * 128 * h)  # o_proj
    expert = 3 * h * 2048
    params = (2 * 129280 * h + 61 * mla + 3 * 3 * h * 18432 + 58 * (8 + 1) * expert  # routed + shared
              + 58 * 256 * h + 61 * 2 * h + h)  # routers, layer norms, final norm
    assert need == pytest.approx(2 * params / 2**30, abs=0.05)  # BF16: 69.9 GiB > 64 GB HBM
    assert "workload.fixed" in e.fix and "\n" not in str(e)


@pytest.mark.parametrize("quant", ["w8a8", "bf16"])
def test_allocator_weights_agree_with_the_closed_form(quant: str) -> None:
    """The weight tensors the die allocates (tensors.py) and the closed form per role
    (ModelCosts.weight_bytes_by_role, from param_counts) differ by exactly the LoRA norms inside
    MLA attention (q_a_layernorm, kv_a_layernorm): param_counts files them under the attention role,
    so a W8A8 closed form counts them INT8, while the die keeps norms in the model's dtype (norms
    are not quantised). 124,928 B on V3 EP32 (61 layers × (1536 + 512)); none in BF16. The router
    is in the model's dtype in both (transformers declares V3's FP32; the serving die holds BF16)."""
    if quant == "w8a8":
        die, mc, _ = cloudmatrix_prefill_die(quant)
    else:  # BF16 does not fit the die: the tensors alone
        die, mc = None, model_costs(ModelRef(preset="deepseek_v3", quant=quant))
    st = ServingTensors(mc, 32, 7168)
    closed = weight_bytes_per_die(mc, 32)
    attn_fmt = mc.formats.bytes("attention_weights", mc.dtype_bytes)
    norms = 61 * (1536 + 512)  # q_a_layernorm (q_lora_rank 1536) + kv_a_layernorm (kv_lora_rank 512) per layer
    assert sum(st.weight_tensors()) - closed == pytest.approx(norms * (mc.dtype_bytes - attn_fmt), abs=1)
    assert st.weight_tensors().count(256 * 7168 * mc.dtype_bytes) == 58  # each MoE layer's router, 2 B each
    if die is not None:  # the allocator: each tensor rounded up to 512 B, the placement scales nothing here
        n = len(st.weight_tensors())
        assert 0 <= die.plan.weights - sum(st.weight_tensors()) < 512 * n


# ---------------------------------------------------------------------------- placement
def test_eplb_replicates_hot_experts_and_conserves_tokens() -> None:
    experts, ep, k, tokens = 64, 24, 8, 96  # 24 does not divide 64: 64 + 8 redundant = 72 = 3 per die
    shares = expert_weights(experts, "zipf", 1.0, seed=3)
    pl = eplb(shares, ep, k, redundant=8, shared_replicas=0)
    reps = pl.replicas()[:experts]
    assert reps.sum() == experts + 8 and (pl.slots_per_die() == 3).all()
    hot = np.argsort(shares)[::-1]
    assert (reps[hot[:4]] > 1).all() and (reps[hot[-32:]] == 1).all()
    # no die holds two replicas of one expert
    assert len(set(zip(pl.slot_expert, pl.slot_die, strict=True))) == len(pl.slot_expert)
    choice = route(tokens, ep, experts, k, shares, np.random.default_rng(0), placed=True)
    dest, weight = pl.destinations(choice)
    disp, rows = copies(dest, weight, ep, per_expert=True)
    assert disp.sum() == rows.sum() == ep * tokens * k  # every (token, expert) row lands once
    # a replicated expert's tokens split evenly over its replicas
    e = hot[0]
    hit = dest[choice == e]
    counts = np.bincount(hit, minlength=ep)[counts_nz := np.bincount(hit, minlength=ep) > 0]
    assert counts_nz.sum() == reps[e] and counts.max() - counts.min() <= 1
    # balanced against the same skew on plain contiguous blocks (64 / 16 dies)
    naive = eplb(shares, 16, k)  # eplb without redundancy is already a balanced packing
    block = contiguous(experts, 16)
    load = lambda p: np.bincount(p.slot_die, weights=shares[list(p.slot_expert)], minlength=p.ep)  # noqa: E731
    assert load(naive).max() < load(block).max()


def test_shared_expert_replicas_take_one_copy_of_every_token() -> None:
    experts, ep, k, tokens = 16, 24, 4, 32
    pl = eplb(np.full(experts, 1 / experts), ep, k, redundant=4, shared_replicas=4, shared_weight=2.0)
    assert (pl.shared_slots_per_die() <= 1).all() and pl.shared_slots_per_die().sum() == 4
    choice = route(tokens, ep, experts, k, np.full(experts, 1 / experts), np.random.default_rng(1), placed=True)
    dest, weight = pl.destinations(choice)
    disp, rows = copies(dest, weight, ep, per_expert=True)
    assert disp.sum() == ep * tokens * (k + 1)
    assert rows.sum() == pytest.approx(ep * tokens * (k + 2.0))  # shared rows count twice (wider)
    shared_dies = np.flatnonzero(pl.shared_slots_per_die())
    np.testing.assert_allclose(np.bincount(dest[..., -1].ravel(), minlength=ep)[shared_dies], ep * tokens / 4)


def test_contiguous_placement_still_needs_a_divisor() -> None:
    mc = tiny()
    cfg = compose_run(["workload=llm_infer"]).workload
    cfg.layout.prefill_ep = 24
    with pytest.raises(ConfigError, match="prefill_ep.*divide"):
        serving_costs(mc, cfg, 0)
    cfg.layout.expert_placement = "eplb"
    with pytest.raises(ConfigError, match="exceeds the 16 expert slots"):
        serving_costs(mc, cfg, 0)


def test_ep320_with_redundant_and_shared_replicas_runs() -> None:
    over = ["workload=llm_infer", "library=[cann_ep,stratacl]", "baseline=cann_ep"]
    cfg = compose_run(over)
    w = cfg.workload
    w.layout.decode_dp = w.layout.decode_ep = 320
    w.layout.prefill_instances, w.layout.decode_instances = 1, 1
    w.layout.expert_placement = "eplb"
    w.layout.decode_redundant_experts = 32
    w.layout.decode_shared_expert_replicas = 32
    w.scheduler.tbo_min_tokens = 0
    mc = tiny("w8a8", n_routed_experts=256)
    fab = Fabric(cfg.fabric)
    libs = {n: make_library(fab, n) for n in cfg.library}
    ctx = RunContext(cfg=cfg, fabric=fab, libraries=libs, baseline="cann_ep", seed=0)
    w2 = copy.deepcopy(w)
    costs = serving_costs(mc, w2, 0)
    pl = costs.placement["decode"]
    assert (pl.slots_per_die() == 1).all() and pl.shared_replicas == 32
    assert costs.measure_ep["decode"] == 256
    it = IterationModel(ctx, costs, w2)
    tr = it.trace("decode", 48, 4096)
    moe = [op for op in tr.ops if ".moe." in op.name and op.core == "mixed"]  # fused W8A8 grouped matmul
    assert moe and len(moe[0].flops) == 320 and moe[0].dtype == "int8"
    # the shared expert runs on its 32 replicas as routed rows: no die runs it for its own tokens,
    # and the gate (router GEMM, top-k) is the same on every die: its own micro-batch of 24
    names = {op.name for op in tr.ops}
    assert not any(".shared." in n for n in names)
    gate = next(op for op in tr.ops if op.name.startswith("L3.gate.mb0") and op.kernel == "gemm")
    assert np.ptp(np.asarray(gate.flops)) == 0
    gemm_rows = {g[0] for g in gate.gemms}
    assert gemm_rows == {24} and all(g[1] == 256 for g in gate.gemms)  # a micro-batch of 24: one logit per expert
    a, b = it.decode("cann_ep", 48, 4096), it.decode("stratacl", 48, 4096)
    assert a.time_s > 0 and b.time_s > 0 and np.isfinite([a.time_s, b.time_s]).all()


def test_moe_work_conserves_the_layer_and_follows_whose_tokens() -> None:
    """The MoE layer split three ways (gate, local shared expert, routed experts) adds back up to
    the measured layer when every die gets the mean rows; the gate and the shared expert do not
    follow a die's received rows, the routed experts do (twice the rows, twice the work)."""
    cfg = compose_run(["workload=llm_infer", "library=[cann_ep]", "baseline=cann_ep"])
    costs = serving_costs(tiny("w8a8", n_routed_experts=256), cfg.workload, 0)
    phase, tokens = "decode", 32
    cost = costs.decode(tokens, 1024)["moe"]
    pl = costs.placement[phase]
    assert pl.shared_local
    mean = np.full(pl.ep, tokens * costs.top_k, dtype=float)
    rows = mean * np.where(np.arange(pl.ep) == 0, 2.0, 1.0)
    w = costs.moe_per_die(phase, cost, tokens, rows)
    var = cost.less_bytes(costs.experts // costs.measure_ep[phase] * costs.expert_bytes + costs.shared_bytes)
    total = w.gate.cube_flops + w.shared.cube_flops + w.routed.cube_flops
    assert total == pytest.approx(var.cube_flops, rel=1e-9)
    assert w.gate.cube_flops > 0 and w.shared.cube_flops > w.gate.cube_flops  # router << shared expert
    assert w.scale[0] == pytest.approx(2.0) and w.scale[1:] == pytest.approx(1.0)
    assert {p.kernel for p in w.gate.parts} == {"gemm", "routing"} and {p.kernel for p in w.routed.parts} >= {"grouped_gemm"}


def test_die_rows_conserve_every_tokens_rows_and_eplb_flattens_them() -> None:
    """Expected rows per die sum to top_k + the shared row per token; a uniform router on a
    contiguous placement loads every die alike; replicating hot experts lowers the busiest die."""
    shares = expert_weights(256, "zipf", 0.6, seed=0)
    plain = eplb(shares, 256, 8, 0, 0, 1.0)
    balanced = eplb(shares, 288, 8, 32, 0, 1.0)
    shared = eplb(shares, 320, 8, 32, 32, 1.0)
    assert plain.die_rows(shares, 8).sum() == pytest.approx(8.0)
    assert shared.die_rows(shares, 8).sum() == pytest.approx(9.0)  # + one shared-expert row per token
    uni = contiguous(256, 32).die_rows(np.full(256, 1 / 256), 8)
    assert np.ptp(uni) == pytest.approx(0.0) and uni.sum() == pytest.approx(8.0)
    def peak(p):  # noqa: ANN001, ANN202
        r = p.die_rows(shares, 8)
        return r.max() / r.mean()
    assert peak(balanced) < peak(plain)
