"""Kernel kinds from the model-cost measurement, and the interference experiment's mechanics."""

from __future__ import annotations

import copy
from dataclasses import fields

import pytest
from helpers import make_library

from stratacl.config import DataPath, ExpansionMode, Mover
from stratacl.engine.replay import simulate
from stratacl.machine.fabric import Fabric
from stratacl.trace import Trace
from workloads.common.kernels import (
    INFERENCE_FUSED,
    TRAINING_FUSED,
    add_kernels,
    split,
    stream_limits,
)
from workloads.common.model_schema import ModelRef, QuantPreset
from workloads.interference.schema import InterferenceConfig
from workloads.interference.workload import LayerWork, _figures, build_trace
from workloads.llm_train.blocks import Cost, ModelPlan, SubBlock, Unit
from workloads.llm_train.layout import Layout
from workloads.llm_train.schema import TrainStepConfig


def test_kernel_rule() -> None:
    # fused attention: one mixed kernel carrying both FLOP kinds and the fused bytes
    (k,) = split("attention", 4e12, 1e10, 6e8, 9e8, TRAINING_FUSED)
    assert (k.kind, k.cube_flops, k.vector_flops, k.hbm_bytes) == ("mixed", 4e12, 1e10, 6e8)
    assert split("attention_sparse", 1.0, 1.0, 0.0, fused=TRAINING_FUSED)[0].kind == "mixed"
    # training MoE is unfused: grouped matmul on the cube, SwiGLU on the vector cores with the
    # intermediates the fused count leaves out
    cube, vec = split("moe", 3e12, 2e9, 5e8, 8e8, TRAINING_FUSED)
    assert (cube.kind, vec.kind, vec.hbm_bytes, vec.suffix) == ("cube", "vector", pytest.approx(3e8), ".vec")
    assert split("moe", 3e12, 2e9, 5e8, 8e8, INFERENCE_FUSED)[0].kind == "mixed"
    assert split("shared_experts", 3e12, 2e9, 5e8, fused=INFERENCE_FUSED)[1].kind == "vector"
    assert [k.kind for k in split("router", 0.0, 1e6, 1e5)] == ["vector"]
    assert [k.kind for k in split("lm_head", 1e12, 0.0, 1e9)] == ["cube"]
    assert split("embedding", 0.0, 0.0, 0.0) == []


def test_add_kernels_and_layouts(cm384) -> None:  # noqa: ANN001
    tr = Trace(world_size=2)
    ids = add_kernels(tr, [0, 1], split("dense_mlp", 2e12, 1e9, 1e8), name="mlp", stream="s")
    assert [tr.ops[i].core for i in ids] == ["cube", "vector"] and tr.ops[ids[1]].deps == (ids[0],)
    m = add_kernels(tr, [0, 1], split("attention", 2e12, 1e9, 1e8), name="attn", stream="s", scale=2.0)
    assert tr.ops[m[0]].vector_flops == (2e9,)
    assert stream_limits("cloudmatrix_tbo", ("x", "y")) == {"x": (16, 32), "y": (8, 16)}
    assert stream_limits("none", ("x", "y")) == {}
    tr.validate()


def _work() -> LayerWork:
    """A layer with a fused attention (cube-bound, 10 ms) and unfused dense MLP on 8 dies."""
    attn = SubBlock("attention", Cost(3.76e12, 1e10, 1e8), Cost(7.52e12, 2e10, 2e8))
    mlp = SubBlock("dense_mlp", Cost(3.76e12, 1e9, 1e8), Cost(7.52e12, 2e9, 2e8))
    unit = Unit("layer0", (attn, mlp), params=2_000_000_000)
    plan = ModelPlan((unit,), hidden=4096, tokens=4096)
    return LayerWork(unit, plan, Layout(dies=8, fsdp=8, tp=1, ep=1))


