"""Validation report: the harness against public kernel-level and operator-level measurements.

`python -m stratacl.validate [--out fig.png] [--table path.csv] [--fit] [--operators]` runs every row of the
shipped table (stratacl/data/kernels/validation.csv; sources, licences and the rule that chose
each row's role in stratacl/data/kernels/README.md) through the lowering the replay uses
(`stratacl.machine.compute.ComputeLowering` on the row's fabric preset from conf/fabric): one compute op
per row with the row's kernel class, format, GEMM shapes, FLOPs and HBM bytes, alone on the die.
It prints harness vs public per row with the error, then the median and worst |error| per group,
calibration rows and check rows apart (a calibration row's error proves little: the parameter was
fitted on it), and draws harness against measured, log-log, one marker per group, with y = x.

The harness value is the row's FLOPs (TFLOPS rows) or bytes (GB/s rows) over the kernel's device
time alone — max(compute part, memory part) + ramp — without the launch, which the sources'
device-side timers do not see. Error = harness / public − 1.

`--fit` (needs scipy) refits the free parameters of each calibrated class on its calibration rows
only and prints them (what conf/fabric/*.yaml cites); it never reads check rows.

Then the decode-layer check rows (stratacl/validate/decode_layer.py): CloudMatrix-Infer's ≈ 600 µs
per micro-batch per layer on each of its two decode streams against the harness's
`+experiment=cloudmatrix_infer` decode step, op by op (`--decode-layer RUN_DIR` reads a saved run).

Below them come the operator rows (stratacl/validate/operators.py: NCCL's documented nccl-tests
busbw, DeepEP's README tables), every one a check row, each in its own bandwidth convention and in
time. The default runs the fast ones (every NCCL row, DeepEP low-latency rows, normal rows up to
EP 16: 4 s of CPU, 12 s wall on a loaded 2-core machine); `--operators` adds DeepEP's normal rows at
EP 32 and 64 (12 s of CPU in all, 35 s wall there).

Last, the CloudMatrix384 section (stratacl/validate/ascend.py): every Ascend row in one place - the
910C kernel groups, UB P2P (HIXL), REFERENCE §5's MoE table, the decode layer -
with each group's median and worst |error| and what it sets; `--operators` adds the MoE HT rows
and the table of every REFERENCE §3/§5 operator row with its target (stratacl/validate/cm384_ops.py:
calibrate rows first, a row off its target naming the mechanism believed missing), drawn beside the
main figure as `<out>_reference_rows.png`.
`--fit` also refits the UB tiers' β on the HIXL calibration rows (stratacl/validate/p2p.py).
"""

from __future__ import annotations

import argparse
import csv
import functools
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

from stratacl.machine.compute import ComputeLowering
from stratacl.machine.fabric import Fabric
from stratacl.trace import Op
from stratacl.vocab import OpKind, PhaseCategory

TABLE = Path(__file__).parents[1] / "data" / "kernels" / "validation.csv"
ROLES = ("calibrate", "check")
UNITS = {"TFLOPS": 1e12, "GBps": 1e9}


class Measured(Protocol):
    """What the figure plots of a row (this table's Row, validate_ops.OpRow)."""

    @property
    def group(self) -> str: ...
    @property
    def role(self) -> str: ...
    @property
    def measured(self) -> float: ...


@dataclass(frozen=True)
class Row:
    id: str
    group: str
    role: str
    fabric: str
    kernel: str
    format: str
    core: str
    gemms: tuple[tuple[int, int, int, int], ...]
    flops: float
    hbm_bytes: float
    measured: float
    unit: str
    source: str
    note: str = ""


def _gemm(text: str) -> tuple[int, int, int, int]:
    """One "MxNxKxC" entry of the gemms column."""
    m, n, k, c = (int(x) for x in text.split("x"))
    return m, n, k, c


def load_table(path: str | Path = TABLE) -> list[Row]:
    rows = []
    with Path(path).open(newline="") as f:
        for r in csv.DictReader(f):
            gemms = tuple(_gemm(g) for g in r["gemms"].split(";") if g)
            row = Row(r["id"], r["group"], r["role"], r["fabric"], r["kernel"], r["format"], r["core"],
                      gemms, float(r["flops"]), float(r["hbm_bytes"]), float(r["measured"]), r["unit"],
                      r["source"], r.get("note", ""))
            if row.role not in ROLES or row.unit not in UNITS:
                raise ValueError(f"{path}: row {row.id}: role must be one of {ROLES}, unit one of {list(UNITS)}")
            rows.append(row)
    return rows


