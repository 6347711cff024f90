"""Measured layer costs: dense FLOPs vs closed form, MoE scaling, phases, TP/EP, caching."""

from __future__ import annotations

import pytest

from workloads.modelcost import (
    CostInputError,
    ModelCosts,
    RoutingModel,
    load_model_config,
    mlp_cost,
)
from workloads.modelcost.costs import ShapeKey
from workloads.modelcost.phase import CostPhase

SMALL_LLAMA = dict(num_hidden_layers=2, hidden_size=512, intermediate_size=1024, num_attention_heads=8,
                   num_key_value_heads=4, vocab_size=1000)
SMALL_MOE = dict(num_hidden_layers=1, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1000)


@pytest.fixture(scope="module")
def llama() -> ModelCosts:
    return ModelCosts(load_model_config("llama", SMALL_LLAMA))


def _attn_params(h: int, heads: int, kv: int) -> int:
    d = h // heads
    return h * heads * d * 2 + h * kv * d * 2  # q, o, k, v


@pytest.mark.parametrize("tokens,context,phase", [(256, 0, "prefill"), (128, 64, "prefill"), (32, 512, "decode")])
def test_dense_flops_match_2_params_tokens_plus_attention(llama, tokens, context, phase):
    h, heads, kv, inter = 512, 8, 4, 1024
    c_att = llama.layer_cost("attention", tokens, context, phase)
    c_mlp = llama.layer_cost("dense_mlp", tokens, context, phase)
    q = 1 if phase == "decode" else tokens
    n_seq = tokens // q
    # Attention matmuls: QK^T and PV over every cached + new key (full, no causal skip).
    attn_term = 4 * n_seq * heads * q * (context + q) * (h // heads)
    want_att = 2 * _attn_params(h, heads, kv) * tokens + attn_term
    want_mlp = 2 * 3 * h * inter * tokens
    assert c_att.cube_flops == pytest.approx(want_att, rel=0.02)
    assert c_mlp.cube_flops == pytest.approx(want_mlp, rel=0.02)
    assert c_att.vector_flops > 0 and c_att.vector_flops < 0.1 * c_att.cube_flops


def test_decode_reads_kv_cache(llama):
    short = llama.layer_cost("attention", 8, 128, "decode")
    long = llama.layer_cost("attention", 8, 4096, "decode")
    kv_layer = llama.kv_bytes_per_token() // 2
    assert long.cube_flops > short.cube_flops
    # Fused bytes grow by exactly the extra cached tokens' KV of 8 sequences.
    assert long.hbm_bytes_fused - short.hbm_bytes_fused == 8 * (4096 - 128) * kv_layer
    assert long.hbm_bytes >= long.hbm_bytes_fused


def test_backward_about_twice_forward(llama):
    fwd = llama.layer_cost("dense_mlp", 256, phase="train_fwd")
    bwd = llama.layer_cost("dense_mlp", 256, phase="train_bwd")
    assert bwd.cube_flops == pytest.approx(2 * fwd.cube_flops, rel=0.02)


def test_prefill_head_only_last_token(llama):
    pre = llama.layer_cost("lm_head", 512, phase="prefill", seq_len=128)
    assert pre.cube_flops == 2 * 512 * 1000 * (512 // 128)


def test_tensor_parallel_divides_cube_work(llama):
    one = llama.layer_cost("dense_mlp", 256)
    two = llama.layer_cost("dense_mlp", 256, tp=2)
    assert two.cube_flops * 2 == one.cube_flops
    assert two.weight_bytes * 2 == one.weight_bytes
    a1, a2 = llama.layer_cost("attention", 256), llama.layer_cost("attention", 256, tp=2)
    assert a2.cube_flops * 2 == a1.cube_flops


def _moe(experts: int, top_k: int) -> ModelCosts:
    cfg = load_model_config("mixtral", {**SMALL_MOE, "num_local_experts": experts, "num_experts_per_tok": top_k})
    return ModelCosts(cfg)


def test_moe_flops_scale_with_top_k_not_experts():
    t = 128
    base = _moe(8, 2).layer_cost("moe", t).cube_flops
    more_experts = _moe(64, 2).layer_cost("moe", t).cube_flops
    more_k = _moe(8, 4).layer_cost("moe", t).cube_flops
    router = lambda e: 2 * t * 256 * e  # noqa: E731
    expert = lambda k: 2 * t * k * 3 * 256 * 512  # noqa: E731
    assert base == router(8) + expert(2)
    assert more_experts == router(64) + expert(2)
    assert more_k == router(8) + expert(4)
    assert (more_k - router(8)) == 2 * (base - router(8))


def test_expert_parallel_and_skew():
    cfg = load_model_config("mixtral", {**SMALL_MOE, "num_local_experts": 8, "num_experts_per_tok": 2})
    uni = ModelCosts(cfg)
    one, four = uni.layer_cost("moe", 64), uni.layer_cost("moe", 64, ep=4)
    # Uniform EP: same rows per rank (T*k), a quarter of the expert weights.
    assert one.cube_flops == four.cube_flops
    assert four.weight_bytes < one.weight_bytes
    skew = ModelCosts(cfg, routing=RoutingModel("zipf", skew=1.2)).layer_cost("moe", 64, ep=4)
    assert skew.cube_flops > four.cube_flops  # hottest rank does more


def test_cache_hits_and_bad_inputs(llama):
    a = llama.layer_cost("attention", 64)
    assert llama.layer_cost("attention", 64) is a
    with pytest.raises(CostInputError, match="layer_type"):
        llama.layer_cost("moe", 64)
    with pytest.raises(CostInputError, match="phase"):
        llama.layer_cost("attention", 64, phase="train")
    with pytest.raises(CostInputError, match="tp"):
        llama.layer_cost("attention", 64, tp=3)


def test_disk_cache_roundtrip(tmp_path):
    cfg = load_model_config("llama", SMALL_LLAMA)
    a = ModelCosts(cfg, cache_dir=str(tmp_path)).layer_cost("dense_mlp", 32)
    assert list(tmp_path.glob("*.json"))
    b = ModelCosts(cfg, cache_dir=str(tmp_path)).layer_cost("dense_mlp", 32)
    assert a == b


def test_disk_key_spelling_is_the_field_tuple():
    """The on-disk key is the fields' tuple spelled with the phase's plain value, the same for a
    str or a CostPhase member."""
    as_str = ShapeKey("decode", 64, 4096, 1, 2, 8)
    as_member = ShapeKey(CostPhase.decode, 64, 4096, 1, 2, 8)
    assert as_str.disk() == as_member.disk() == str(("decode", 64, 4096, 1, 2, 8))
    assert as_str == as_member and hash(as_str) == hash(as_member)


def test_disk_cache_shared_by_phase_str_and_member(tmp_path):
    cfg = load_model_config("llama", SMALL_LLAMA)
    a = ModelCosts(cfg, cache_dir=str(tmp_path)).layer_cost("dense_mlp", 32, phase="prefill")
    reader = ModelCosts(cfg, cache_dir=str(tmp_path))
    reader._compute = lambda *_: pytest.fail("measured again: the member's disk key differs")
    assert reader.layer_cost("dense_mlp", 32, phase=CostPhase.prefill) == a


def test_plain_mlp_cost():
    c = mlp_cost([13, 512, 256, 64], batch=1024)
    assert c["cube_flops"] == 2 * 1024 * (13 * 512 + 512 * 256 + 256 * 64)
    assert c["params"] == 13 * 512 + 512 + 512 * 256 + 256 + 256 * 64 + 64
    bwd = mlp_cost([13, 512, 256, 64], batch=1024, phase="train_bwd")
    assert bwd["cube_flops"] > c["cube_flops"]


def test_costs_table(llama):
    df = llama.costs_table([{"tokens": 64}, {"tokens": 8, "context": 256, "phase": "decode"}])
    assert len(df) == 2 * len(llama.layer_types())
    assert {"cube_flops", "hbm_bytes_fused", "layer_type"} <= set(df.columns)
