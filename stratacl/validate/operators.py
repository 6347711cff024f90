"""Operator-level validation rows: NCCL's and DeepEP's own documented performance.

Two tables in stratacl/data/operators/ (sources per row; README.md there):
- `nccl.csv`: nccl-tests busbw that NVIDIA states or public test plans record on H100 / B200 /
  GB200 NVL72, at the configuration stated (one collective, 8 GiB, the `nccl` preset on the row's
  fabric preset, optionally NCCL_ALGO forced). A row without a number states a relation (the
  default choice beats the forced ring) and is reported as holds / FAILS, outside the medians.
- `deepep.csv`: the DeepEP README's normal (HT) and low-latency (LL) tables at EP 8-64 on H800 + CX7.
  Each (mode, EP) is the `moe` workload run in process (its trace builder and metrics, the `deepep`
  preset on `hgx_h800` grown to 8 nodes, the workload's own warmup/iteration defaults), so the
  numbers are those of `python -m stratacl.run workload=moe ...` with the row's shape.

Every row is a `check` row: no parameter in conf/ is fitted on them (the NCCL and DeepEP constants
come from their sources; REFERENCE.md, conf/library/*.yaml). Each row is compared in its own
bandwidth convention — nccl-tests busbw, DeepEP's logical bandwidth (bytes of token copies a rank
receives / t), DeepEP's internode RDMA bandwidth ((token, node) pairs × bytes / t) — and in time:
NCCL rows' public time is the 8 GiB size over the documented busbw (nccl-tests' factor undone);
DeepEP LL rows state their time; HT rows state a bandwidth only, so their public time is that
bandwidth over the harness's own bytes in the convention (the time ratio then mirrors the
bandwidth error by construction). Error = harness / public − 1 on the bandwidth.
"""

from __future__ import annotations

import csv
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stratacl.comm.library import LibraryModel
    from stratacl.config import RunConfig
    from stratacl.workload_api import WorkloadResult

DATA = Path(__file__).parents[1] / "data" / "operators"
NCCL_TABLE = DATA / "nccl.csv"
DEEPEP_TABLE = DATA / "deepep.csv"
# the DeepEP runs: hgx_h800 (H800 + CX7 400 Gb/s per GPU, as the README's cluster) grown to 64 GPUs
DEEPEP_FABRIC = ("fabric=hgx_h800", "fabric.topology.nodes=8", "fabric.topology.supernodes=8")
# the default report runs a DeepEP normal-kernel row only up to this EP (the EP 32 and 64 runs take
# ~8 s of CPU together, most of the operator rows' cost); `--operators` runs every row
FAST_HT_EP = 16
GROUPS = {"nccl": "nccl-tests busbw (H100/B200/GB200)", "ht": "deepep normal (H800)",
          "ll": "deepep low-latency (H800)"}
NAN = float("nan")


@dataclass(frozen=True)
class OpRow:
    """One public figure. `measured` is in GB/s in `convention`; the harness fills `times` (harness,
    public, µs) and `bandwidths` (every convention the op reports) when it evaluates the row."""

    id: str
    group: str
    role: str
    fabric: str
    convention: str
    measured: float
    source: str
    spec: tuple[tuple[str, str], ...]  # the CSV row (what the harness runs)
    unit: str = "GBps"
    times: tuple[float, float] = (NAN, NAN)
    bandwidths: tuple[tuple[str, float], ...] = ()

    def get(self, key: str) -> str:
        return dict(self.spec)[key]


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        if r["role"] != "check":  # nothing is calibrated on operator rows
            raise ValueError(f"{path}: row {r.get('id') or r['mode'] + r['ep']}: role must be 'check'")
    return rows


def load_nccl(path: Path = NCCL_TABLE) -> list[OpRow]:
    """Numeric rows only; relation rows come from `nccl_relations`."""
    return [OpRow(r["id"], GROUPS["nccl"], r["role"], r["fabric"], "busbw_GBps",
                  float(r["documented_busbw_GBps"]), r["source"], tuple(r.items()))
            for r in _read(path) if r["documented_busbw_GBps"]]


def load_deepep(path: Path = DEEPEP_TABLE, every: bool = True) -> list[OpRow]:
    """`every` False: LL rows and HT rows up to FAST_HT_EP (the default report's fast subset)."""
    out = []
    for r in _read(path):
        if every or r["mode"] == "ll" or int(r["ep"]) <= FAST_HT_EP:
            out.append(OpRow(f"deepep_{r['mode']}_{r['kind']}_ep{r['ep']}", GROUPS[r["mode"]], r["role"],
                             "hgx_h800", r["convention"], float(r["readme_GBps"]), r["source"],
                             tuple(r.items())))
    return out