@functools.lru_cache(maxsize=8)
def fabric_preset(name: str) -> Fabric:
    """The fabric of conf/fabric/<name>.yaml, composed as the CLI composes it."""
    from hydra import compose, initialize_config_dir

    from stratacl.config import to_object
    from stratacl.paths import CONF

    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = to_object(compose("config", overrides=[f"fabric={name}"]))
    return Fabric(cfg.fabric)


def row_op(row: Row) -> Op:
    return Op(id=0, kind=OpKind.compute.value, ranks=(0,), name=row.id, flops=(row.flops,), hbm_bytes=(row.hbm_bytes,),
              core=row.core, dtype=row.format, kernel=row.kernel, gemms=row.gemms)


def harness_time(row: Row, fabric: Fabric) -> float:
    """Device time of the row's kernel alone, from the phases the replay would run (no launch)."""
    phases = ComputeLowering(fabric).lower(row_op(row))
    return sum(p.standalone_s() for p in phases if p.category != PhaseCategory.launch)


def harness_value(row: Row, fabric: Fabric | None = None) -> float:
    t = harness_time(row, fabric or fabric_preset(row.fabric))
    work = row.flops if row.unit == "TFLOPS" else row.hbm_bytes
    return work / t / UNITS[row.unit]


M = TypeVar("M", bound=Measured)


def with_errors(rows: Sequence[M], value: Callable[[M], float]) -> list[tuple[M, float, float]]:
    """(row, harness value, error = harness / public − 1) per row; `value` gives the harness's figure."""
    out = []
    for r in rows:
        h = value(r)
        out.append((r, h, h / r.measured - 1.0))
    return out


def evaluate(rows: list[Row]) -> list[tuple[Row, float, float]]:
    """(row, harness value, error = harness / public − 1) per row."""
    return with_errors(rows, harness_value)


def summary(results: Sequence[tuple[Measured, float, float]]) -> list[tuple[str, str, int, float, float]]:
    """(group, role, rows, median |error|, worst |error|) per group and role."""
    keys = sorted({(r.group, r.role) for r, _, _ in results}, key=lambda k: (k[0], ROLES.index(k[1])))
    out = []
    for g, role in keys:
        errs = [abs(e) for r, _, e in results if r.group == g and r.role == role]
        out.append((g, role, len(errs), statistics.median(errs), max(errs)))
    return out


# the kernels a training step runs, at training shapes (issue 36): its matmuls in BF16, the fused
# attention forward and backward; the "training kernels" lines of the report pool their rows
TRAINING_GROUPS = ("h100 bf16 gemm (training shapes)", "h800 bf16 attention_prefill", "h100 bf16 attention_backward",
                   "h100 elementwise (compiled Triton)", "h100 elementwise (eager ATen)")


def report(results: list[tuple[Row, float, float]]) -> str:
    lines = [f"{'row':48s} {'role':9s} {'unit':6s} {'public':>8s} {'harness':>8s} {'error':>7s}"]
    for r, h, e in results:
        lines.append(f"{r.id:48s} {r.role:9s} {r.unit:6s} {r.measured:8.0f} {h:8.0f} {e:+7.1%}")
    lines += ["", f"{'group':40s} {'role':9s} {'rows':>4s} {'median|err|':>11s} {'worst|err|':>10s}"]
    for g, role, n, med, worst in summary(results):
        lines.append(f"{g:40s} {role:9s} {n:4d} {med:11.1%} {worst:10.1%}")
    for role in ROLES:
        errs = [abs(e) for r, _, e in results if r.role == role]
        if errs:
            lines.append(f"{'all ' + role + ' rows':40s} {role:9s} {len(errs):4d} "
                         f"{statistics.median(errs):11.1%} {max(errs):10.1%}")
    for role in ROLES:
        errs = [abs(e) for r, _, e in results if r.role == role and r.group in TRAINING_GROUPS]
        if errs:
            lines.append(f"{'training kernels':40s} {role:9s} {len(errs):4d} "
                         f"{statistics.median(errs):11.1%} {max(errs):10.1%}")
    lines.append("  training kernels = " + "; ".join(TRAINING_GROUPS))
    return "\n".join(lines)


def figure(results: Sequence[tuple[Measured, float, float]], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 6))
    markers = "osD^v<>ph*X"
    groups = list(dict.fromkeys(r.group for r, _, _ in results))
    for i, g in enumerate(groups):
        for role, fill in (("calibrate", True), ("check", False)):
            pts = [(r.measured, h) for r, h, _ in results if r.group == g and r.role == role]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.scatter(xs, ys, marker=markers[i % len(markers)], s=40, label=f"{g} ({role})",
                           facecolors=f"C{i}" if fill else "none", edgecolors=f"C{i}")
    vals = [v for r, h, _ in results for v in (r.measured, h)]
    lo, hi = min(vals) / 1.5, max(vals) * 1.5
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="y = x")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="public measurement (TFLOPS or GB/s)",
           ylabel="harness (same unit)", title="Harness vs public kernel and operator measurements")
    from matplotlib.ticker import NullFormatter

    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out


