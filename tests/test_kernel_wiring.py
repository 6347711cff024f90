"""The end-to-end workloads emit their compute by the kernel rule (workloads/common/kernels.py):
kinds and core limits reach the traces, held vector cores slow their mixed kernels and not their
matmuls, the wiring conserves every FLOP and byte the workloads measure, and llm_train's matmuls
run in the quant preset's format."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import compose_run, make_library
from test_llm_infer import OVERRIDES as INFER

from stratacl.config import Algorithm, DataPath, ExpansionMode
from stratacl.engine.replay import simulate
from stratacl.machine.compute import lower_compute
from stratacl.machine.fabric import Fabric, R
from stratacl.machine.kernel_model import kernel_model
from stratacl.trace import Trace
from stratacl.workload_api import RunContext
from workloads.common import kernels
from workloads.common.model import model_costs
from workloads.llm_infer import iteration as infer_iteration
from workloads.llm_infer.costs import CORE, ServingCosts
from workloads.llm_infer.iteration import IterationModel
from workloads.llm_train import schedule as train_schedule
from workloads.llm_train.blocks import Cost, ModelPlan, SubBlock, Unit
from workloads.llm_train.checkpointing import AcMode
from workloads.llm_train.layout import Layout
from workloads.llm_train.schedule import Knobs, build_iteration
from workloads.llm_train.workload import iteration_trace, prepare

TRAIN = ["workload=llm_train", "workload.num_layers=4", "workload.dies=16", "workload.fsdp=4",
         "workload.tp=4", "workload.ep=8", "workload.global_batch=4", "workload.seq_len=512",
         "workload.iterations=[0]"]


class Recorder:
    """Wraps `add_cost` in a workload module: what each call was asked to put in, and its ops."""

    def __init__(self) -> None:
        self.real = kernels.add_cost
        self.calls: list[tuple] = []

    def __call__(self, tr: Trace, ranks, layer_type: str, cost, **kw):  # noqa: ANN001, ANN003, ANN204
        ids = self.real(tr, ranks, layer_type, cost, **kw)
        self.calls.append((tuple(ranks), cost, kw.get("scale"), kw.get("hbm_extra", 0.0), ids))
        return ids

    def expected(self, world: int) -> dict[str, np.ndarray]:
        """Per-rank totals as the cost triples say (what a cube op + vector op emission put in)."""
        out = {k: np.zeros(world) for k in ("cube", "vector", "hbm")}
        for ranks, c, scale, extra, _ in self.calls:
            k = np.ones(len(ranks)) * (1.0 if scale is None else np.asarray(scale, dtype=float))
            idx = list(ranks)
            out["cube"][idx] += c.cube_flops * k
            out["vector"][idx] += c.vector_flops * k
            out["hbm"][idx] += c.hbm_bytes * k + np.broadcast_to(np.asarray(extra, dtype=float), k.shape)
        return out

    def ids(self) -> set[int]:
        return {i for *_, ids in self.calls for i in ids}


def totals(tr: Trace, ids: set[int] | None = None) -> dict[str, np.ndarray]:
    """Per-rank cube FLOPs (cube + mixed kernels), vector FLOPs (vector + mixed) and HBM bytes."""
    out = {k: np.zeros(tr.world_size) for k in ("cube", "vector", "hbm")}
    for op in tr.ops:
        if op.kind != "compute" or (ids is not None and op.id not in ids):
            continue
        idx = list(op.ranks)
        f = op.per_rank(op.flops)
        out["cube" if op.core in ("cube", "mixed") else "vector"][idx] += f
        if op.core == "mixed":
            out["vector"][idx] += op.per_rank(op.vector_flops)
        out["hbm"][idx] += op.per_rank(op.hbm_bytes)
    return out


def assert_conserved(tr: Trace, rec: Recorder) -> None:
    got, want = totals(tr, rec.ids()), rec.expected(tr.world_size)
    for k in got:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-12, atol=1e-6, err_msg=k)
    # one path: every compute op with work came through add_cost
    stray = [op.name for op in tr.ops if op.kind == "compute" and op.id not in rec.ids()
             and (max(op.flops) > 0 or max(op.hbm_bytes) > 0)]
    assert not stray


# ------------------------------------------------------------------ llm_infer


def _infer(*extra: str):  # noqa: ANN202
    cfg = compose_run([*INFER, *extra])
    fab = Fabric(cfg.fabric)
    libs = {n: make_library(fab, n) for n in ("hccl", "stratacl")}
    ctx = RunContext(cfg=cfg, fabric=fab, libraries=libs, baseline="hccl", seed=0)
    costs = ServingCosts(model_costs(cfg.workload.model), 4, 4, 1024)
    return ctx, costs, IterationModel(ctx, costs, cfg.workload)


def test_tbo_decode_has_mixed_kernels_on_the_cloudmatrix_streams() -> None:
    _, costs, it = _infer()
    assert costs.split_core  # W8A8: quantised projections, bf16 attention core
    tr = it.trace("decode", 128, 1024)  # 128 sequences >= tbo_min_tokens: two micro-batches
    assert tr.stream_cores == {"attn_path": (16, 32), "moe_path": (8, 16)}
    by = {op.name: op for op in tr.ops}
    attn, core, moe = by["L1.attn.mb0"], by["L1.attn_core.mb0"], by["L1.moe.mb1"]
    # the int8 projections a dense GEMM, their norms / RoPE / casts an element-wise pass
    assert (attn.core, attn.dtype, attn.stream, attn.kernel) == ("cube", "int8", "attn_path", "gemm")
    assert by["L1.attn.mb0.vec"].kernel == "elementwise" and by["L1.attn.mb0.vec"].core == "vector"
    # the bf16 core: the decode attention kernel, softmax with it, carrying the KV read
    assert (core.core, core.dtype, core.kernel) == ("mixed", "bf16", "attention_decode")
    assert max(core.vector_flops) > 0 and max(core.hbm_bytes) > 0 and core.gemms
    # fused W8A8 grouped matmul (SwiGLU and quantisation inside), its router / permutes a routing pass
    assert (moe.core, moe.dtype, moe.stream, moe.kernel) == ("mixed", "int8", "moe_path", "grouped_gemm")
    # the gate before the dispatch: the router GEMM and the top-k / permute pass
    assert by["L1.gate.mb1.route"].kernel == "routing" and by["L1.gate.mb1"].kernel == "gemm"
    assert by["L1.shared.mb1"].kernel == "gemm"  # no shared-expert replicas: every die runs its own
    assert by["L0.dense_mlp.mb0"].core == "cube" and by["L0.dense_mlp.mb0.vec"].core == "vector"
    assert by["embedding.mb0"].core == "vector" and by["embedding.mb0"].kernel == "routing"
    # the MoE path carries its micro-batch's dispatch, experts and combine in a row
    moe_path = [op.name.split(".")[1] for op in tr.ops if op.stream == "moe_path" and op.name.startswith("L1.")
                and op.name.split(".")[2] == "mb0"]
    assert list(dict.fromkeys(moe_path)) == ["gate", "dispatch", "shared", "moe", "combine"]
    # one micro-batch, prefill, or the layout off: SGLang streams, no split
    assert it.trace("decode", 8, 1024).stream_cores == {}
    assert it.trace("prefill", 1024, 0).stream_cores == {}
    _, _, off = _infer("workload.scheduler.decode_stream_layout=none")
    tr_off = off.trace("decode", 128, 1024)
    assert tr_off.stream_cores == {} and {op.stream for op in tr_off.ops} == {"compute", "comm"}
    # the same kernels either way: the layout moves streams, not work
    for k, v in totals(tr).items():
        np.testing.assert_allclose(v, totals(tr_off)[k], rtol=1e-12)


def test_infer_wiring_conserves_flops_and_bytes(monkeypatch) -> None:  # noqa: ANN001
    _, costs, it = _infer()
    for phase, size, ctx_len in (("decode", 128, 1024), ("decode", 8, 4096), ("prefill", 1024, 0)):
        rec = Recorder()
        monkeypatch.setattr(infer_iteration, "add_cost", rec)
        assert_conserved(it.build(phase, size, ctx_len), rec)
    # splitting off the bf16 attention core keeps the layer's measured work
    mc = costs.mc
    raw = mc.costs_for_shape(64, context=1024, phase="decode", ep=4)
    split = costs._measure(64, 1024, "decode")
    for t in costs.split_core:
        whole = split[t] + split[t + CORE]
        assert (whole.cube_flops, whole.vector_flops) == pytest.approx(
            (raw[t].cube_flops, raw[t].vector_flops), rel=1e-12)


# ------------------------------------------------------------------ llm_train


def _train(*extra: str):  # noqa: ANN202
    cfg = compose_run([*TRAIN, *extra])
    fab = Fabric(cfg.fabric)
    prep = prepare(cfg.workload, fab)
    return fab, iteration_trace(prep, 0, seed=0)[0]


def test_train_wiring_conserves_and_quant_keeps_the_flops(monkeypatch) -> None:  # noqa: ANN001
    rec = Recorder()
    monkeypatch.setattr(train_schedule, "add_cost", rec)
    _, bf16 = _train()
    assert_conserved(bf16, rec)
    kinds = {op.name.split(".", 1)[1]: op.core for op in bf16.ops if op.name.startswith("layer0.")}
    assert kinds["attention.fwd"] == "cube" and kinds["attention.fwd.attn"] == "mixed"  # projections, flash core
    assert kinds["dense_mlp.fwd"] == "cube"
    assert kinds["dense_mlp.fwd.vec"] == "vector"
    rec8 = Recorder()
    monkeypatch.setattr(train_schedule, "add_cost", rec8)
    _, w8 = _train("workload.model.quant=w8a8")
    assert_conserved(w8, rec8)
    # the format changes bytes and peaks, not the work: FLOPs per rank equal bf16's
    a, b = totals(bf16), totals(w8)
    for k in ("cube", "vector"):
        np.testing.assert_allclose(a[k], b[k], rtol=1e-9)
    assert b["hbm"].sum() < a["hbm"].sum()


def test_train_matmul_time_follows_the_format() -> None:
    fab, bf16 = _train()
    _, w8 = _train("workload.model.quant=w8a8")
    assert fab.cube_peak("int8") == pytest.approx(2 * fab.cube_peak("bf16"))  # 910C: INT8 = 2x BF16

    km = kernel_model(fab)

    def cube_time(tr: Trace, name: str) -> tuple[float, float, str]:
        """Cube-load seconds at the kernel's efficiency backed out (attainable fraction of the
        format's peak / shape factor, stratacl/machine/kernel_model.py): what the peak alone implies."""
        op = next(o for o in tr.ops if o.name == name)
        ph = lower_compute(op, fab)[-1]
        fmt = fab.cube_format(op.dtype)
        kt = km.price(op, 1.0, fab.cube_peak(op.dtype), fab.vector_flops, fmt)
        eff = km.fraction(km.klass(op)[1], fmt) / kt.work_factor
        return sum(v for _, r, v in ph.loads if r == R["cube"]) * eff, max(op.flops), op.dtype

    for name in ("layer0.dense_mlp.fwd", "layer3.moe.bwd.experts", "layer0.attention.rfwd"):
        t16, f16, d16 = cube_time(bf16, name)
        t8, f8, d8 = cube_time(w8, name)
        assert d16 == "bf16" and d8 == "int8"
        assert t16 == pytest.approx(f16 / fab.cube_peak("bf16"))  # bf16 unchanged
        assert f8 == pytest.approx(f16)  # attention: the projections only, the core is a kernel of its own
        assert t8 == pytest.approx(f8 / fab.cube_peak("bf16") / 2)  # half the time per FLOP
    # the attention core stays in bf16 at the bf16 peak
    t_core, f_core, d_core = cube_time(w8, "layer0.attention.fwd.core")
    assert d_core == "bf16" and t_core == pytest.approx(f_core / fab.cube_peak("bf16")) and f_core > 0


