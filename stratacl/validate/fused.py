"""CANN's fused MoE dispatch/combine on CloudMatrix384 as operator rows (`cann_fused_a3.csv`).

The only published per-operator figures of the A3 fused kernels we found: sgl-kernel-npu's README
(sgl-project/sgl-kernel-npu @f425bdf), its low-latency dispatch/combine (the kernels built on CANN's
MoeDistributeDispatchV2 / CombineV2 code: `aclnnMoeLowLatencyDispatchV2`) at 128 tokens per rank,
EP 8-32, latency and bandwidth, and its normal kernels at 4096 tokens, EP 8-128, bandwidth only, on an
A3 384 SuperPOD (hidden 7168, top-8, INT8 dispatch, BF16 combine). CloudMatrix-Infer's own Table 7
(2506.12708 §5.5.1) was not found in any stored copy of the paper, so none of its figures is used.

Each row is the `moe` workload run in process with the row's shape and the `cann_ep` preset on
`cloudmatrix384`: low-latency rows compare the operator's time, normal rows its bandwidth in DeepEP's
logical convention (bytes of the token copies a rank receives / time; the README's "bottleneck
bandwidth" of an all-HCCS run). Split rule, fixed before any fit: of each low-latency op, EP 8 and
EP 32 (the ends) calibrate and EP 16 checks; every normal row checks. The calibration rows set
`library.cann_ep.moe_copy_us.<op>_ll` (a token copy's processing on its AIV: the fused op's
quantisation and per-expert packing, the combine's weighted sum), which no other source gives:
`python -m stratacl.validate --fit` prints the least-squares value (log time error), never reading
a check row.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stratacl.validate.kernels import with_errors
from stratacl.validate.operators import moe_metrics

TABLE = Path(__file__).parents[1] / "data" / "operators" / "cann_fused_a3.csv"
FABRIC = "cloudmatrix384"
LIBRARY = "cann_ep"
CONVENTION = "deepep_logical_GBps"
ROLES = ("calibrate", "check")
MAX_COPY_US = 20.0  # the fit's search range (µs per token copy)


@dataclass(frozen=True)
class FusedRow:
    mode: str
    kind: str
    ep: int
    tokens: int
    role: str
    latency_us: float  # nan: the row states a bandwidth only
    bandwidth_GBps: float
    source: str

    @property
    def id(self) -> str:
        return f"cann_fused_{self.kind}_{self.mode}_ep{self.ep}"

    @property
    def group(self) -> str:
        return f"cann fused {self.kind} {self.mode} (sgl-kernel-npu, A3)"

    @property
    def measured(self) -> float:
        return self.latency_us if self.mode == "ll" else self.bandwidth_GBps

    @property
    def unit(self) -> str:
        return "us" if self.mode == "ll" else "GB/s"

    @property
    def knob(self) -> str:
        return f"{self.kind}_{self.mode}"


def load(path: Path = TABLE) -> list[FusedRow]:
    rows = []
    with path.open(newline="") as f:
        for r in csv.DictReader(f):
            row = FusedRow(r["mode"], r["kind"], int(r["ep"]), int(r["tokens"]), r["role"],
                           float(r["latency_us"] or "nan"), float(r["bandwidth_GBps"]), r["source"])
            if row.role not in ROLES or not row.source or not math.isfinite(row.measured):
                raise ValueError(f"{path}: row {row.id}: needs a role in {ROLES}, a source and its measured value")
            rows.append(row)
    return rows


def harness(row: FusedRow, copy_us: float | None = None) -> float:
    """The row's figure in the harness (µs for low-latency rows, GB/s for normal ones); `copy_us`
    replaces the preset's per-copy processing for the row's op (the fit's trial value)."""
    over = (f"fabric={FABRIC}", "workload=moe", f"library=[{LIBRARY}]", f"baseline={LIBRARY}",
            f"workload.ep={row.ep}", f"workload.modes=[{row.mode}]", f"workload.tokens_{row.mode}={row.tokens}",
            *((f"++library.{LIBRARY}.moe_copy_us.{row.knob}={copy_us}",) if copy_us is not None else ()))
    m = moe_metrics(over)
    key = f"{row.kind}_{row.mode}"
    return m[f"{key}_time_us"] if row.mode == "ll" else m[f"{key}_{CONVENTION}"]


def evaluate(rows: Sequence[FusedRow]) -> list[tuple[FusedRow, float, float]]:
    return with_errors(rows, harness)


def fit(rows: Sequence[FusedRow]) -> dict[str, float]:
    """Per low-latency op: the per-copy processing (µs) minimising the calibration rows' squared
    log time error (golden-section search on [0, MAX_COPY_US]; the time grows with it)."""
    out = {}
    for knob in dict.fromkeys(r.knob for r in rows if r.role == "calibrate" and r.mode == "ll"):
        cal = [r for r in rows if r.knob == knob and r.role == "calibrate" and r.mode == "ll"]

        def loss(x: float, cal: list[FusedRow] = cal) -> float:
            return sum(math.log(harness(r, x) / r.latency_us) ** 2 for r in cal)

        lo, hi = 0.0, MAX_COPY_US
        g = (math.sqrt(5) - 1) / 2
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        fa, fb = loss(a), loss(b)
        for _ in range(24):
            if fa <= fb:
                hi, b, fb = b, a, fa
                a = hi - g * (hi - lo)
                fa = loss(a)
            else:
                lo, a, fa = a, b, fb
                b = lo + g * (hi - lo)
                fb = loss(b)
        x = (lo + hi) / 2
        out[knob] = 0.0 if loss(0.0) <= loss(x) else x
    return out
