"""Workloads state what each kernel does (issue 21): the model-cost counter records the matmul shapes
of each layer type, the attention core's QKᵀ/PV shapes follow its closed form, every compute op a
workload emits carries a kernel class, and the unfused passes carry their measured bytes."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import compose_run
from test_kernel_wiring import _infer, _train

from stratacl.vocab import KernelClass
from workloads.common import kernels
from workloads.common.cost import Cost, Part, gemm_flops
from workloads.common.kernels import emit_gemms, split_parts
from workloads.modelcost import ModelCosts, load_model_yaml
from workloads.modelcost.attention import AttnCall, AttnStructure, core_cost, token_sums

CLASSES = {k.value for k in KernelClass}


@pytest.fixture(scope="module")
def llama() -> ModelCosts:
    return ModelCosts(load_model_yaml("llama3_8b"))


@pytest.mark.parametrize("phase,kw", [("prefill", {"tokens": 512}), ("decode", {"tokens": 8, "context": 256}),
                                      ("train_fwd", {"tokens": 512, "seq_len": 256}),
                                      ("train_bwd", {"tokens": 512, "seq_len": 256})])
def test_dense_layers_gemms_reproduce_their_cube_flops(llama: ModelCosts, phase: str, kw: dict) -> None:
    costs = llama.costs_for_shape(phase=phase, **kw)
    for t in ("attention", "dense_mlp", "lm_head"):
        c = costs[t]
        assert c.cube_flops > 0
        assert gemm_flops(c.gemms()) == c.cube_flops, t  # exact: integer shapes of every matmul
        for k, cube, _, _, gemms in c.parts:
            assert gemm_flops(gemms) == cube, (t, k)
    # the MLP's three projections at this shape: tokens x hidden -> intermediate (gate, up), back (down)
    if phase == "prefill":
        h, f = llama.cfg.hidden_size, llama.cfg.intermediate_size
        mlp = dict(((m, n, k), cnt) for m, n, k, cnt in costs["dense_mlp"].gemms())
        assert mlp[(512, f, h)] == 2 and mlp[(512, h, f)] == 1


def test_moe_grouped_gemm_rows_split_over_the_experts() -> None:
    mc = ModelCosts(load_model_yaml("deepseek_v3"))
    c = mc.costs_for_shape(64, phase="prefill", ep=32)["moe"]
    (grouped,) = [p for p in c.parts if p[0] == "grouped_gemm"]
    assert gemm_flops(grouped[4]) == grouped[1]
    e_local = mc.moe_info()["n_routed_experts"] // 32
    rows = mc.routing.rows_on_rank(64, mc.moe_info()["top_k"], mc.moe_info()["n_routed_experts"], 32)
    gate_up = [g for g in grouped[4] if g[2] == mc.cfg.hidden_size]
    assert sum(m * cnt for m, _, _, cnt in gate_up) == rows and sum(cnt for *_, cnt in gate_up) == e_local


def test_attention_core_shapes_follow_the_closed_form() -> None:
    """GQA (8 query heads, 2 KV heads: groups of 4 stacked into rows) with q_len 4 after 60 cached
    tokens (causal: keys 61..64 per query): QKᵀ and PV of (rows·4, kv, d, B·2) with Σ rows·kv = the
    visited keys; decode (q_len 1) is exactly (4, kv_len, head_dim, B·2) and (4, head_dim, kv_len, B·2)."""
    s = AttnStructure(None, 0, None)
    call = AttnCall(heads=8, kv_heads=2, d_qk=64, d_v=64, window=None, shared_kv=False)
    dec = core_cost(s, call, "decode", n_seq=3, q_len=1, context=100, dtype_bytes=2)
    assert set(dec.gemms) == {(4, 101, 64, 6), (4, 64, 101, 6)}
    pre = core_cost(s, call, "prefill", n_seq=2, q_len=4, context=60, dtype_bytes=2)
    visited = token_sums(s, None, 60, 4).visited
    assert visited == 61 + 62 + 63 + 64
    qk = [g for g in pre.gemms if g[2] == 64 and g[1] != 64]
    assert sum(m * n for m, n, _, _ in qk) == 4 * visited and all(c == 4 for *_, c in pre.gemms)
    assert gemm_flops(pre.gemms) == pre.cube_flops and gemm_flops(dec.gemms) == dec.cube_flops
    # windowed keys: 3 queries with at most 5 keys each
    win = core_cost(s, AttnCall(8, 2, 64, 64, 5, False), "prefill", n_seq=1, q_len=3, context=10, dtype_bytes=2)
    assert set(win.gemms) == {(12, 5, 64, 2), (12, 64, 5, 2)}


def _check_classes(tr) -> None:  # noqa: ANN001
    for op in tr.ops:
        if op.kind == "compute" and (max(op.flops) > 0 or max(op.hbm_bytes) > 0):
            assert op.kernel in CLASSES, op.name
            if op.kernel in ("elementwise", "routing"):
                assert op.core == "vector" and not op.gemms, op.name
            if op.gemms:
                # the shapes do the op's cube work (per-rank FLOPs of a uniform op; ± whole rows)
                assert gemm_flops(op.gemms) == pytest.approx(float(np.mean(op.flops)), rel=0.02), op.name


def test_every_compute_op_of_every_workload_has_a_kernel_class() -> None:
    _, _, it = _infer()
    for phase, size, ctx in (("decode", 128, 1024), ("prefill", 1024, 0)):
        tr = it.trace(phase, size, ctx)
        _check_classes(tr)
        kinds = {op.kernel for op in tr.ops if op.kind == "compute"}
        assert {"gemm", "grouped_gemm", "elementwise", "routing"} <= kinds
        assert ("attention_decode" if phase == "decode" else "attention_prefill") in kinds
    _, tr = _train()
    _check_classes(tr)
    assert {"gemm", "grouped_gemm", "attention_prefill", "elementwise", "routing"} <= {op.kernel for op in tr.ops}
    from workloads.dlrm_train.workload import run as _  # noqa: F401  (import check)
    from workloads.interference.workload import build_trace, layer_work
    cfg = compose_run(["workload=interference"]).workload
    tr_i, _tags = build_trace(cfg, layer_work(cfg), compute=True, comm=False)
    _check_classes(tr_i)


def test_dlrm_kernels_embedding_bags_route_mlps_gemm() -> None:
    from workloads.dlrm_train.model import dense_costs
    d = dense_costs(13, 26, 128, (512, 256, 128), (1024, 1024, 512, 256, 1), 512, 2)
    for c in (d.bottom_fwd, d.top_fwd, d.top_bwd, d.bottom_bwd):
        ks = split_parts("bottom_mlp_fwd", c.parts, kernels.DLRM_FUSED)
        assert {k.kernel for k in ks} <= {"gemm", "elementwise"} and ks[0].kernel == "gemm"
        assert sum(k.hbm_bytes for k in ks) == pytest.approx(c.hbm_bytes)  # the measured bytes, all kept
        assert gemm_flops(ks[0].gemms) == c.cube_flops
    assert kernels.split("embedding_fwd", 0, 1.0, 5.0)[0].kernel == "routing"
    assert kernels.split("dense_optimizer_step", 0, 1.0, 5.0)[0].kernel == "elementwise"


def test_passes_carry_their_measured_chain_bytes(llama: ModelCosts) -> None:
    """Each element-wise / routing kernel is charged the bytes it reads and writes when each chain
    of its ops runs as one kernel (the counter's chain_bytes, at most the unfused b_u of the
    class); the fused traffic stays on the matmul and attention kernels."""
    from workloads.modelcost.counter import class_parts
    from workloads.modelcost.measure import make_shape
    for mc, t, phase, kw in ((llama, "dense_mlp", "prefill", {}), (llama, "attention", "decode", {"context": 128}),
                             (ModelCosts(load_model_yaml("deepseek_v3")), "moe", "prefill", {})):
        m = mc._measure(make_shape(phase, 64, kw.get("context", 0), None), 1, 1)
        kind = "attention_" + ("decode" if phase == "decode" else "prefill")
        chains, unfused = class_parts(m.totals[t], kind, chains=True), class_parts(m.totals[t], kind)
        lc = mc.costs_for_shape(64, phase=phase, **kw)[t]
        got = {p[0]: p[3] for p in lc.parts}
        for k in ("elementwise", "routing"):
            if k in chains:
                assert got[k] == pytest.approx(chains[k].hbm_bytes, abs=1), (t, k)
                assert 0 < chains[k].hbm_bytes <= unfused[k].hbm_bytes, (t, k)
        att = sum(v for k, v in got.items() if k.startswith("attention"))
        matmul = got.get("gemm", 0) + got.get("grouped_gemm", 0)
        # fused traffic conserved: matmul kernels + the KV on the attention kernel = hbm_bytes_fused
        assert matmul + min(att, lc.hbm_bytes_fused - matmul) == pytest.approx(lc.hbm_bytes_fused, abs=2)
        assert lc.cost.hbm_bytes == pytest.approx(sum(got.values()))


def test_chain_bytes_of_a_swiglu_closed_form() -> None:
    """down(silu(gate(x)) * up(x)): the element-wise chain reads the two GEMM outputs and writes
    the product the down projection reads: 3 T×F tensors (unfused: silu in/out + mul 2 in/1 out = 5)."""
    import torch
    from torch import nn
    from torch._subclasses.fake_tensor import FakeTensorMode

    from workloads.modelcost.counter import OpCounter
    T, H, F = 16, 8, 32
    with FakeTensorMode():
        gate, up, down = nn.Linear(H, F, bias=False), nn.Linear(H, F, bias=False), nn.Linear(F, H, bias=False)
        x = torch.empty(T, H)
        c = OpCounter()
        with c:
            c.tag = "mlp"
            down(torch.nn.functional.silu(gate(x)) * up(x))
            c.tag = None
    ew = c.totals["mlp"].by_class["elementwise"]
    assert ew.chain_bytes == 3 * T * F * 4 and ew.hbm_bytes == 5 * T * F * 4


def test_class_mapping_is_stated(monkeypatch) -> None:  # noqa: ANN001
    """Mutation probe: swapping a class's core kind or the routed experts' class is caught."""
    parts = (Part("gemm", 10.0, 0.0, 1.0, ((1.0, 5, 1, 1),)), Part("grouped_gemm", 20.0, 0.0, 1.0),
             Part("attention_decode", 4.0, 2.0, 3.0), Part("elementwise", 0.0, 5.0, 2.0), Part("routing", 0.0, 1.0, 1.0))
    ks = {k.kernel: k for k in split_parts("moe", parts, kernels.TRAINING_FUSED)}
    assert {k: v.kind for k, v in ks.items()} == {"gemm": "cube", "grouped_gemm": "cube", "attention_decode": "mixed",
                                                 "elementwise": "vector", "routing": "vector"}
    assert ks["grouped_gemm"].main and ks["grouped_gemm"].suffix == ""
    # serving's fused MoE: SwiGLU / quant inside the grouped GEMM (mixed), routing stays its own pass
    fused = {k.kernel: k for k in split_parts("moe", parts, kernels.INFERENCE_FUSED)}
    assert "elementwise" not in fused and fused["grouped_gemm"].kind == "mixed"
    assert sum(k.hbm_bytes for k in fused.values()) == pytest.approx(8.0)
    assert kernels.default_class("moe", "cube") == "grouped_gemm" and kernels.default_class("dense_mlp", "cube") == "gemm"
    assert kernels.default_class("embedding", "vector") == "routing"
    monkeypatch.setitem(kernels.CLASS_CORE, "routing", "cube")
    ks = {k.kernel: k for k in split_parts("moe", parts, kernels.TRAINING_FUSED)}
    assert ks["routing"].kind != "vector"  # the probe reaches the kernels (the assertion above would fail)


def test_gemm_shapes_scale_with_routed_rows() -> None:
    c = Cost(2.0 * 100 * 8 * 4, 0.0, 0.0, (Part("grouped_gemm", 2.0 * 100 * 8 * 4, 0, 0, ((25.0, 8, 4, 4),)),))
    half = c.scale(0.5)
    assert emit_gemms(half.parts[0].gemms) == ((12, 8, 4, 2), (13, 8, 4, 2))  # 50 rows over 4 groups
    assert emit_gemms(c.parts[0].gemms, 3.0) == ((75, 8, 4, 4),)
    both = c + c
    assert gemm_flops(both.parts[0].gemms) == pytest.approx(2 * c.cube_flops)
    assert (both - c).parts[0].gemms == c.parts[0].gemms
    # a weight gradient contracts over the rows: they scale k, not m
    wgrad = Part("grouped_gemm", 2.0 * 7 * 8 * 100 * 4, 0, 0, ((7, 8, 100.0, 4, 1),))
    assert emit_gemms(wgrad.scale(0.5).gemms) == ((7, 8, 50, 4),)
    assert emit_gemms(wgrad.gemms, 0.25) == ((7, 8, 25, 4),)
    lerp = c.lerp(c.scale(3.0), 0.25)
    assert gemm_flops(lerp.parts[0].gemms) == pytest.approx(lerp.cube_flops)


def test_model_costs_cache_key_names_the_parts_version(tmp_path) -> None:  # noqa: ANN001
    from workloads.modelcost import costs as mc_costs
    assert mc_costs.CACHE_VERSION == "modelcost-11"
    a = ModelCosts(load_model_yaml("llama3_8b"), cache_dir=str(tmp_path))
    first = a.costs_for_shape(64, phase="prefill")
    b = ModelCosts(load_model_yaml("llama3_8b"), cache_dir=str(tmp_path))
    again = b.costs_for_shape(64, phase="prefill")  # read from disk: parts come back as tuples
    assert again == first and again["dense_mlp"].parts and isinstance(again["dense_mlp"].parts[0][4], tuple)


def test_per_token_small_matmuls_are_vector_work_a_short_k_gemm_stays_cube() -> None:
    """mHC-style mixing, T matmuls of [4×4]·[4×N] (one per token), is T·2·4·4·N vector FLOPs and no
    GEMM; one [1024×13]·[13×512] matmul (DLRM's dense input) stays a GEMM with its cube FLOPs."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from workloads.modelcost.counter import OpCounter
    T, N = 64, 256
    with FakeTensorMode():
        c = OpCounter()
        with c:
            c.tag = "mix"
            torch.bmm(torch.empty(T, 4, 4), torch.empty(T, 4, N))
            c.tag = "dense"
            torch.empty(1024, 13) @ torch.empty(13, 512)
            c.tag = None
    mix, dense = c.totals["mix"], c.totals["dense"]
    assert mix.cube_flops == 0 and mix.vector_flops == T * 2 * 4 * 4 * N
    assert not mix.by_class["gemm"].gemms and mix.by_class["elementwise"].vector_flops == T * 2 * 4 * 4 * N
    assert dense.cube_flops == 2 * 1024 * 13 * 512 and dict(dense.by_class["gemm"].gemms) == {(1024, 512, 13): 1}


def test_shapes_between_two_measured_ends_interpolate_the_dimension_that_grows() -> None:
    """Between a 256-token end (256 per-token matmuls of 4 rows, one 256-row GEMM) and a 1024-token
    end, the 640-token shape runs 640 per-token matmuls of 4 rows and one 640-row GEMM, not 256
    matmuls of 10 rows (the nearer end's count with its rows stretched)."""
    from workloads.common.cost import Cost, Part

    def end(t: int) -> Cost:
        g = ((4, 4096, 4, t), (t, 4096, 7168, 1))
        f = sum(2 * m * n * k * c for m, n, k, c in g)
        return Cost(f, 0.0, 0.0, (Part("gemm", f, 0.0, 0.0, g),))

    mid = end(256).lerp(end(1024), (640 - 256) / 768)
    got = sorted(mid.parts[0].gemms, key=lambda g: g[1:])
    assert [tuple(round(x) for x in g) for g in got] == [(4, 4096, 4, 640), (640, 4096, 7168, 1)]
    assert mid.cube_flops == pytest.approx(2 * 4096 * (4 * 4 * 640 + 640 * 7168))


def test_production_decode_passes_do_not_reread_the_kv_cache() -> None:
    """A serving stack writes only the new tokens into its paged KV cache: a decode step's
    element-wise passes are the same at 256 and 4096 cached tokens (the attention core reads the
    cache, priced apart). The reference mode keeps transformers' concatenating cache, whose append
    rereads and rewrites the whole cache, so its passes grow by ≥ 2 × the extra cache bytes."""
    cfg = load_model_yaml("llama3_8b")
    cfg.num_hidden_layers = 1
    ew = {}
    for mode in ("production", "reference"):
        mc = ModelCosts(cfg, attention=mode)
        for ctx in (256, 4096):
            ew[mode, ctx] = next(p[3] for p in mc.costs_for_shape(8, ctx, "decode")["attention"].parts
                                 if p[0] == "elementwise")  # (kernel, cube, vector, bytes, gemms)
    assert ew["production", 4096] == pytest.approx(ew["production", 256], rel=1e-6)
    kv_per_token = 2 * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 2  # K+V, bf16
    assert ew["reference", 4096] - ew["reference", 256] >= 2 * 8 * (4096 - 256) * kv_per_token


def test_totals_add_field_by_field() -> None:
    """Summing two tags' totals: every number adds, per-key counts add, shapes stay known only if
    both sides knew them, and the per-class totals add the same way."""
    from workloads.modelcost.counter import ClassTotals, OpTotals

    a, b = OpTotals(cube_flops=3, hbm_bytes=5, ops=1, attention_io=7), OpTotals(cube_flops=4, vector_flops=2, ops=2)
    a.by_op["mm"] += 1
    b.by_op["mm"] += 2
    b.by_op["add"] += 1
    a.by_class["gemm"] = ClassTotals(cube_flops=3, gemms={(8, 8, 8): 1})
    b.by_class["gemm"] = ClassTotals(cube_flops=4, chain_bytes=9, gemms={(8, 8, 8): 2, (4, 4, 4): 1}, shapes_known=False)
    a.add(b)
    assert (a.cube_flops, a.vector_flops, a.hbm_bytes, a.ops, a.attention_io) == (7, 2, 5, 3, 7)
    assert dict(a.by_op) == {"mm": 3, "add": 1}
    g = a.by_class["gemm"]
    assert (g.cube_flops, g.chain_bytes, dict(g.gemms), g.shapes_known) == (7, 9, {(8, 8, 8): 3, (4, 4, 4): 1}, False)
