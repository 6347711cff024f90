"""The CloudMatrix384 section of the validation report: every Ascend row in one place.

Groups, each with its rows, median and worst |error| and what it sets in conf/:
- the 910C kernel groups (stratacl/data/kernels/validation.csv rows on `cloudmatrix384`);
- UB P2P (stratacl/validate/p2p.py: HIXL's A3 one-sided transfers);
- the StrataCL paper's EP32 MoE table (REFERENCE §5; `cm384_moe.csv`): DeepEP over RDMA, CANN EP,
  CANN EP zerocopy and StrataCL dispatch / combine, each the `moe` workload run in process with the
  row's library on `cloudmatrix384` (the `+experiment=moe_table` shape), in DeepEP's logical
  bandwidth as that table states it. HT rows (4096 tokens per rank) only with `every`;
- the decode-layer check (stratacl/validate/decode_layer.py).
- CANN's fused dispatch / combine on A3 (stratacl/validate/fused.py: sgl-kernel-npu's measurements of
  kernels built on CANN's MoeDistributeDispatchV2 / CombineV2; CloudMatrix-Infer's Table 7 was not
  found in any stored copy of the paper, and none of its figures is used).
"""

from __future__ import annotations

import csv
import functools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from stratacl.validate import decode_layer, fused, p2p
from stratacl.validate.kernels import FREE, ROLES, Measured, Row
from stratacl.validate.operators import compose, moe_metrics

if TYPE_CHECKING:
    from stratacl.comm.library import LibraryModel

FABRIC = "cloudmatrix384"
MOE_TABLE = Path(__file__).parents[1] / "data" / "operators" / "cm384_moe.csv"
CONVENTION = "deepep_logical_GBps"
RANKS = 32  # REFERENCE §5 microbenchmarks: 2 nodes x 8 NPUs x 2 dies


@dataclass(frozen=True)
class MoeRow:
    """One cell of REFERENCE §5's MoE table."""

    library: str
    mode: str
    kind: str
    ep: int
    measured: float
    source: str
    role: str = "check"

    @property
    def id(self) -> str:
        return f"{self.library}_{self.kind}_{self.mode}_ep{self.ep}"

    @property
    def group(self) -> str:
        return f"cm384 moe {self.mode} ep{self.ep} {self.library}"


def load_moe(path: Path = MOE_TABLE, every: bool = True) -> list[MoeRow]:
    """`every` False: LL rows only (the default report's fast subset)."""
    rows = []
    with path.open(newline="") as f:
        for r in csv.DictReader(f):
            row = MoeRow(r["library"], r["mode"], r["kind"], int(r["ep"]), float(r["busbw_GBps"]), r["source"],
                         r["role"])
            if row.role != "check" or not row.source:
                raise ValueError(f"{path}: row {row.id}: role must be 'check' (nothing is fitted on it), with a source")
            if every or row.mode == "ll":
                rows.append(row)
    return rows


def moe_overrides(row: MoeRow) -> tuple[str, ...]:
    return (f"fabric={FABRIC}", "workload=moe", f"library=[{row.library}]", f"baseline={row.library}",
            f"workload.ep={row.ep}", f"workload.modes=[{row.mode}]")


def evaluate_moe(rows: list[MoeRow]) -> list[tuple[MoeRow, float, float]]:
    out = []
    for r in rows:
        h = moe_metrics(moe_overrides(r))[f"{r.kind}_{r.mode}_{CONVENTION}"]
        out.append((r, h, h / r.measured - 1.0))
    return out


# --------------------------------------------------------------------------- single operators


@functools.lru_cache(maxsize=256)
def collective_s(library: str, coll: str, size: float, algorithm: str = "", ranks: int = RANKS) -> float:
    """Time of one `coll` of `size` bytes per rank over `ranks` dies of an idle CloudMatrix384;
    `coll` "p2p": the first half of the dies each send `size` to their partner in the second half."""
    return collective_runs(library, coll, (size,), algorithm, ranks=ranks)[0][0]


