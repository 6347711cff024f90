"""The achieved-throughput kernel model (stratacl/machine/kernel_model.py) against closed forms: wave
quantisation, HBM saturation by a core subset, the launch once per kernel, tile re-read bytes, the
ideal defaults = the old roofline; and the validation table's calibration / check separation."""

from __future__ import annotations

import copy
import csv
import math

import pytest
from helpers import compose_run, make_library

from stratacl.config import KernelClassConfig, KernelModelConfig
from stratacl.engine.replay import simulate
from stratacl.machine.compute import ComputeLowering, lower_compute
from stratacl.machine.fabric import Fabric
from stratacl.machine.kernel_model import kernel_model
from stratacl.trace import Op, Trace

MiB = 2**20


def fabric_with(kernel: KernelModelConfig, preset: str = "cloudmatrix384") -> Fabric:
    cfg = copy.deepcopy(compose_run([f"fabric={preset}"]).fabric)
    cfg.die.kernel = kernel
    return Fabric(cfg)


TILED = KernelClassConfig(compute_fraction={"bf16": 1.0}, tile_m=[128], tile_n=[128])


def gemm_op(m: int, n: int, k: int, count: int = 1, hbm: float = 0.0, **kw: object) -> Op:
    return Op(id=0, kind="compute", ranks=(0,), flops=(2.0 * m * n * k * count,), hbm_bytes=(hbm,),
              kernel="gemm", gemms=((m, n, k, count),), **kw)


def alone(phases) -> float:  # noqa: ANN001
    return sum(p.standalone_s() for p in phases)


# --------------------------------------------------------------------------- waves


def test_one_tile_more_than_cores_takes_two_waves() -> None:
    fab = fabric_with(KernelModelConfig(classes={"gemm": TILED}))
    cores, k = fab.cube_cores, 4096  # 24 AIC on a 910C die
    t_tile = 2 * 128 * 128 * k / (fab.cube_flops / cores)  # one tile on one core at peak
    full = gemm_op(128 * 4, 128 * 6, k)  # 24 tiles: one wave
    over = gemm_op(128 * 5, 128 * 5, k)  # 25 tiles = cores + 1: two waves
    assert alone(lower_compute(full, fab)) == pytest.approx(t_tile, rel=1e-12)
    assert alone(lower_compute(over, fab)) == pytest.approx(2 * t_tile, rel=1e-12)
    kt = kernel_model(fab).price(over, 1.0, fab.cube_flops, fab.vector_flops, "bf16")
    assert (kt.waves, kt.wave_efficiency) == (2, pytest.approx(25 / 48))


def test_waves_count_over_the_cores_the_kernel_gets() -> None:
    fab = fabric_with(KernelModelConfig(classes={"gemm": TILED}))
    k = 4096
    t_tile = 2 * 128 * 128 * k / (fab.cube_flops / fab.cube_cores)
    op = gemm_op(128 * 4, 128 * 3, k, block_dim=8)  # 12 tiles on 8 cores: 2 waves
    assert alone(lower_compute(op, fab)) == pytest.approx(2 * t_tile, rel=1e-12)


def test_fused_attention_blocks_count_every_row_group_once() -> None:
    """A decode attention kernel whose keys split the queries into ragged row groups (gemms of
    (rows, kv, d, count) and (rows, d, kv, count) per group) runs blocks for every group's query
    tiles × KV splits (split-KV: ⌈kv / 64⌉) — its PV matmul adds none: 3·129 + 125·129 + 3·6·1 =
    16,530 blocks on 24 cores, 689 waves, whichever group comes first (counting the first group
    alone made neighbouring contexts price up to 6.6× apart), and whichever of a group's matmuls
    (shapes sorted put PV (rows, d, kv) first: counting its blocks dropped the KV split, a decode
    step stepped +10 % between 144 and 150 sequences at 157K keys)."""
    cls = KernelClassConfig(compute_fraction={"bf16": 1.0}, tile_m=[64], tile_n=[64])
    fab = fabric_with(KernelModelConfig(classes={"attention_decode": cls}))
    groups = ((11, 8193, 3), (12, 8193, 125), (383, 64, 3))  # (rows, keys, count)
    gemms = tuple(g for m, kv, c in groups for g in ((m, kv, 64, c), (m, 64, kv, c)))
    for order in (gemms, gemms[2:] + gemms[:2], tuple(sorted(gemms))):
        op = Op(id=0, kind="compute", ranks=(0,), core="mixed", kernel="attention_decode", gemms=order,
                flops=(sum(2.0 * m * n * k * c for m, n, k, c in order),))
        kt = kernel_model(fab).price(op, 1.0, fab.cube_flops, fab.vector_flops, "bf16")
        assert (kt.waves, kt.wave_efficiency) == (689, pytest.approx(16530 / (689 * 24)))