def load(every: bool = True) -> list[OpRow]:
    return load_nccl() + load_deepep(every=every)


@functools.lru_cache(maxsize=32)
def compose(overrides: tuple[str, ...]) -> RunConfig:
    """The run config the CLI composes for `overrides` (cached: rows share fabrics and runs)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from stratacl.config import to_object
    from stratacl.paths import CONF

    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return to_object(hydra_compose("config", overrides=list(overrides)))


# --------------------------------------------------------------------------- NCCL


@functools.lru_cache(maxsize=16)
def _nccl_library(fabric: str, algos: str = "", extra: tuple[str, ...] = ()) -> LibraryModel:
    from stratacl.comm.library import LibraryModel
    from stratacl.machine.fabric import Fabric

    over = (f"fabric={fabric}", "library=[nccl]", "baseline=nccl", *extra,
            *((f"library.nccl.nccl_algos=[{algos}]",) if algos else ()))
    cfg = compose(over)
    return LibraryModel("nccl", cfg.library["nccl"], Fabric(cfg.fabric))


def nccl_op(fabric: str, coll: str, ranks: int, size: float, algos: str = "",
            extra: tuple[str, ...] = ()) -> tuple[float, float, str]:
    """(time s, busbw GB/s, algorithm) of one `coll` of `size` bytes over `ranks` ranks on an idle
    fabric, the `nccl` preset, as the `collectives` workload times it."""
    from stratacl.engine.replay import simulate
    from stratacl.metrics import busbw_factor
    from stratacl.trace import Trace

    lib = _nccl_library(fabric, algos, extra)
    tr = Trace(world_size=ranks)
    tr.add_family("g", [range(ranks)])
    tr.collective(coll, "g", size)
    res = simulate(tr, lib)
    t = float(res.end[0] - res.start[0])
    return t, size / t / 1e9 * busbw_factor(coll, ranks), lib.chosen_algorithm(coll, size, tuple(range(ranks)))


def _eval_nccl(row: OpRow) -> OpRow:
    from stratacl.metrics import busbw_factor

    coll, n, size = row.get("collective"), int(row.get("ranks")), float(row.get("size_bytes"))
    t, bw, algo = nccl_op(row.fabric, coll, n, size, row.get("nccl_algos"))
    public_t = size * busbw_factor(coll, n) / (row.measured * 1e9)
    return replace(row, times=(t * 1e6, public_t * 1e6), bandwidths=(("algbw_GBps", size / t / 1e9), ("busbw_GBps", bw)),
                   spec=(*row.spec, ("algorithm", algo)))


def nccl_relations(path: Path = NCCL_TABLE) -> list[tuple[str, bool, str]]:
    """(id, holds, statement) per relation row: the default choice is the row's `expect_algorithm`
    (when given) and its busbw beats the forced ring."""
    out = []
    for r in _read(path):
        if r["documented_busbw_GBps"]:
            continue
        args = (r["fabric"], r["collective"], int(r["ranks"]), float(r["size_bytes"]))
        _, bw, algo = nccl_op(*args, r["nccl_algos"])
        _, ring, _ = nccl_op(*args, "ring")
        expect = r.get("expect_algorithm") or ""
        chosen = not expect or algo.startswith(f"nccl:{expect}/")
        what = f"default {bw:.0f} GB/s ({algo}{'' if chosen else f', not {expect}'}) > ring {ring:.0f} GB/s"
        out.append((r["id"], bw > ring and chosen, what))
    return out


# --------------------------------------------------------------------------- DeepEP


def deepep_overrides(spec: dict[str, str], library: str = "deepep") -> tuple[str, ...]:
    """The `workload=moe` overrides of one (mode, EP) row of deepep.csv (bytes per token: the
    dispatch and combine rows of the same mode and EP)."""
    both = {r["kind"]: r["bytes_per_token"] for r in _read(DEEPEP_TABLE)
            if r["mode"] == spec["mode"] and r["ep"] == spec["ep"]}
    tok = "tokens_ht" if spec["mode"] == "ht" else "tokens_ll"
    return (*DEEPEP_FABRIC, "workload=moe", f"library=[{library}]", f"baseline={library}",
            f"workload.ep={spec['ep']}", f"workload.modes=[{spec['mode']}]", f"workload.{tok}={spec['tokens']}",
            f"workload.hidden={spec['hidden']}", f"workload.top_k={spec['top_k']}",
            f"workload.experts={spec['experts']}", f"workload.n_group={spec['n_group']}",
            f"workload.topk_group={spec['topk_group']}",
            f"workload.dispatch_bytes_per_token={both['dispatch']}",
            f"workload.combine_bytes_per_token={both['combine']}")


@functools.lru_cache(maxsize=16)
def run_in_process(workload: str, overrides: tuple[str, ...]) -> WorkloadResult:
    """`workload` run in process on the config `overrides` compose (its libraries, baseline and seed):
    no subprocess, no files."""
    from stratacl.comm.library import LibraryModel
    from stratacl.machine.fabric import Fabric
    from stratacl.workload_api import RunContext
    from stratacl.workload_registry import spec

    cfg = compose(overrides)
    fab = Fabric(cfg.fabric)
    libs = {name: LibraryModel(name, cfg.library[name], fab) for name in cfg.library}
    return spec(workload).run()(RunContext(cfg=cfg, fabric=fab, libraries=libs, baseline=cfg.baseline, seed=cfg.seed))


def moe_metrics(overrides: tuple[str, ...]) -> dict[str, float]:
    """The `moe` workload's metrics for its one library, run in process."""
    (metrics,) = run_in_process("moe", overrides).metrics.values()  # its one library's
    return metrics