def test_held_vector_cores_slow_the_mixed_kernel_not_the_matmul(cm384) -> None:  # noqa: ANN001
    cfg = InterferenceConfig(dies=8, fsdp=8, tp=1, ep=1)
    work = _work()
    tr_c, tag_c = build_trace(cfg, work, compute=True, comm=False)
    tr_b, tag_b = build_trace(cfg, work, compute=True, comm=True)
    tr_x, _ = build_trace(cfg, work, compute=False, comm=True)
    kinds = [op.core for op in tr_c.ops]
    assert kinds == ["mixed", "cube", "vector", "cube", "vector", "mixed"]  # fwd, then bwd reversed
    # the preset's own algorithm (HCCL's A3 selection): the mechanics under test are the core holds,
    # so the HBM-latency stall is off (it is tested in test_interference_mechanism.py)
    cfg = copy.deepcopy(cm384.cfg)
    cfg.die.kernel.comm_hbm_stall = 0.0
    fab = Fabric(cfg)
    aiv = make_library(fab, "hccl", data_path=DataPath.pool, expansion_mode=ExpansionMode.aiv)
    ai_cpu = make_library(fab, "hccl", data_path=DataPath.pool)
    out = {}
    for name, lib in (("aiv", aiv), ("ai_cpu", ai_cpu)):
        c, x, b = simulate(tr_c, lib), simulate(tr_x, lib), simulate(tr_b, lib, check=True)
        out[name] = (_figures(c, x, b, tag_c, tag_b, 8), b, c)
    m_aiv, b_aiv, c_aiv = out["aiv"]
    m_cpu, _, _ = out["ai_cpu"]
    # the forward all-gather (op 0) holds 24 of a die's 48 AIVs (core_s / 24 = its hold time, ending
    # with the operator); the first (mixed) kernel keeps half its core groups while the hold overlaps
    # it, so its time = time alone + overlap / 2 (closed form)
    hold_s = b_aiv.core_s[0] / 24
    assert 0.5 * (b_aiv.end[0] - b_aiv.start[0]) < hold_s <= (b_aiv.end[0] - b_aiv.start[0]) * (1 + 1e-9)
    k_alone = c_aiv.end[0] - c_aiv.start[0]
    ov = min(b_aiv.end[1], b_aiv.end[0]) - max(b_aiv.start[1], b_aiv.end[0] - hold_s)
    assert b_aiv.end[1] - b_aiv.start[1] == pytest.approx(k_alone + ov / 2, rel=1e-3)
    # the backward's first kernel is cube-only: overlapped by both held collectives (ops 4, 5), it
    # keeps its time alone
    cube = [i for i, op in enumerate(tr_b.ops) if op.core == "cube" and op.kind == "compute"]
    j = next(i for i in cube if b_aiv.start[i] >= b_aiv.start[4] and b_aiv.start[i] < b_aiv.end[4])
    ja = next(i for i, op in enumerate(tr_c.ops) if op.name == tr_b.ops[j].name)
    assert b_aiv.end[j] - b_aiv.start[j] == pytest.approx(c_aiv.end[ja] - c_aiv.start[ja], rel=1e-9)
    assert m_aiv["compute_slowdown"] > 0.05
    # AI_CPU moves with SDMA: compute-bound kernels keep their cores (HBM far from saturated)
    assert abs(m_cpu["compute_slowdown"]) < 1e-9
    assert m_cpu["step_vs_back_to_back"] < 1.0  # overlap hides the collectives


def test_interference_layer_index_is_checked(monkeypatch) -> None:  # noqa: ANN001
    from stratacl.errors import ConfigError
    from workloads.interference import workload as interference

    work = _work()
    monkeypatch.setattr(interference, "build_plan", lambda *_a, **_k: work.plan)  # no model measurement
    with pytest.raises(ConfigError, match="workload.layer"):
        interference.layer_work(InterferenceConfig(layer=7))
    assert interference.layer_work(InterferenceConfig(layer=-1)).unit is work.unit


