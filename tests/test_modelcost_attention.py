"""Attention as production kernels compute it (issue 13 item 2) vs closed forms.

Every closed form here is written from the architecture's definition (window, compression rate,
top-k, head counts and dims from the config) with continuous approximations of the token sums,
independently of `attention.py`'s exact integer sums; both modes must land within 2 % (issue: 10 %).
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from workloads.modelcost import (
    CostInputError,
    LayerCost,
    ModelConfigError,
    ModelCosts,
    load_model_config,
)
from workloads.modelcost.attention import sum_floor, sum_min
from workloads.modelcost.config import config_from_node

SMALL_MOE = dict(n_routed_experts=8, num_experts_per_tok=2, vocab_size=1000)
V4 = dict(num_hidden_layers=4, **SMALL_MOE)  # layer types: HCA, HCA, HCA, CSA (real attention dims)
V32 = dict(num_hidden_layers=1, **SMALL_MOE)
HCA, CSA = "attention.heavily_compressed_attention", "attention.compressed_sparse_attention"
CONTEXTS = (4096, 65536)


def close(got: float, want: float, rel: float = 0.02) -> bool:
    return abs(got - want) <= rel * abs(want)


# ---- token sums ---------------------------------------------------------------------------
def test_token_sums_match_brute_force():
    rng = random.Random(0)
    for _ in range(300):
        a = rng.randint(1, 3000)
        b = a + rng.randint(0, 3000)
        cap = rng.choice([None, 1, 7, 128, 512, 2048])
        m = rng.choice([1, 4, 128])
        ns = range(a, b + 1)
        assert sum_min(a, b, cap) == sum(n if cap is None else min(cap, n) for n in ns)
        assert sum_floor(a, b, m, cap) == sum(n // m if cap is None else min(cap, n // m) for n in ns)


# ---- DeepSeek-V4: sliding window + compressed (HCA) / compressed-sparse (CSA) -------------------
@pytest.fixture(scope="module")
def v4_cfg():
    return load_model_config("deepseek_v4", V4)


@pytest.fixture(scope="module")
def v4(v4_cfg) -> ModelCosts:
    return ModelCosts(v4_cfg)


@pytest.fixture(scope="module")
def v4_ref(v4_cfg) -> ModelCosts:
    return ModelCosts(v4_cfg, attention="reference")


def _v4_proj_params(c, kind: str) -> int:
    """Matmul weights a V4 attention block applies to every token (hyper-connection mixer included)."""
    h, H, D = c.hidden_size, c.num_attention_heads, c.head_dim
    p = h * c.q_lora_rank + c.q_lora_rank * H * D + h * D  # q_a, q_b, kv_proj
    p += H * D * c.o_lora_rank + c.o_groups * c.o_lora_rank * h  # grouped o_a, o_b
    p += (2 + c.hc_mult) * c.hc_mult * c.hc_mult * h  # attn_hc.fn
    if kind == HCA:
        p += 2 * h * D  # compressor kv_proj, gate_proj
    else:
        p += 2 * h * 2 * D  # compressor (two overlapping series)
        p += 2 * h * 2 * c.index_head_dim + c.q_lora_rank * c.index_n_heads * c.index_head_dim  # indexer
        p += h * c.index_n_heads  # indexer weights_proj
    return p


def _rate(c, kind: str) -> int:
    return c.compress_rates[kind.split(".", 1)[1]]


def _v4_prefill_keys(c, kind: str, S: int) -> tuple[float, float]:
    """(keys visited, keys the indexer scores) summed over S prompt queries, continuous form."""
    W = c.sliding_window
    window = S * W - W * W / 2
    if kind == HCA:
        return window + S * S / (2 * _rate(c, kind)), 0.0
    m, K = _rate(c, kind), c.index_topk
    picked = S * S / (2 * m) if K * m >= S else K * K * m / 2 + K * (S - K * m)
    return window + picked, S * S / (2 * m)


@pytest.mark.parametrize("S", CONTEXTS)
@pytest.mark.parametrize("kind", [HCA, CSA])
def test_v4_prefill_production_matches_closed_form(v4, kind, S):
    c = v4.cfg
    H, D = c.num_attention_heads, c.head_dim
    visited, scored = _v4_prefill_keys(c, kind, S)
    want = 2 * _v4_proj_params(c, kind) * S + 2 * H * (D + D) * visited
    want += 2 * c.index_n_heads * c.index_head_dim * scored
    got = v4.layer_cost(kind, S)
    assert close(got.cube_flops, want)
    core = v4.attention_cores(S)[kind]
    assert close(core.visited_keys, visited, 0.01)
    assert close(core.scored_keys, scored, 0.01) if scored else core.scored_keys == 0


@pytest.mark.parametrize("S", CONTEXTS)
@pytest.mark.parametrize("kind", [HCA, CSA])
def test_v4_prefill_reference_is_dense_masked(v4_ref, kind, S):
    """transformers computes every query against all S raw keys and all S/m compressed ones."""
    c = v4_ref.cfg
    H, D, m = c.num_attention_heads, c.head_dim, _rate(c, kind)
    want = 2 * _v4_proj_params(c, kind) * S + 4 * H * D * S * (S + S / m)
    if kind == CSA:
        want += 2 * c.index_n_heads * c.index_head_dim * S * S / m
    assert close(v4_ref.layer_cost(kind, S).cube_flops, want)


@pytest.mark.parametrize("C", CONTEXTS)
@pytest.mark.parametrize("kind", [HCA, CSA])
def test_v4_decode_matches_closed_form(v4, v4_ref, kind, C):
    c, B = v4.cfg, 8
    H, D, W, m, K = c.num_attention_heads, c.head_dim, c.sliding_window, _rate(c, kind), c.index_topk
    entries = (C + 1) // m
    scored = entries if kind == CSA else 0
    visited = W + (min(K, entries) if kind == CSA else entries)
    proj = 2 * _v4_proj_params(c, kind) * B
    idx = 2 * c.index_n_heads * c.index_head_dim * scored * B
    assert close(v4.layer_cost(kind, B, C, "decode").cube_flops, proj + 4 * H * D * visited * B + idx)
    # Reference: the window cache plus every compressed entry, the top-k only as a mask.
    assert close(v4_ref.layer_cost(kind, B, C, "decode").cube_flops, proj + 4 * H * D * (W + entries) * B + idx)


def test_v4_decode_reads_only_selected_entries(v4, v4_ref):
    """Fused bytes drop by exactly the compressed entries no query selects (CSA); HCA reads all."""
    c, B, C = v4.cfg, 4, 65536
    m, K, D = _rate(c, CSA), c.index_topk, c.head_dim
    prod, ref = v4.layer_cost(CSA, B, C, "decode"), v4_ref.layer_cost(CSA, B, C, "decode")
    assert ref.hbm_bytes_fused - prod.hbm_bytes_fused == B * (C // m - K) * D * 2
    assert v4.layer_cost(HCA, B, C, "decode").hbm_bytes_fused == v4_ref.layer_cost(HCA, B, C, "decode").hbm_bytes_fused


def test_v4_csa_saturates_with_context(v4):
    """Past index_topk * m cached tokens CSA attends a fixed window + top-k; only the indexer grows."""
    cores = [v4.attention_cores(4, C, "decode")[CSA] for C in (8192, 16384, 32768)]
    c = v4.cfg
    assert all(k.visited_keys == 4 * (c.sliding_window + c.index_topk) for k in cores)
    scored = [k.scored_keys for k in cores]
    assert scored[1] == pytest.approx(2 * scored[0], rel=1e-3) and scored[2] == pytest.approx(2 * scored[1], rel=1e-3)


def test_v4_training_backward_is_twice_the_kernel(v4, v4_ref):
    S = 4096
    fwd = v4.attention_cores(S, phase="train_fwd")[CSA]
    bwd = v4.attention_cores(S, phase="train_bwd")[CSA]
    H, D = v4.cfg.num_attention_heads, v4.cfg.head_dim
    attn_fwd = 2 * H * 2 * D * fwd.visited_keys  # the indexer gets no gradient
    assert bwd.cube_flops == 2 * attn_fwd
    assert v4.layer_cost(CSA, S, phase="train_bwd").cube_flops < v4_ref.layer_cost(CSA, S, phase="train_bwd").cube_flops


# ---- DeepSeek-V3.2: MLA + DSA indexer ---------------------------------------------------------
@pytest.fixture(scope="module")
def v32_cfg():
    return load_model_config("deepseek_v32", V32)


@pytest.fixture(scope="module")
def v32(v32_cfg) -> ModelCosts:
    return ModelCosts(v32_cfg)


@pytest.fixture(scope="module")
def v32_ref(v32_cfg) -> ModelCosts:
    return ModelCosts(v32_cfg, attention="reference")


def _v32_dims(c):
    return (c.num_attention_heads, c.kv_lora_rank, c.qk_rope_head_dim, c.qk_nope_head_dim, c.v_head_dim,
            c.index_topk, c.index_n_heads, c.index_head_dim)


def _v32_proj_params(c) -> int:
    """Per-token matmul weights other than kv_b_proj (the part the kernel form decides)."""
    h = c.hidden_size
    H, r, rope, nope, v, _, HI, DI = _v32_dims(c)
    p = h * c.q_lora_rank + c.q_lora_rank * H * (nope + rope) + h * (r + rope) + H * v * h
    return p + c.q_lora_rank * HI * DI + h * DI + h * HI  # indexer wq_b, wk, weights_proj


@pytest.mark.parametrize("S", CONTEXTS)
def test_v32_prefill_production_matches_closed_form(v32, S):
    c = v32.cfg
    H, r, rope, nope, v, K, HI, DI = _v32_dims(c)
    index = 2 * HI * DI * S * S / 2
    # masked MHA: expand every latent, attend the dense causal range; absorbed MQA: top-k only.
    mha = 2 * S * r * H * (nope + v) + 2 * H * (nope + rope + v) * S * S / 2
    picked = S * S / 2 if S <= K else K * K / 2 + K * (S - K)
    mqa = S * 2 * H * r * (nope + v) + H * (2 * (r + rope) + 2 * r) * picked
    core = v32.attention_cores(S)["attention"]
    assert core.form == ("mla_expanded" if mha < mqa else "mla_absorbed")
    want = 2 * _v32_proj_params(c) * S + index + min(mha, mqa)
    assert close(v32.layer_cost("attention", S).cube_flops, want)


@pytest.mark.parametrize("S", CONTEXTS)
def test_v32_prefill_reference_is_dense_masked(v32_ref, S):
    c = v32_ref.cfg
    H, r, rope, nope, v, K, HI, DI = _v32_dims(c)
    want = 2 * _v32_proj_params(c) * S + 2 * S * r * H * (nope + v)  # kv_b_proj over the prompt
    want += 2 * H * (nope + rope + v) * S * S + 2 * HI * DI * S * S + 2 * HI * S * S  # sdpa, scores, weighting
    assert close(v32_ref.layer_cost("attention", S).cube_flops, want)


@pytest.mark.parametrize("C", CONTEXTS)
def test_v32_decode_absorbed_over_selected_latents(v32, v32_ref, C):
    c, B = v32.cfg, 8
    H, r, rope, nope, v, K, HI, DI = _v32_dims(c)
    proj = 2 * _v32_proj_params(c) * B
    index = 2 * HI * DI * (C + 1) * B
    absorbed = B * (2 * H * r * (nope + v) + H * (2 * (r + rope) + 2 * r) * min(K, C + 1))
    got = v32.layer_cost("attention", B, C, "decode")
    assert v32.attention_cores(B, C, "decode")["attention"].form == "mla_absorbed"
    assert close(got.cube_flops, proj + index + absorbed)
    # Reference: kv_b_proj re-expands all C + 1 latents of every sequence, then dense sdpa.
    ref = proj + index + B * (C + 1) * (2 * r * H * (nope + v) + 2 * H * (nope + rope + v) + 2 * HI)
    assert close(v32_ref.layer_cost("attention", B, C, "decode").cube_flops, ref)
    # Fused read: the indexer's keys for the whole context, latents only for the top-k.
    unread = B * (C - min(C, K)) * (r + rope) * 2
    assert v32_ref.layer_cost("attention", B, C, "decode").hbm_bytes_fused - got.hbm_bytes_fused == unread


# ---- dense models: unchanged, except MLA decode ------------------------------------------------
SMALL_LLAMA = dict(num_hidden_layers=2, hidden_size=512, intermediate_size=1024, num_attention_heads=8,
                   num_key_value_heads=4, vocab_size=1000)
SHAPES = [dict(tokens=256), dict(tokens=128, context=64), dict(tokens=32, context=512, phase="decode"),
          dict(tokens=256, phase="train_fwd", seq_len=128), dict(tokens=256, phase="train_bwd", seq_len=128)]


def test_dense_model_unchanged():
    """Dense attention is measured as the model runs it in both modes; only with a KV cache
    (decode, chunked prefill) production leaves out transformers' concatenating append (a paged
    cache writes the new tokens alone): fewer attention bytes, nothing else differs."""
    cfg = load_model_config("llama", SMALL_LLAMA)
    prod, ref = ModelCosts(cfg), ModelCosts(cfg, attention="reference")
    for s in SHAPES:
        _same_but_the_cache_append(prod, ref, s)
        assert prod.attention_cores(**s) == {}


def _same_but_the_cache_append(prod: ModelCosts, ref: ModelCosts, shape: dict) -> None:
    """Equal costs, except that with a KV cache production's attention moves fewer bytes (no
    concatenating append)."""
    p, r = prod.costs_for_shape(**shape), ref.costs_for_shape(**shape)
    if not shape.get("context"):
        assert p == r
        return
    for t in p:
        assert dataclasses.replace(p[t], hbm_bytes=0, parts=()) == dataclasses.replace(r[t], hbm_bytes=0, parts=())
        assert p[t].hbm_bytes < r[t].hbm_bytes if t == "attention" else p[t] == r[t]


SMALL_V3 = dict(num_hidden_layers=1, hidden_size=1024, num_attention_heads=16, num_key_value_heads=16, q_lora_rank=256, kv_lora_rank=128,
                qk_rope_head_dim=32, qk_nope_head_dim=64, v_head_dim=64, intermediate_size=512, vocab_size=1000)


def test_mla_dense_prefill_unchanged_decode_absorbed():
    cfg = load_model_config("deepseek_v3", SMALL_V3)
    prod, ref = ModelCosts(cfg), ModelCosts(cfg, attention="reference")
    for s in SHAPES[:2] + SHAPES[3:]:
        _same_but_the_cache_append(prod, ref, s)
    B, C, H, r, rope, nope, v = 16, 4096, 16, 128, 32, 64, 64
    core = prod.attention_cores(B, C, "decode")["attention"]
    assert core.form == "mla_absorbed"
    assert core.cube_flops == B * (2 * H * r * (nope + v) + H * (2 * (r + rope) + 2 * r) * (C + 1))
    gap = ref.layer_cost("attention", B, C, "decode").cube_flops - prod.layer_cost("attention", B, C, "decode").cube_flops
    reexpand = B * (C + 1) * 2 * r * H * (nope + v)  # what the reference's kv_b_proj spends
    assert gap > 0.9 * reexpand


# ---- any sliding_window config -------------------------------------------------------------------
def test_sliding_window_model():
    cfg = load_model_config("mistral", {**SMALL_LLAMA, "sliding_window": 64})
    prod, ref = ModelCosts(cfg), ModelCosts(cfg, attention="reference")
    S, W, H, d = 1024, 64, 8, 64
    core = prod.attention_cores(S)["attention"]
    assert core.visited_keys == sum(min(W, n) for n in range(1, S + 1))
    assert core.cube_flops == 2 * H * 2 * d * core.visited_keys
    proj = 2 * _attn_params(512, 8, 4) * S
    assert close(prod.layer_cost("attention", S).cube_flops, proj + 2 * H * 2 * d * (S * W - W * W / 2))
    assert close(ref.layer_cost("attention", S).cube_flops, proj + 2 * H * 2 * d * S * S)


def _attn_params(h: int, heads: int, kv: int) -> int:
    d = h // heads
    return h * heads * d * 2 + h * kv * d * 2


# ---- the knob ----------------------------------------------------------------------------------
def test_attention_knob(v4_cfg):
    with pytest.raises(CostInputError, match="attention"):
        ModelCosts(v4_cfg, attention="fast")
    with pytest.raises(ModelConfigError, match="modelcost_attention"):
        load_model_config("llama", {**SMALL_LLAMA, "modelcost_attention": "dense"})
    cfg = load_model_config("mistral", {**SMALL_LLAMA, "sliding_window": 64, "modelcost_attention": "reference"})
    assert ModelCosts(cfg).attention == "reference"
    assert ModelCosts(cfg, attention="production").attention == "production"
    node = config_from_node({"model_type": "mistral", "overrides": {**SMALL_LLAMA, "sliding_window": 64},
                             "attention": "reference"})
    assert ModelCosts(node).attention == "reference"
    assert ModelCosts(load_model_config("mistral", SMALL_LLAMA)).attention == "production"


def test_measurement_is_repeatable(v4):
    """A second backward on the same shard prices the same (gradients are dropped in between)."""
    first = v4.costs_for_shape(256, phase="train_bwd")
    v4._memo.clear()
    assert v4.costs_for_shape(256, phase="train_bwd") == first
    assert isinstance(first[CSA], LayerCost)