MetricsFn = Callable[[tuple[str, ...]], dict[str, float]]
CONVENTIONS = ("algbw_GBps", "busbw_GBps", "deepep_logical_GBps", "deepep_rdma_GBps")


def _eval_deepep(row: OpRow, metrics: MetricsFn, library: str) -> OpRow:
    spec = dict(row.spec)
    m = metrics(deepep_overrides(spec, library))
    key = f"{spec['kind']}_{spec['mode']}"
    t = m[f"{key}_time_us"]
    bws = tuple((c, m.get(f"{key}_{c}", NAN)) for c in CONVENTIONS)
    public_t = float(spec["readme_time_us"]) if spec["readme_time_us"] else t * dict(bws)[row.convention] / row.measured
    return replace(row, times=(t, public_t), bandwidths=bws)


# --------------------------------------------------------------------------- report


def evaluate(rows: list[OpRow], metrics: MetricsFn = moe_metrics,
             library: str = "deepep") -> list[tuple[OpRow, float, float]]:
    """(row with its times and bandwidths, harness value in the row's convention, error) per row.
    DeepEP rows take the `moe` metrics of `library` from `metrics(overrides)` (default: run in
    process; benchmarks/deepep_validation.py --summaries reads them from runs instead)."""
    out = []
    for r in rows:
        done = _eval_nccl(r) if r.group == GROUPS["nccl"] else _eval_deepep(r, metrics, library)
        h = dict(done.bandwidths)[r.convention]
        out.append((done, h, h / r.measured - 1.0))
    return out


def report(results: list[tuple[OpRow, float, float]], relations: Sequence[tuple[str, bool, str]] = ()) -> str:
    from stratacl.validate.kernels import summary

    head = (f"{'operator row (all check)':32s} {'convention':20s} {'public':>7s} {'harness':>7s} {'error':>7s} "
            f"{'t_pub_us':>9s} {'t_harn_us':>9s} {'t_ratio':>7s}  other conventions (GB/s)")
    lines = [head]
    for r, h, e in results:
        tp = r.times[1]
        others = " ".join(f"{c.removesuffix('_GBps')}={v:.0f}" for c, v in r.bandwidths
                          if c != r.convention and not math.isnan(v))
        if r.group == GROUPS["nccl"]:
            others += " " + dict(r.spec)["algorithm"]
        lines.append(f"{r.id:32s} {r.convention:20s} {r.measured:7.0f} {h:7.0f} {e:+7.1%} {tp:9.0f} "
                     f"{r.times[0]:9.0f} {r.times[0] / tp:7.2f}  {others}")
    for rid, holds, text in relations:
        lines.append(f"{rid:32s} relation: {text}: {'holds' if holds else 'FAILS'}")
    lines += ["", f"{'group':40s} {'role':9s} {'rows':>4s} {'median|err|':>11s} {'worst|err|':>10s}"]
    for g, role, n, med, worst in summary(results):
        lines.append(f"{g:40s} {role:9s} {n:4d} {med:11.1%} {worst:10.1%}")
    return "\n".join(lines)