def test_stream_layout_limits_reach_the_trace(cm384) -> None:  # noqa: ANN001
    cfg = InterferenceConfig(dies=8, fsdp=8, tp=1, ep=1, stream_layout="cloudmatrix_tbo")
    tr, _ = build_trace(cfg, _work(), compute=True, comm=True)
    assert tr.stream_cores == {"main": (16, 32), "fsdp_ag": (8, 16)}
    lib = make_library(cm384, "hccl", data_path=DataPath.pool, mover=Mover.vector_cores)
    res = simulate(tr, lib, check=True)
    assert res.max_violation < 1e-9


def test_interference_plans_with_every_llm_train_model_field() -> None:
    """The layer is planned from the interference config itself (llm_train's TrainStepConfig):
    a quant preset reaches the layer's matmul formats (it was silently dropped before)."""
    assert {f.name for f in fields(TrainStepConfig)} <= {f.name for f in fields(InterferenceConfig)}
    from workloads.interference import workload as interference

    small = dict(dies=8, fsdp=8, tp=1, ep=1, global_batch=8, seq_len=128, num_layers=1)
    model = dict(preset="deepseek_v3", overrides={"first_k_dense_replace": 1})
    plain = interference.layer_work(InterferenceConfig(**small, model=ModelRef(**model))).unit
    w8 = interference.layer_work(InterferenceConfig(**small, model=ModelRef(**model, quant=QuantPreset.w8a8))).unit
    assert {s.dtype for s in plain.subs} == {"bf16"}
    assert {s.dtype for s in w8.subs} == {"int8"}


def test_kind_notes_split_the_concurrent_slowdown_by_kernel_kind() -> None:
    """The parts printed for a library are its concurrent slowdown shared out by each kind's added
    seconds: they sum to the slowdown, a kind that lost nothing is not named, a faster kernel
    subtracts."""
    import re

    import pandas as pd

    from workloads.interference.workload import kind_notes

    k = pd.DataFrame({"library": ["a"] * 3, "kernel": ["x", "y", "z"], "kind": ["cube", "vector", "cube"],
                      "alone_s": [1.0, 1.0, 2.0], "overlapped_s": [1.3, 1.1, 2.0]})
    (line,) = kind_notes(k, {"a": {"concurrent_compute_slowdown": 0.2}})
    shares = [float(v) for v in re.findall(r"kernels (\d+\.\d)%", line)]
    assert "cube kernels 15.0%" in line and "vector kernels 5.0%" in line and "mixed" not in line
    assert sum(shares) == pytest.approx(20.0)
    assert kind_notes(k.assign(overlapped_s=k["alone_s"]), {"a": {"concurrent_compute_slowdown": 0.0}}) == []


def test_concurrent_slowdown_splits_into_stall_and_sharing() -> None:
    """The sharing part is the run's own counterfactual without the HBM latency stall: it equals
    the concurrent slowdown of the same run with fabric.die.kernel.comm_hbm_stall=0, and the two
    parts add up to the slowdown."""
    from stratacl.validate.operators import run_in_process

    over = ("fabric=cloudmatrix384", "+experiment=interference", "library=[hccl,stratacl_no_sdma]", "baseline=hccl")
    got = run_in_process("interference", over).metrics
    off = run_in_process("interference", (*over, "fabric.die.kernel.comm_hbm_stall=0")).metrics
    for lib, m in got.items():
        assert m["concurrent_slowdown_hbm_stall"] + m["concurrent_slowdown_sharing"] == pytest.approx(
            m["concurrent_compute_slowdown"])
        assert m["concurrent_slowdown_sharing"] == pytest.approx(off[lib]["concurrent_compute_slowdown"], abs=1e-12)
        assert m["concurrent_slowdown_hbm_stall"] > 0.1  # the stall is what slows this layer (REFERENCE §3 rows)
        assert off[lib]["concurrent_slowdown_hbm_stall"] == pytest.approx(0.0, abs=1e-12)