def collective_runs(library: str, coll: str, sizes: Sequence[float], algorithm: str = "",
                    overrides: Sequence[str] = (), ranks: int = RANKS) -> list[tuple[float, float]]:
    """(time, vector-core-seconds held) of one `coll` per size, each alone over `ranks` dies of an idle
    CloudMatrix384, the library composed once (with `overrides`)."""
    from stratacl.engine.replay import simulate
    from stratacl.trace import Trace

    model = library_model(library, algorithm, tuple(overrides))
    out = []
    for size in sizes:
        tr = Trace(world_size=ranks)
        if coll == "p2p":
            src = list(range(ranks // 2))
            tr.add("p2p", range(ranks), src=src, dst=[r + ranks // 2 for r in src], nbytes=size)
        else:
            tr.add_family("g", [range(ranks)])
            tr.collective(coll, "g", size)
        res = simulate(tr, model)
        out.append((float(res.end[0] - res.start[0]), float(res.core_s[0])))
    return out


@functools.lru_cache(maxsize=64)
def library_model(library: str, algorithm: str = "", overrides: tuple[str, ...] = ()) -> LibraryModel:
    """The `library` preset on CloudMatrix384 (with `overrides`), its algorithm forced when given."""
    from stratacl.comm.library import LibraryModel
    from stratacl.machine.fabric import Fabric

    cfg = compose((f"fabric={FABRIC}", f"library=[{library}]", f"baseline={library}",
                   *((f"library.{library}.algorithm={algorithm}",) if algorithm else ()), *overrides))
    return LibraryModel(library, cfg.library[library], Fabric(cfg.fabric))


MiB = 2.0**20


# --------------------------------------------------------------------------- the section


def sets(group: str, role: str, rows: Sequence[Measured]) -> str:
    """What a group's calibration rows set in conf/ (check rows set nothing)."""
    if role == "check":
        return "check only"
    first = rows[0]
    if isinstance(first, Row):
        return f"{first.fabric}: die.kernel.classes.{first.kernel}." + ", .".join(FREE[(first.fabric, first.kernel)])
    if isinstance(first, fused.FusedRow):
        return f"--fit: library.{fused.LIBRARY}.moe_copy_us.{first.knob}"
    if isinstance(first, p2p.P2PRow):
        costs = [k for k, (t, _) in p2p.COSTS.items() if t == first.tier]
        return (f"python -m stratacl.validate.p2p: {', '.join(costs)}; tiers.{first.tier}.beta_GBps only if "
                f"sane and > {p2p.KEEP_WITHIN:.0%} from conf's sourced value")
    raise ValueError(f"{group}: calibration rows that set no known parameter")


def summary(results: Sequence[tuple[Measured, float, float]]) -> list[tuple[str, str, int, float, float, str]]:
    """(group, role, rows, median |error|, worst |error|, what it sets) per group and role."""
    keys = list(dict.fromkeys((r.group, r.role) for r, _, _ in results))
    out = []
    for g, role in sorted(keys, key=lambda k: ROLES.index(k[1])):
        members = [(r, e) for r, _, e in results if r.group == g and r.role == role]
        errs = [abs(e) for _, e in members]
        out.append((g, role, len(errs), statistics.median(errs), max(errs), sets(g, role, [r for r, _ in members])))
    return out


@dataclass(frozen=True)
class Evaluated:
    """Every Ascend group's (row, harness, error) results."""

    kernels: list[tuple[Row, float, float]]
    p2p: list[tuple[p2p.P2PRow, float, float]]
    moe: list[tuple[MoeRow, float, float]]
    fused: list[tuple[fused.FusedRow, float, float]]
    decode: list[tuple[decode_layer.StreamRow, float, float]]

    @property
    def rates(self) -> list[tuple[Measured, float, float]]:
        """The rows in GB/s beyond the kernel table (the report's figure plots these)."""
        return [*self.p2p, *self.moe]


def evaluate(kernel_results: Sequence[tuple[Row, float, float]], layer: Sequence[decode_layer.OpTime],
             every: bool = False) -> Evaluated:
    """`layer`: the decode-layer breakdown the report already ran; `every` adds the MoE HT rows."""
    return Evaluated([(r, h, e) for r, h, e in kernel_results if r.fabric == FABRIC], p2p.evaluate(p2p.load()),
                     evaluate_moe(load_moe(every=every)),
                     fused.evaluate([r for r in fused.load() if every or r.mode == "ll"]),
                     [(r, r.harness, r.error) for r in decode_layer.stream_rows(layer)])


def section(ev: Evaluated) -> str:
    """The report's CloudMatrix384 section."""
    lines = ["== CloudMatrix384: every Ascend row ==", p2p.series(ev.p2p), "",
             f"{'REFERENCE §5 MoE row (check)':40s} {'convention':20s} {'public':>7s} {'harness':>7s} {'error':>7s}"]
    lines += [f"{r.id:40s} {CONVENTION:20s} {r.measured:7.0f} {h:7.0f} {e:+7.1%}" for r, h, e in ev.moe]
    lines += ["", f"{'CANN fused MoE op row':40s} {'role':9s} {'unit':5s} {'public':>7s} {'harness':>7s} {'error':>7s}"]
    lines += [f"{r.id:40s} {r.role:9s} {r.unit:5s} {r.measured:7.0f} {h:7.0f} {e:+7.1%}" for r, h, e in ev.fused]
    lines += ["", f"{'group':56s} {'role':9s} {'rows':>4s} {'median|err|':>11s} {'worst|err|':>10s}  sets"]
    for results in (ev.kernels, ev.p2p, ev.moe, ev.fused, ev.decode):
        lines += [f"{g:56s} {role:9s} {n:4d} {med:11.1%} {worst:10.1%}  {what}"
                  for g, role, n, med, worst, what in summary(results)]
    if all(r.mode == "ll" for r, _, _ in ev.moe):
        lines.append("(REFERENCE §5 MoE HT rows and the CANN fused normal-kernel rows, 4096 tokens per rank: --operators)")
        lines.append("(every REFERENCE §3/§5 operator row with its target - staging, full mesh vs ring, scaling, core "
                     "partitioning, SDMA offload, interference: --operators)")
    return "\n".join(lines)