# --------------------------------------------------------------------------- fitting

# what --fit frees per (fabric, kernel class); everything else stays as conf/ says
FREE = {
    ("hgx_h800", "gemm"): ("compute_fraction.fp8", "hbm_fraction", "k_fill", "fill_us"),
    ("hgx_h800", "grouped_gemm"): ("compute_fraction.fp8", "hbm_fraction", "k_fill", "fill_us"),
    # XLA's BF16 table (cuBLAS dots): the BF16 fraction only; the ramp and per-tile fill stay the
    # FP8 DeepGEMM fit's (one gemm class per die), which the small-shape check group tests
    ("hgx_h100", "gemm"): ("compute_fraction.bf16",),
    ("hgx_h800", "attention_prefill"): ("compute_fraction.bf16", "k_fill"),
    # FA3's backward figures rise with the sequence (fixed work per key block): the per-block
    # walk fill with the fraction and the per-tile fill
    ("hgx_h100", "attention_backward"): ("compute_fraction.bf16", "k_fill", "walk_fill"),
    # Liger-Kernel's element-wise forward rows: memory-bound at every size, rising to a plateau
    # (a per-kernel ramp beside the achieved HBM rate), one pair per class (Triton, eager ATen)
    ("hgx_h100", "elementwise_compiled"): ("hbm_fraction", "fill_us"),
    ("hgx_h100", "elementwise_eager"): ("hbm_fraction", "fill_us"),
    ("hgx_h800", "attention_decode"): ("compute_fraction.bf16", "hbm_fraction"),
    # Table 10's rows are all compute-bound ms-long kernels at two k: they identify the INT8
    # fraction and the per-tile fill, not hbm_fraction or a µs ramp
    ("cloudmatrix384", "grouped_gemm"): ("compute_fraction.int8", "k_fill"),
    ("cloudmatrix384", "attention_decode"): ("compute_fraction.bf16", "hbm_fraction"),
}


def _with(fabric: Fabric, kernel: str, values: dict[str, float]) -> Fabric:
    """A copy of `fabric` whose kernel class `kernel` takes `values`."""
    import copy

    from stratacl.machine.kernel_model import KernelModel

    cfg = copy.deepcopy(fabric.cfg)
    kc = cfg.die.kernel.classes[kernel]
    for key, v in values.items():
        if key.startswith("compute_fraction."):
            kc.compute_fraction = {**kc.compute_fraction, key.split(".", 1)[1]: v}
        else:
            change: dict[str, Any] = {key: v}
            kc = replace(kc, **change)
    cfg.die.kernel.classes[kernel] = kc
    fab = copy.copy(fabric)
    fab.cfg = cfg
    fab._kernel_model = KernelModel(cfg.die.kernel, fab.cube_cores, fab.vector_cores, fab.hbm_Bps)
    return fab