def _backward_op(gemms: tuple[tuple[int, int, int, int], ...], hbm: float = 0.0) -> Op:
    return Op(id=0, kind="compute", ranks=(0,), core="mixed", kernel="attention_backward", gemms=gemms,
              flops=(sum(2.0 * m * n * k * c for m, n, k, c in gemms),), hbm_bytes=(hbm,))


def _fa_backward(s_q: int, s_k: int, d: int, bh: int) -> tuple[tuple[int, int, int, int], ...]:
    """FlashAttention's five backward matmuls as torch's flop counter lists them: QKᵀ
    recomputed, dP, dV, dQ, dK."""
    return ((s_q, s_k, d, bh), (s_q, s_k, d, bh), (s_k, d, s_q, bh), (s_q, d, s_k, bh), (d, s_k, s_q, bh))


def test_attention_backward_blocks_are_key_tiles_and_the_head_dim_is_not_padded() -> None:
    """One block per key tile and head (FlashAttention's backward grid): 16 heads × ⌈1000 / 128⌉
    = 128 blocks on 24 cores, 6 waves; the two sequence dims pad to the tiles (1000 → 1024), the
    head dim (64 < tile 128) stays whole; merged shapes (dV and dQ of a square grid as one entry
    of twice the count) count their blocks once. Closed form of the compute part."""
    cls = KernelClassConfig(compute_fraction={"bf16": 1.0}, tile_m=[128], tile_n=[128])
    fab = fabric_with(KernelModelConfig(classes={"attention_backward": cls}))
    s, d, bh = 1000, 64, 16
    five = _fa_backward(s, s, d, bh)
    merged = ((d, s, s, bh), (s, d, s, 2 * bh), (s, s, d, 2 * bh))
    for gemms in (five, merged):
        kt = kernel_model(fab).price(_backward_op(gemms), 1.0, fab.cube_flops, fab.vector_flops, "bf16")
        assert (kt.waves, kt.wave_efficiency) == (6, pytest.approx(128 / (6 * 24)))
        assert kt.work_factor == pytest.approx((1024 / 1000) ** 2 / (128 / 144))
        assert kt.compute_s == pytest.approx(10.0 * bh * 1024 * 1024 * d / (128 / 144) / fab.cube_flops)


def test_attention_backward_walk_fill_weighs_short_sequences_more() -> None:
    """`walk_fill` query tiles per key block: work × (⌈s/tm⌉ + f) / ⌈s/tm⌉, so the achieved rate
    rises with the sequence (FA3 Fig. 6's shape) and `k_fill` adds per matmul and tile pair."""
    f, kf, d = 4.0, 32.0, 128
    cls = KernelClassConfig(compute_fraction={"bf16": 1.0}, tile_m=[128], tile_n=[128], walk_fill=f, k_fill=kf)
    fab = fabric_with(KernelModelConfig(classes={"attention_backward": cls}))
    rates = []
    for s in (512, 2048, 8192):
        op = _backward_op(_fa_backward(s, s, d, 48))
        kt = kernel_model(fab).price(op, 1.0, fab.cube_flops, fab.vector_flops, "bf16")
        tiles = s // 128
        assert kt.work_factor == pytest.approx((tiles + f) / tiles * (d + kf) / d / kt.wave_efficiency)
        rates.append(op.flops[0] / kt.compute_s)
    assert rates[0] < rates[1] < rates[2] < fab.cube_flops


def test_attention_backward_rereads_q_and_do_per_pass_of_key_blocks() -> None:
    """Q and dO (each s_q × d) again for every pass of g key blocks of a head, g = min(cores,
    ⌊B / (tile_m·d·e)⌋): 2 · c · s_q · d · e · (⌈⌈s_k / tn⌉ / g⌉ − 1), the five matmuls of one
    grid counted once."""
    s, d, bh, tm, tn, e, g = 4096, 128, 4, 128, 128, 2, 4
    cls = KernelClassConfig(compute_fraction={"bf16": 1.0}, tile_m=[tm], tile_n=[tn])
    fab = fabric_with(KernelModelConfig(onchip_buffer_MiB=g * tm * d * e / MiB,
                                        classes={"attention_backward": cls}))
    kt = kernel_model(fab).price(_backward_op(_fa_backward(s, s, d, bh)), 1.0, fab.cube_flops,
                                 fab.vector_flops, "bf16")
    assert kt.reread_bytes == 2 * bh * s * d * e * (math.ceil(math.ceil(s / tn) / g) - 1)