def test_held_vector_cores_slow_a_workloads_mixed_kernels_not_its_matmuls() -> None:
    """llm_train's schedule with compute-bound layers: the FSDP all-gather of the next unit
    overlaps this unit's kernels. HCCL in AIV mode holds vector cores, in AI_CPU mode none (SDMA):
    the mixed attention kernels slow under AIV, the matmul (cube) kernels keep their duration.
    The HBM stall of compute beside traffic (engine/interference.py) is off: held cores alone."""
    cm384 = Fabric(compose_run(["fabric.die.kernel.comm_hbm_stall=0"]).fabric)
    attn = SubBlock("attention", Cost(3.76e12, 1e10, 1e8), Cost(7.52e12, 2e10, 2e8))
    mlp = SubBlock("dense_mlp", Cost(3.76e12, 1e9, 1e8), Cost(7.52e12, 2e9, 2e8))
    units = tuple(Unit(f"layer{i}", (attn, mlp), params=200_000_000) for i in range(3))
    tr = build_iteration(ModelPlan(units, hidden=4096, tokens=4096), Layout(8, 8, 1, 1), Knobs(ac=AcMode.none))
    aiv = make_library(cm384, "hccl", data_path=DataPath.pool, expansion_mode=ExpansionMode.aiv,
                       algorithm=Algorithm.auto)
    cpu = make_library(cm384, "hccl", data_path=DataPath.pool, algorithm=Algorithm.auto)
    ra, rc = simulate(tr, aiv, check=True), simulate(tr, cpu, check=True)
    comm = [op.id for op in tr.ops if op.kind == "collective"]
    dur_a, dur_c = ra.end - ra.start, rc.end - rc.start
    slowed = cubes_overlapped = 0
    for op in tr.ops:
        if op.kind != "compute" or max(op.flops) == 0:
            continue
        # time a collective runs beside the kernel in the AIV run
        o = sum(max(0.0, min(ra.end[i], ra.end[op.id]) - max(ra.start[i], ra.start[op.id])) for i in comm)
        if op.core == "cube":
            assert dur_a[op.id] == pytest.approx(dur_c[op.id], rel=1e-9), op.name
            cubes_overlapped += o > 0
        elif op.core == "mixed" and o > 0:
            # 24 of the 48 AIVs held: half the complete core groups while overlapped, so the
            # kernel loses o/2 of progress: extra time o/2 (closed form)
            assert dur_a[op.id] - dur_c[op.id] == pytest.approx(o / 2, rel=0.05), op.name
            slowed += 1
    assert slowed >= 1 and cubes_overlapped >= 1