def fit(rows: list[Row]) -> dict[tuple[str, str], dict[str, float]]:
    """Least squares on log(harness / public) over each class's CALIBRATION rows only."""
    import numpy as np
    from scipy.optimize import minimize

    out = {}
    for (fab_name, kernel), names in FREE.items():
        cal = [r for r in rows if r.role == "calibrate" and r.fabric == fab_name and r.kernel == kernel
               and "other kernel" not in r.group]
        if not cal:
            continue
        base = fabric_preset(fab_name)
        def loss(x: np.ndarray, names: tuple[str, ...] = names, cal: list[Row] = cal, base: Fabric = base,
                 kernel: str = kernel) -> float:
            vals = {n: float(v) for n, v in zip(names, x, strict=True)}
            # fractions in (0, 1]; k_fill and fill_us ≥ 0
            if any(v < 0 or ("fraction" in n and not 0 < v <= 1.0) for n, v in vals.items()):
                return 1e9
            fab = _with(base, kernel, vals)
            return float(sum(np.log(harness_value(r, fab) / r.measured) ** 2 for r in cal))

        x0 = np.array([{"k_fill": 64.0, "fill_us": 2.0, "walk_fill": 2.0}.get(n, 0.7) for n in names])
        res = minimize(loss, x0, method="Nelder-Mead", options={"xatol": 1e-4, "fatol": 1e-8, "maxiter": 4000})
        out[(fab_name, kernel)] = {n: float(v) for n, v in zip(names, res.x, strict=True)} | {
            "rms_log_error": float(np.sqrt(res.fun / len(cal))), "calibration_rows": len(cal)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stratacl.validate", description=__doc__.split("\n")[0])
    ap.add_argument("--table", type=Path, default=TABLE, help="validation table (CSV)")
    ap.add_argument("--out", type=Path, default=Path("validation.png"), help="figure path (PNG)")
    ap.add_argument("--fit", action="store_true", help="refit the calibrated parameters on calibration rows")
    ap.add_argument("--decode-layer", type=Path, metavar="RUN_DIR",
                    help="the decode-layer check from a saved cloudmatrix_infer run (output.trace=true) "
                    "instead of simulating it")
    ap.add_argument("--operators", action="store_true",
                    help="every operator row (adds DeepEP's normal kernels at EP 32-64, ~8 s more CPU)")
    ap.add_argument("--trust", action="store_true",
                    help="also write every group's errors to stratacl/data/validation/trust.json (the run "
                    "report prints the run's fabric's check groups from it)")
    args = ap.parse_args(argv)
    try:
        rows = load_table(args.table)
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.fit:
        for (fab_name, kernel), vals in fit(rows).items():
            print(f"{fab_name} {kernel}: " + ", ".join(f"{k}={v:.4g}" for k, v in vals.items()))
        from stratacl.validate import p2p

        try:
            hixl = p2p.load()
        except (OSError, ValueError, KeyError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        from stratacl.validate import fused

        for knob, v in fused.fit(fused.load()).items():
            print(f"{fused.FABRIC} library.{fused.LIBRARY}.moe_copy_us.{knob}: {v:.3g} us per token copy "
                  "(calibration rows of cann_fused_a3.csv)")
        for c in p2p.fit_costs(hixl):
            print(f"{p2p.FABRIC} {c.knob}: conf {c.conf:.4g}, fitted {c.fitted:.4g} on {c.rows} calibration rows "
                  f"(rms log error {c.rms_log_error:.3g})")
        for f in p2p.fit(hixl):
            print(f"{p2p.FABRIC} tiers.{f.tier}.beta_GBps: conf {f.conf_GBps:.4g}, fitted {f.fitted_GBps:.4g} on "
                  f"{f.rows} calibration rows (rms log error {f.rms_log_error:.3g}): {f.verdict}")
        return 0
    results = evaluate(rows)
    print(report(results))
    from stratacl.errors import HarnessError
    from stratacl.validate import decode_layer

    try:
        step = decode_layer.saved_decode(args.decode_layer) if args.decode_layer else decode_layer.simulated_decode()
        layer = decode_layer.breakdown(*step)
    except (OSError, ValueError, KeyError, HarnessError) as exc:
        print(f"error: decode layer: {exc}", file=sys.stderr)
        return 2
    print("\n" + decode_layer.report(layer, decode_layer.hbm_range(*step)))
    print(decode_layer.skew_note(step[0]))
    from stratacl.validate import operators as validate_ops

    ops = validate_ops.evaluate(validate_ops.load(every=args.operators))
    print("\n" + validate_ops.report(ops, validate_ops.nccl_relations()))
    if not args.operators:
        print(f"(DeepEP normal rows above EP {validate_ops.FAST_HT_EP}: --operators)")
    from stratacl.validate import ascend

    try:
        cm384 = ascend.evaluate(results, layer, every=args.operators)
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: CloudMatrix384 rows: {exc}", file=sys.stderr)
        return 2
    print("\n" + ascend.section(cm384))
    refs = []
    if args.operators:
        from stratacl.validate import cm384_ops, reference_rows

        refs = cm384_ops.rows(cm384.moe)
        print("\n== REFERENCE §3/§5 operator rows (calibrate rows first; ratios within 0.15, GB/s within 15 %) ==")
        print(reference_rows.table(refs))
    if args.trust:
        from stratacl.validate import trust
        from stratacl.validate.ascend import FABRIC as CM384

        entries = [*trust.groups(results, "kernels"), *trust.groups(ops, "operators")]
        for part in (cm384.p2p, cm384.moe, cm384.fused, cm384.decode,
                     [(r, r.harness, r.error) for r in refs]):  # a ratio row's error is absolute
            entries += trust.groups(part, "cloudmatrix384", CM384)
        print(f"trust: {trust.write(entries, args.operators)}")
    try:
        print(f"\nfigure: {figure([*results, *ops, *cm384.rates], args.out)}")
        if refs:
            print(f"figure: {cm384_ops.figure(refs, args.out.with_name(args.out.stem + '_reference_rows.png'))}")
    except ImportError:
        print("\nfigure skipped: needs matplotlib (pip install matplotlib)")
    return 0