def test_padding_to_whole_tiles() -> None:
    fab = fabric_with(KernelModelConfig(classes={"gemm": TILED}))
    k = 1024
    t_tile = 2 * 128 * 128 * k / (fab.cube_flops / fab.cube_cores)
    assert alone(lower_compute(gemm_op(1, 128, k), fab)) == pytest.approx(t_tile, rel=1e-12)  # m = 1 pads to 128


# --------------------------------------------------------------------------- HBM saturation


@pytest.mark.parametrize("core", ["vector", "cube"])
def test_memory_bound_kernel_on_half_the_cores_is_not_slower(core) -> None:  # noqa: ANN001
    sat = 12
    fab = fabric_with(KernelModelConfig(hbm_saturation_cores=sat))
    total = fab.vector_cores if core == "vector" else fab.cube_cores
    per_group = fab.aiv_per_group if core == "vector" else 1
    op = Op(id=0, kind="compute", ranks=(0,), flops=(1e6,), hbm_bytes=(512 * MiB,), core=core)
    t_all = alone(lower_compute(op, fab))
    assert t_all == pytest.approx(512 * MiB / fab.hbm_Bps, rel=1e-12)
    half = copy.copy(op)
    half.block_dim = total // 2  # 12 core groups = hbm_saturation_cores
    assert total // 2 / per_group >= sat
    assert alone(lower_compute(half, fab)) == pytest.approx(t_all, rel=1e-12)
    quarter = copy.copy(op)
    quarter.block_dim = total // 4  # 6 groups: half the saturation count, half the HBM rate
    assert alone(lower_compute(quarter, fab)) == pytest.approx(2 * t_all, rel=1e-12)


def test_compute_part_scales_with_the_cores() -> None:
    fab = fabric_with(KernelModelConfig(hbm_saturation_cores=1))
    op = Op(id=0, kind="compute", ranks=(0,), flops=(fab.cube_flops * 1e-3,), hbm_bytes=(1.0,))
    half = copy.copy(op)
    half.block_dim = fab.cube_cores // 2
    assert alone(lower_compute(half, fab)) == pytest.approx(2 * alone(lower_compute(op, fab)), rel=1e-12)


def test_stream_limit_and_saturation_in_the_fluid_engine(cm384) -> None:  # noqa: ANN001
    """Two memory-bound kernels on two streams limited to half the cores each: HBM is shared, so
    together they take twice one alone — not four times (the old per-core rate cap)."""
    fab = fabric_with(KernelModelConfig(hbm_saturation_cores=12))
    lib = make_library(fab, "hccl")
    tr = Trace(world_size=2)
    tr.limit_stream("a", 12, 24)
    tr.limit_stream("b", 12, 24)
    nbytes = 256 * MiB
    tr.compute([0], flops=1e6, hbm_bytes=nbytes, core="vector", stream="a")
    tr.compute([0], flops=1e6, hbm_bytes=nbytes, core="vector", stream="b")
    res = simulate(tr, lib, check=True)
    assert res.makespan_s == pytest.approx(2 * nbytes / fab.hbm_Bps, rel=1e-9)


# --------------------------------------------------------------------------- launch


def test_launch_cost_once_per_kernel() -> None:
    launch = 7.0
    fab = fabric_with(KernelModelConfig(launch_us=launch))
    lib = make_library(fab, "hccl")
    t = 50e-6
    for n in (1, 4):
        tr = Trace(world_size=2)
        for _ in range(n):
            tr.compute([0], flops=fab.cube_flops * t)
        assert simulate(tr, lib).makespan_s == pytest.approx(n * (t + launch * 1e-6), rel=1e-9)
    phases = lower_compute(Op(id=0, kind="compute", ranks=(0,), flops=(1e9,)), fab)
    assert [p.category for p in phases] == ["launch", "compute"] and phases[0].delay_s == launch * 1e-6


# --------------------------------------------------------------------------- re-reads


