"""Sizes: public parameter totals, KV bytes from config arithmetic, shards, bad configs."""

from __future__ import annotations

import pytest

from workloads.modelcost import ModelConfigError, ModelCosts, load_model_config, load_model_yaml

PUBLIC_TOTALS = {  # model card totals (parameters, embeddings and head included; MTP excluded)
    "deepseek_v3": 671e9,
    "deepseek_v32": 671e9,
    "deepseek_v4_flash": 284e9,
    "mixtral_8x7b": 46.7e9,
    "llama3_8b": 8.03e9,
    "qwen3_moe": 30.5e9,
}


@pytest.fixture(scope="module")
def v3() -> ModelCosts:
    return ModelCosts(load_model_yaml("deepseek_v3"))


@pytest.mark.parametrize("name", sorted(PUBLIC_TOTALS))
def test_total_params_match_public(name):
    assert ModelCosts(load_model_yaml(name)).total_params() == pytest.approx(PUBLIC_TOTALS[name], rel=0.01)


def test_deepseek_v3_kv_bytes_mla(v3):
    cfg = v3.cfg
    per_layer = (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * 2  # latent + decoupled rope key, bf16
    assert v3.kv_bytes_per_token_by_type() == {"attention": per_layer}
    assert v3.kv_bytes_per_token() == per_layer * cfg.num_hidden_layers == 70272


def test_gqa_kv_bytes():
    mc = ModelCosts(load_model_yaml("llama3_8b"))
    assert mc.kv_bytes_per_token() == 2 * 8 * 128 * 2 * 32  # K+V, 8 KV heads, head 128, bf16, 32 layers
    assert mc.activation_bytes_per_token() == 4096 * 2 * 32


def test_deepseek_v4_compressed_kv_bytes():
    mc = ModelCosts(load_model_yaml("deepseek_v4_flash"))
    cfg = mc.cfg
    rates = cfg.compress_rates
    hca = cfg.head_dim * 2 // rates["heavily_compressed_attention"]
    csa = (cfg.head_dim + cfg.index_head_dim) * 2 // rates["compressed_sparse_attention"]
    by = mc.kv_bytes_per_token_by_type()
    assert by == {"attention.heavily_compressed_attention": hca, "attention.compressed_sparse_attention": csa}
    n_csa = cfg.layer_types.count("compressed_sparse_attention")
    assert mc.kv_bytes_per_token() == hca * (cfg.num_hidden_layers - n_csa) + csa * n_csa


def test_param_counts_roles_and_shards(v3):
    pc = v3.param_counts()
    assert sum(r["total"] for r in pc.values()) == v3.total_params()
    assert sum(r["per_shard"] for r in pc.values()) == v3.total_params()
    assert set(pc) == {"embedding", "attention", "dense_mlp", "moe_experts", "shared_experts", "router",
                       "norms", "lm_head"}
    info = v3.moe_info()
    assert pc["moe_experts"]["total"] == 58 * 256 * 3 * 7168 * 2048 and info["top_k"] == 8
    sharded = v3.param_counts(tp=4, ep=64, fsdp=2)
    assert sharded["moe_experts"]["per_tp_ep_shard"] == pc["moe_experts"]["total"] // 64
    assert sharded["dense_mlp"]["per_tp_ep_shard"] == pc["dense_mlp"]["total"] // 4
    assert sharded["attention"]["per_shard"] < pc["attention"]["total"] // 2
    assert sharded["router"]["per_tp_ep_shard"] == pc["router"]["total"]  # replicated


def test_layer_plan(v3):
    plan = v3.layer_plan()
    assert plan[:3] == ["dense_mlp"] * 3 and set(plan[3:]) == {"moe"} and len(plan) == 61
    assert v3.layer_types() == ["embedding", "attention", "dense_mlp", "moe", "lm_head"]


def test_unknown_model_type_names_field():
    with pytest.raises(ModelConfigError, match=r"model_type: unknown model type 'deepsek_v3'.*deepseek_v3"):
        load_model_config("deepsek_v3")


def test_bad_override_names_field():
    with pytest.raises(ModelConfigError, match=r"overrides\.hiden_size.*hidden_size"):
        load_model_config("llama", {"hiden_size": 1})


def test_config_json_and_missing(tmp_path):
    p = tmp_path / "config.json"
    p.write_text('{"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4}')
    cfg = load_model_config(config_json=str(p), overrides={"num_hidden_layers": 3})
    assert (cfg.hidden_size, cfg.num_hidden_layers) == (256, 3)
    with pytest.raises(ModelConfigError, match="config_json"):
        load_model_config(config_json=str(tmp_path / "nope.json"))
    with pytest.raises(ModelConfigError, match="model:"):
        load_model_yaml("no_such_model")


def test_layer_params_public_api_closed_forms(v3):
    """Per decoder layer on one EP shard: routed experts = experts per rank × 3 SwiGLU matrices of
    hidden × moe_intermediate; dense FFN = 3 × hidden × intermediate; embedding and head vocab × hidden."""
    c = v3.cfg
    ep = 8
    layers = v3.layer_params(tp=1, ep=ep)
    assert len(layers) == c.num_hidden_layers == len(v3.layout.ffn)
    expert = 3 * c.hidden_size * c.moe_intermediate_size
    for kind, roles in zip(v3.layout.ffn, layers, strict=True):
        if kind == "moe":
            assert roles["moe_experts"] == c.n_routed_experts // ep * expert
            assert roles["shared_experts"] == c.n_shared_experts * expert
            assert roles["dense_mlp"] == 0
        else:
            assert roles["dense_mlp"] == 3 * c.hidden_size * c.intermediate_size
            assert roles["moe_experts"] == roles["shared_experts"] == roles["router"] == 0
    outer = v3.outer_params(tp=1, ep=ep)
    assert outer["embedding"] == outer["lm_head"] == c.vocab_size * c.hidden_size
    assert outer["final_norms"] == c.hidden_size  # one RMSNorm weight