def test_cloudmatrix_split_is_of_a_910c_die() -> None:
    from stratacl.errors import ConfigError
    from workloads.common.kernels import check_layout

    check_layout("cloudmatrix_tbo", 24, 48, "f")
    check_layout("none", 148, 148, "f")
    with pytest.raises(ConfigError, match="910C"):
        check_layout("cloudmatrix_tbo", 148, 148, "workload.scheduler.decode_stream_layout")
    # the GPU experiment runs SGLang-style TBO
    assert str(compose_run(["+experiment=nvidia_inference"]).workload.scheduler.decode_stream_layout) == "none"


def test_auto_layout_is_the_fabrics_own() -> None:
    """The default decode layout names no die: CloudMatrix-Infer's split on the 910C die it was
    made for, no split on a GPU; the search space's `auto` resolves the same way (deduplicated)."""
    from workloads.common.kernels import layout_on_die
    from workloads.llm_infer.workload import resolved_layouts

    assert str(layout_on_die("auto", 24, 48)) == "cloudmatrix_tbo"
    assert str(layout_on_die("auto", 132, 132)) == "none"
    assert str(layout_on_die("none", 24, 48)) == "none"
    for fabric, want in (("cloudmatrix384", ["cloudmatrix_tbo", "none"]), ("hgx_h100", ["none"])):
        cfg = compose_run([f"fabric={fabric}", "library=[nccl]" if fabric != "cloudmatrix384" else "library=[hccl]",
                           "baseline=nccl" if fabric != "cloudmatrix384" else "baseline=hccl",
                           "workload=llm_infer"])
        assert str(cfg.workload.scheduler.decode_stream_layout) == "auto"
        done = resolved_layouts(cfg.workload, Fabric(cfg.fabric))
        assert str(done.scheduler.decode_stream_layout) == want[0]
        assert done.search.stream_layout == want