def test_flash_attention_reread_bytes_closed_form() -> None:
    """K and V are read once per pass of g query blocks; g = min(cores, ⌊B / (tile_n·k·e)⌋)."""
    q, kv, d, bh, tm, tn, e = 4096, 4096, 128, 8, 128, 128, 2
    g = 4
    buffer = g * tn * d * e  # holds exactly 4 blocks' K/V tiles
    attn = KernelClassConfig(compute_fraction={"any": 1.0}, tile_m=[tm], tile_n=[tn])
    fab = fabric_with(KernelModelConfig(onchip_buffer_MiB=buffer / MiB, classes={"attention_prefill": attn}))
    flops = 4.0 * bh * q * kv * d
    base = 4.0 * bh * q * d * e
    op = Op(id=0, kind="compute", ranks=(0, 1), flops=(flops,), hbm_bytes=(base,), core="mixed",
            kernel="attention_prefill", gemms=((q, kv, d, bh), (q, d, kv, bh)))
    kt = kernel_model(fab).price(op, 1.0, fab.cube_flops, fab.vector_flops, "bf16")
    passes = math.ceil(math.ceil(q / tm) / g)  # 32 query blocks, 4 per pass: 8 passes
    want = 2 * bh * kv * d * e * (passes - 1)  # K for QKᵀ, V for PV
    assert kt.reread_bytes == want
    phase = lower_compute(op, fab)[-1]
    assert phase.hbm_bytes == 2 * (base + want)  # two ranks
    # the re-reads are HBM load: the kernel is memory-bound on them here
    assert phase.loads[-1][2] == pytest.approx((base + want) / fab.hbm_Bps)


