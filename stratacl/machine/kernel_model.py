"""Achieved-throughput kernel model: what one compute kernel takes on the cores it gets.

`stratacl.machine.compute.lower_compute` calls `KernelModel.price` for every compute op; the facts are the
die's `fabric.die.kernel` section (`KernelModelConfig`, conf/fabric/*.yaml, each value sourced or
an ASSUMPTION knob). The defaults are the ideal kernel, i.e. the old roofline. Per kernel class
(`Op.kernel`, a `KernelClass`; "" = generic of its core kind) and numeric format:

- **Compute part.** FLOPs at the class's attainable fraction of the die's peak for the format the
  matmuls run in. With `Op.gemms` and tile sizes for the class, the work is padded to whole output
  tiles (m, n rounded up to the tile; k plus the per-tile pipeline fill `k_fill`) and spread over
  the c cores the kernel gets in waves: `units` blocks take ceil(units / c) waves, so the wave
  efficiency is units / (waves · c); a GEMM with c + 1 tiles takes two waves. The kernel picks the
  tile pair with the least padded, wave-quantised work (DeepGEMM's block-size heuristic). Blocks:
  GEMMs and grouped GEMMs: every output tile of every matmul; attention (QKᵀ and PV fused in one
  kernel): the tiles of each group of query rows once (its QKᵀ; the PV of the same rows adds none,
  and ragged key counts split the queries into several row groups); prefill attention walks all of the KV length in one block (one
  block per query tile and head), decode attention splits the KV length over blocks (split-KV).
  The compute part scales with the cores: t = FLOPs · (padded work / exact work) / wave eff. /
  (fraction · peak · c / C).
- **Memory part.** The op's HBM bytes plus the tile re-read traffic computed from the shape, at the
  class's attainable fraction of the die's HBM rate, which a kernel reaches with
  `hbm_saturation_cores` cube cores (core groups): on c of them it gets min(1, c / sat) of it, so a
  memory-bound kernel on half the cores is not twice as slow.
  Re-reads: a GEMM's operands stream through the on-chip buffer B one output block at a time; the
  block is the largest square of tiles whose panels fit, s = ⌊B / (2 · k · e) / tile⌋ · tile (at
  least one tile), so A (m×k) is read ⌈n / s_n⌉ times and B (k×n) ⌈m / s_m⌉ times:
  extra = count · (A · (⌈n/s_n⌉ − 1) + B · (⌈m/s_m⌉ − 1)); an operand pair that fits is read once.
  Attention (FlashAttention's K/V re-read): every query block of tile_m rows streams all of K
  (QKᵀ's k×n operand) and V (PV's); the g query blocks of a head that run in the same wave share
  one pass through the on-chip buffer, g = min(cores, ⌊B / (tile_n · d · e)⌋) (each block in flight
  keeps its current K/V tile of tile_n rows × head_dim d resident; d = QKᵀ's k), so per matmul
  extra = count · k · n · e · (⌈⌈m / tile_m⌉ / g⌉ − 1); with the buffer holding one tile, g = 1 and
  K/V is read once per query block.
  Attention backward (FlashAttention-2/3's dQ, dK, dV kernel: QKᵀ recomputed, dP, dV, dK, dQ per
  tile pair): one block per key tile of tile_n keys and head, walking every query tile (so the
  blocks are c · ⌈s_k / tile_n⌉ per grid); each matmul's two sequence dims padded to the tiles
  and its head dim whole (the head is one tile's width), plus `k_fill` per matmul and tile pair
  and `walk_fill` query tiles per block (its prologue and epilogue: K/V loaded, dK/dV written,
  and the passes FlashAttention runs around the kernel, dO·O before and dQ's conversion after);
  its re-reads are Q and dO streamed by every key block, shared by the g = min(cores,
  ⌊B / (tile_m · d · e)⌋) key blocks of a head in the same wave: 2 · c · s_q · d · e · (⌈⌈s_k /
  tile_n⌉ / g⌉ − 1) per grid (dQ's fp32 accumulation is left in the on-chip buffer: ASSUMPTION).
  The extra bytes are HBM load, so communication sharing HBM slows compute by mechanism.
- **Ramp and launch.** The class's `fill_us` (first loads in flight, last tiles' epilogue) adds to
  the kernel's time alone: max(compute part, memory part) + fill. The die's `launch_us` is paid
  once per kernel before it runs (a delay phase: it holds nothing).

Kernels without `gemms` use their class's attainable fractions only (no shape effects).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stratacl.config import KernelClassConfig, KernelModelConfig
from stratacl.trace import Op
from stratacl.vocab import CoreKind, KernelClass

if TYPE_CHECKING:
    from stratacl.machine.fabric import Fabric

GENERIC: dict[str, str] = {CoreKind.cube: "generic_cube", CoreKind.vector: "generic_vector", CoreKind.mixed: "generic_mixed"}
CLASS_KEYS = (*(k.value for k in KernelClass), *GENERIC.values())
FUSED = (KernelClass.attention_prefill, KernelClass.attention_decode)  # QKᵀ and PV in the same blocks
# (the backward, KernelClass.attention_backward, has its own blocks and work: `_backward_work`)
WHOLE_N = (KernelClass.attention_prefill,)  # one block walks all of n (the KV length)
ATTENTION = FUSED
# bytes per element of a stored operand by format ("" = bf16)
ELEMENT_BYTES = {"": 2.0, "fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5,
                 "fp4": 0.5}
_IDEAL = KernelClassConfig()


@dataclass(frozen=True, slots=True)
class KernelTime:
    """One kernel on the cores it gets, alone on the die."""

    compute_s: float  # the cube pipeline (mixed: max of the cube and vector pipelines) on its cores
    memory_s: float  # its HBM bytes at the rate it reaches on its cores
    hbm_bytes: float  # per rank: the op's bytes plus re-reads
    reread_bytes: float  # per rank: the re-read part
    work_factor: float  # padded, wave-quantised work / exact work (1 = no shape effect)
    waves: int  # 0 = no tiling
    wave_efficiency: float
    tile: tuple[int, int]  # (tile_m, tile_n) chosen; (0, 0) = none
    fill_s: float  # the kernel's ramp on the device (class fill_us)
    launch_s: float

    @property
    def alone_s(self) -> float:
        """Device time alone on its cores: max(compute part, memory part) + ramp."""
        return max(self.compute_s, self.memory_s) + self.fill_s


class KernelModel:
    """The die's kernel facts, numeric. `price(op, frac, cube_peak, vector_peak)`."""

    def __init__(self, cfg: KernelModelConfig, cube_cores: int, vector_cores: int, hbm_Bps: float) -> None:
        bad = set(cfg.classes) - set(CLASS_KEYS)
        if bad:
            from stratacl.errors import ConfigError

            raise ConfigError("fabric.die.kernel.classes", f"unknown kernel classes {sorted(bad)}",
                              f"use keys of {list(CLASS_KEYS)}")
        self.cfg = cfg
        self.launch_s = cfg.launch_us * 1e-6
        self.sat_cores = cfg.hbm_saturation_cores
        self.buffer_bytes = cfg.onchip_buffer_MiB * 2**20
        self.cube_cores = cube_cores
        self.vector_cores = vector_cores
        self.hbm_Bps = hbm_Bps

    def klass(self, op: Op) -> tuple[str, KernelClassConfig]:
        name = op.kernel or GENERIC[op.core]
        return name, self.cfg.classes.get(name, _IDEAL)

    @staticmethod
    def fraction(kc: KernelClassConfig, key: str) -> float:
        """Attainable fraction of the compute peak for a format ("vector" for the vector unit)."""
        cf = kc.compute_fraction
        return cf.get(key, cf.get("any", 1.0))

    def tiling(self, op: Op, kc: KernelClassConfig, cores: int) -> tuple[float, int, float, tuple[int, int]]:
        """(work factor, waves, wave efficiency, tile) of the tile pair with the least padded,
        wave-quantised work on `cores` cores; (1, 0, 1, (0, 0)) without gemms or tiles."""
        if not op.gemms or not kc.tile_m or not kc.tile_n:
            return 1.0, 0, 1.0, (0, 0)
        if op.kernel == KernelClass.attention_backward:
            return _best_tile(kc, cores, op.gemms, lambda tm, tn: _backward_work(op.gemms, kc, tm, tn))
        fused, whole_n = op.kernel in FUSED, op.kernel in WHOLE_N

        def work_units(tm: int, tn: int) -> tuple[float, int]:
            units, work = 0, 0.0
            blocks: dict[tuple[int, int], int] = {}  # fused: blocks per (rows, count) group
            for m, n, k, c in op.gemms:
                mb, nb = -(-m // tm), -(-n // tn)
                work += 2.0 * mb * tm * nb * tn * (k + kc.k_fill) * c
                if not fused:
                    units += c * mb * nb
                else:  # a group's blocks are its QKᵀ's (split-KV: its key tiles); the PV of the same
                    # rows (n = head dim, listed first when shapes sort) adds none
                    blocks[(m, c)] = max(blocks.get((m, c), 0), c * mb * (1 if whole_n else nb))
            return work, units + sum(blocks.values())

        return _best_tile(kc, cores, op.gemms, work_units)

    def reread_bytes(self, op: Op, tile: tuple[int, int], cores: int) -> float:
        """Per-rank HBM bytes read again because of tiling (module docstring, closed forms)."""
        tm, tn = tile
        if not tm or not op.gemms:
            return 0.0
        e = ELEMENT_BYTES.get(op.dtype, 2.0)
        extra = 0.0
        if op.kernel == KernelClass.attention_backward:  # Q and dO again for every pass of key blocks
            heads: dict[tuple[int, int], tuple[int, int]] = {}
            for s_q, s_k, d, c in backward_grids(op.gemms):
                c0, d0 = heads.get((s_q, s_k), (c, d))
                heads[(s_q, s_k)] = (min(c0, c), max(d0, d))
            for (s_q, s_k), (c, d) in heads.items():
                g = max(1, min(cores, math.floor(self.buffer_bytes / (tm * d * e))))
                extra += 2 * c * s_q * d * e * (_cdiv(_cdiv(s_k, tn), g) - 1)
            return extra
        # attention: the K/V tile in flight is tile_n × head_dim, head_dim = k of QKᵀ (the first)
        g = self.sharing(op, tile, op.gemms[0][2], cores) if op.kernel in ATTENTION else 1
        for m, n, k, c in op.gemms:
            if op.kernel in ATTENTION:  # K / V again for every pass of query blocks
                extra += c * k * n * e * (_cdiv(_cdiv(m, tm), g) - 1)
                continue
            side = self.buffer_bytes / (2.0 * k * e)  # rows of A = columns of B whose panels fit
            s_m = max(tm, math.floor(side / tm) * tm)
            s_n = max(tn, math.floor(side / tn) * tn)
            extra += c * (m * k * e * (-(-n // s_n) - 1) + k * n * e * (-(-m // s_m) - 1))
        return extra

    def sharing(self, op: Op, tile: tuple[int, int], k: int, cores: int) -> int:
        """Query blocks of one head that share one pass over its K/V: the blocks of a wave run in
        step and the on-chip buffer serves their K/V tiles to all of them, as long as every block
        in flight has its current K/V tile (tile_n × k) resident: min(cores, ⌊B / (tile_n·k·e)⌋)."""
        e = ELEMENT_BYTES.get(op.dtype, 2.0)
        return max(1, min(cores, math.floor(self.buffer_bytes / (tile[1] * k * e))))

    def price(self, op: Op, frac: float, cube_peak: float, vector_peak: float,
              cube_format: str) -> KernelTime:
        """Time of `op` alone on `frac` of the die's cores of its kind (block_dim, stream limits)."""
        _, kc = self.klass(op)
        flops, vflops, hbm = max(op.flops), max(op.vector_flops), max(op.hbm_bytes)
        total = self.vector_cores if op.core == CoreKind.vector else self.cube_cores
        cores = max(1, round(frac * total))
        factor, waves, eff, tile = self.tiling(op, kc, cores)
        if op.core == CoreKind.vector:
            t_c = flops / (self.fraction(kc, "vector") * vector_peak * frac)
        else:
            t_c = flops * factor / (self.fraction(kc, cube_format) * cube_peak * frac)
            if op.core == CoreKind.mixed:
                t_c = max(t_c, vflops / (self.fraction(kc, "vector") * vector_peak * frac))
        extra = self.reread_bytes(op, tile, cores)
        groups = frac * self.cube_cores  # cube cores / core groups it runs on (vector: their share)
        share = min(1.0, groups / self.sat_cores)
        t_m = (hbm + extra) / (kc.hbm_fraction * self.hbm_Bps * share)
        return KernelTime(t_c, t_m, hbm + extra, extra, factor, waves, eff, tile, kc.fill_us * 1e-6,
                          self.launch_s)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _best_tile(kc: KernelClassConfig, cores: int, gemms: tuple[tuple[int, int, int, int], ...],
               work_units: Callable[[int, int], tuple[float, int]]) -> tuple[float, int, float, tuple[int, int]]:
    """(work factor, waves, wave efficiency, tile) of the tile pair `work_units(tm, tn)` (padded
    work, blocks) makes cheapest: DeepGEMM's choice, fewest waves, then the fullest last wave,
    then the least padded work, then the larger tile."""
    exact = sum(2.0 * m * n * k * c for m, n, k, c in gemms)
    best: tuple[tuple[int, int, float, int], tuple[float, int, float, tuple[int, int]]] | None = None
    for tm in kc.tile_m:
        for tn in kc.tile_n:
            work, units = work_units(tm, tn)
            waves = -(-units // cores)
            eff = units / (waves * cores)
            rank = (waves, -(units - (waves - 1) * cores), work, -tm * tn)
            if best is None or rank < best[0]:
                best = (rank, (work / exact / eff, waves, eff, (tm, tn)))
    assert best is not None
    return best[1]


def _backward_work(gemms: tuple[tuple[int, int, int, int], ...], kc: KernelClassConfig, tm: int,
                   tn: int) -> tuple[float, int]:
    """FlashAttention's backward (module docstring): blocks are key tiles, each walking every
    query tile of its head (plus `walk_fill`); the padded work is the (query × key) tile grid
    times each matmul's head dim plus the per-tile fill."""
    work = sum(2.0 * (_cdiv(s_q, tm) + kc.walk_fill) * tm * _cdiv(s_k, tn) * tn * (d + kc.k_fill) * c
               for s_q, s_k, d, c in backward_grids(gemms))
    return work, sum(c_min * _cdiv(s_k, tn) for s_k, c_min in backward_blocks(gemms).items())


def _grid(m: int, n: int, k: int) -> tuple[int, int, int]:
    """(query length, key length, head dim) of one backward matmul: every matmul of the backward
    has two sequence dims and one head dim, the head dim the smallest (training sequences are
    longer than a head; ASSUMPTION where they are not), the longer sequence dim the keys."""
    d, s_q, s_k = sorted((int(m), int(n), int(k)))
    return s_q, s_k, d


def backward_grids(gemms: tuple[tuple[int, int, int, int], ...]) -> list[tuple[int, int, int, int]]:
    """Each backward matmul as (query length, key length, head dim, count)."""
    return [(*_grid(m, n, k), c) for m, n, k, c in gemms]


def backward_blocks(gemms: tuple[tuple[int, int, int, int], ...]) -> dict[int, int]:
    """Heads (× batch) per key length: the least count among the matmuls of one (query, key) grid
    (the five matmuls of a tile pair may arrive merged by shape, e.g. dV and dQ of a square
    grid as one entry of twice the count), summed over grids with the same key length."""
    least: dict[tuple[int, int], int] = {}
    for s_q, s_k, _, c in backward_grids(gemms):
        least[(s_q, s_k)] = min(least.get((s_q, s_k), c), c)
    out: dict[int, int] = {}
    for (_, s_k), c in least.items():
        out[s_k] = out.get(s_k, 0) + c
    return out


def kernel_model(fabric: Fabric) -> KernelModel:
    """The fabric's kernel model, built once per Fabric."""
    km = fabric._kernel_model
    if km is None:
        die = fabric.cfg.die
        km = KernelModel(die.kernel, fabric.cube_cores, fabric.vector_cores, fabric.hbm_Bps)
        fabric._kernel_model = km
    return km