def test_gemm_reread_bounded_by_the_buffer() -> None:
    m, n, k, e = 2048, 2048, 1024, 2
    op = gemm_op(m, n, k)
    big = fabric_with(KernelModelConfig(onchip_buffer_MiB=64, classes={"gemm": TILED}))
    assert kernel_model(big).price(op, 1.0, big.cube_flops, big.vector_flops, "bf16").reread_bytes == 0
    side = 512  # the buffer holds the panels of a 512 x 512 output block
    small = fabric_with(KernelModelConfig(onchip_buffer_MiB=2 * side * k * e / MiB, classes={"gemm": TILED}))
    kt = kernel_model(small).price(op, 1.0, small.cube_flops, small.vector_flops, "bf16")
    assert kt.reread_bytes == m * k * e * (n // side - 1) + k * n * e * (m // side - 1)


# --------------------------------------------------------------------------- defaults, memoisation


def test_ideal_defaults_are_the_old_roofline() -> None:
    fab = fabric_with(KernelModelConfig())
    op = Op(id=0, kind="compute", ranks=(0,), flops=(3e12,), hbm_bytes=(4e9,), kernel="gemm",
            gemms=((4096, 4096, 4096, 1),))
    (phase,) = lower_compute(op, fab)
    assert phase.standalone_s() == pytest.approx(max(3e12 / fab.cube_flops, 4e9 / fab.hbm_Bps), rel=1e-12)


def test_class_and_shape_are_in_the_memo_key(cm384) -> None:  # noqa: ANN001
    low = ComputeLowering(cm384)
    a = gemm_op(4096, 4096, 7168, hbm=1e8)
    b = copy.copy(a)
    b.kernel = "elementwise"
    c = copy.copy(a)
    c.gemms = ((4096, 4096, 7168 // 2, 2),)
    times = {alone(low.lower(x)) for x in (a, b, c)}
    assert len(times) == 3


def test_ops_of_one_shape_share_a_lowering_and_the_stream_limit_is_in_the_key(cm384) -> None:  # noqa: ANN001
    a = gemm_op(4096, 4096, 7168, hbm=1e8, stream="mb0")
    b = copy.copy(a)
    b.id, b.name, b.deps = 7, "other layer", (0,)  # not what its phases depend on
    low = ComputeLowering(cm384, {"mb1": (cm384.cube_cores // 2, cm384.vector_cores // 2)})
    assert low.lower(b) is low.lower(a) and low.lower(a) == lower_compute(a, cm384)
    c = copy.copy(a)
    c.stream = "mb1"  # half the cores: its own entry, slower
    assert alone(low.lower(c)) > alone(low.lower(a))
    assert low.lower(c) == lower_compute(c, cm384, (cm384.cube_cores // 2, cm384.vector_cores // 2))


def test_generic_kernel_uses_its_core_kinds_fraction(cm384) -> None:  # noqa: ANN001
    frac = cm384.cfg.die.kernel.classes["generic_cube"].compute_fraction["bf16"]
    op = Op(id=0, kind="compute", ranks=(0,), flops=(cm384.cube_flops * 1e-3,))
    t = lower_compute(op, cm384)[-1].standalone_s()
    assert t == pytest.approx(1e-3 / frac, rel=1e-12)


# --------------------------------------------------------------------------- validation table


def test_roles_follow_the_rule_and_fit_never_reads_check_rows(tmp_path) -> None:  # noqa: ANN001
    from stratacl.validate import kernels as validate

    rows = validate.load_table()
    for group in ("h800 fp8 dense", "h800 fp8 grouped_contiguous", "h800 fp8 grouped_masked",
                  "h800 bf16 attention_prefill"):
        roles = [r.role for r in rows if r.group == group]
        assert roles == ["check" if i % 3 == 2 else "calibrate" for i in range(len(roles))], group
    # poison every check row: the fit must not move
    poisoned = [r if r.role == "calibrate" else validate.replace(r, measured=r.measured * 7) for r in rows]
    sub = {k: v for k, v in validate.FREE.items() if k[1] == "grouped_gemm"}  # has check rows
    orig = validate.FREE
    try:
        validate.FREE = sub
        assert validate.fit(poisoned) == validate.fit(rows)
        # and it does read calibration rows
        moved = [validate.replace(r, measured=r.measured * 0.5) if r.role == "calibrate" else r for r in rows]
        assert validate.fit(moved) != validate.fit(rows)
    finally:
        validate.FREE = orig


def test_report_keeps_calibration_and_check_apart() -> None:
    from stratacl.validate import kernels as validate

    rows = [r for r in validate.load_table() if r.group == "h800 fp8 grouped_masked"]
    results = validate.evaluate(rows)
    summ = validate.summary(results)
    assert [(g, role, n) for g, role, n, _, _ in summ] == [
        ("h800 fp8 grouped_masked", "calibrate", 4), ("h800 fp8 grouped_masked", "check", 2)]
    check = [abs(e) for r, _, e in results if r.role == "check"]
    assert summ[1][4] == max(check)


def test_fast_subset_within_tolerance(tmp_path) -> None:  # noqa: ANN001
    """The check rows of the H800 / H100 GEMM and attention groups (XLA's BF16 dots and FA3's
    backward among them, the training kernels):
    median |error| ≤ 15 % per group (the issues' kernel-level goal), and the report and figure come out."""
    from stratacl.validate import kernels as validate

    rows = [r for r in validate.load_table() if r.role == "check" and r.fabric in ("hgx_h800", "hgx_h100")
            and "other kernel" not in r.group]
    assert {*validate.TRAINING_GROUPS, "h100 bf16 gemm (small shapes)"} <= {r.group for r in rows}
    results = validate.evaluate(rows)
    for g, _, _, med, _ in validate.summary(results):
        # eager ATen: a known miss (16.7 % on 3 check rows). Its SwiGLU rows are two ATen kernels
        # (silu, mul) priced as one kernel with one ramp, and eager RMSNorm peaks at hidden 4096
        # (2.07 TB/s, 1.80 beyond): a per-shape launch choice a single ramp cannot follow
        assert med <= (0.20 if g == "h100 elementwise (eager ATen)" else 0.15), (g, med)
    assert validate.main(["--out", str(tmp_path / "v.png")]) == 0
    assert (tmp_path / "v.png").stat().st_size > 10_000


def test_table_rows_state_source_and_shape() -> None:
    from stratacl.validate import kernels as validate

    with validate.TABLE.open() as f:
        raw = list(csv.DictReader(f))
    assert len(raw) >= 30 and all(r["source"] and r["role"] in validate.ROLES for r in raw)
    for r in validate.load_table():
        if r.kernel in ("gemm", "grouped_gemm"):
            assert r.flops == sum(2 * m * n * k * c for m, n, k, c in r.gemms)


def test_eager_aten_kernels_run_below_the_fused_ones_at_their_fitted_rates() -> None:
    """The same element-wise bytes on H100: eager PyTorch's ATen kernel (`elementwise_eager`) takes
    longer than the fused one (`elementwise`). Each is bytes / (fraction · HBM) plus a constant
    (its ramp, the launch), so between two sizes the time grows by the bytes at the class's rate."""
    cfg = compose_run(["fabric=hgx_h100"]).fabric
    fab = Fabric(cfg)
    times = {}
    for nbytes in (1e6, 1e9):
        for kind in ("elementwise", "elementwise_eager"):
            op = Op(id=0, kind="compute", ranks=(0,), flops=(0.0,), hbm_bytes=(nbytes,), core="vector", kernel=kind)
            times[kind, nbytes] = alone(lower_compute(op, fab))
        assert times["elementwise_eager", nbytes] > times["elementwise", nbytes]
    for kind in ("elementwise", "elementwise_eager"):
        kc = cfg.die.kernel.classes[kind]
        assert times[kind, 1e9] - times[kind, 1e6] == pytest.approx((1e9 - 1e6) / (kc.hbm_fraction * fab.hbm_Bps),
                                                                     rel=1e-6)
        assert times[kind, 1e6] > 1e6 / (kc.hbm_fraction * fab.hbm_Bps) + kc.fill_us * 1e-6 * (1 - 1e-9)
