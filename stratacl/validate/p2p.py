"""UB P2P rows: HIXL's measured one-sided transfers on Atlas A3 against the harness's P2P pricing.

`stratacl/data/operators/hixl_a3.csv` (source, licence and the calibrate/check rule in README.md
there): effective bandwidth of one HIXL `TransferSync` call moving 128 MiB between two dies as
128 MiB / block one-sided transfers, device-to-device (D2rD = write to the remote die, rD2D = read
from it), single machine (the `node` tier) and two machines (`supernode`). Issuers: FabricMem AICPU
unfold (the AI CPU expands the request into transfer tasks: device-issued), FabricMem Host unfold
(the host does, on 4 concurrent streams), HCCS through an HCCL communication domain (HCCL's AI CPU
expansion).

The harness prices the same call as what it is: one P2P operation of 128 MiB (per stream) between
two dies on the row's tier, moved by SDMA with one descriptor per block, a put for D2rD and a get
for rD2D (the SDMA mover's `p2p_op`), the descriptors written by the issuing agent (`trigger` aicpu
for the AI CPU issuers, host: conf/fabric `die.sdma` launch and per-descriptor costs; the host's
streams share its one submission path) while the engines move earlier blocks at the tier's β after
its α, as many blocks in flight as the tier's `in_flight` lets a queue keep (a capped queue waits
the tier's `round_trip_us` per window). Error = harness / public − 1 on the effective bandwidth
(HIXL's convention: bytes / wall time of the call, 10^9 B per GB).

`fit_costs` (`python -m stratacl.validate.p2p`) fits the costs no other source states — the AI
CPU's per-descriptor write and each tier's round trip — on their tier's calibration rows only;
`fit` then frees one tier's β on the same rows at conf's costs (`python -m stratacl.validate
--fit` prints it). α is not identified: one call pays it once per 128 MiB.
"""

from __future__ import annotations

import csv
import functools
import math
from dataclasses import dataclass
from pathlib import Path

from stratacl.validate.kernels import ROLES

TABLE = Path(__file__).parents[1] / "data" / "operators" / "hixl_a3.csv"
FABRIC = "cloudmatrix384"
LIBRARY = "stratacl"  # the preset whose mover is SDMA; its trigger and units are set per row
ISSUERS = {"aicpu": "device-issued (AICPU unfold)", "host": "host-issued (Host unfold, 4 streams)",
           "hccl": "HCCL comm-domain (HCCS)"}
TRIGGER = {"aicpu": "aicpu", "host": "host", "hccl": "aicpu"}  # the harness's agent per issuer
OP = {"D2rD": "put", "rD2D": "get"}  # HIXL's write to / read from the remote die
TIERS = ("node", "supernode")  # single machine, two machines
# the fit keeps the sourced β (StrataCL Table 1) unless it moves it by more than this
KEEP_WITHIN = 0.05
# a fitted β is sane only inside the measured per-die NPU-to-NPU band (2506.12708 Table 1:
# write 135-137, read 164-167 GB/s) widened by KEEP_WITHIN
SANE_GBPS = (135.0 * (1 - KEEP_WITHIN), 167.0 * (1 + KEEP_WITHIN))


@dataclass(frozen=True)
class P2PRow:
    """One HIXL figure (the `Measured` protocol of stratacl.validate.kernels)."""

    id: str
    role: str
    tier: str
    transport: str
    issuer: str
    streams: int
    direction: str
    block_KiB: int
    total_MiB: float
    measured: float
    source: str

    @property
    def group(self) -> str:
        return f"ub p2p {self.tier} {ISSUERS[self.issuer]}"


def load(path: Path = TABLE) -> list[P2PRow]:
    rows = []
    with path.open(newline="") as f:
        for r in csv.DictReader(f):
            row = P2PRow(r["id"], r["role"], r["tier"], r["transport"], r["issuer"], int(r["streams"]), r["direction"],
                         int(r["block_KiB"]), float(r["total_MiB"]), float(r["measured_GBps"]), r["source"])
            if row.role not in ROLES or row.issuer not in ISSUERS or row.tier not in TIERS or not row.source:
                raise ValueError(f"{path}: row {row.id}: role one of {ROLES}, issuer one of {list(ISSUERS)}, "
                                 f"tier one of {TIERS}, and a source")
            rows.append(row)
    return rows


def _overrides(row: P2PRow, knobs: dict[str, float]) -> tuple[str, ...]:
    unit = f"{{node: {row.block_KiB}, supernode: {row.block_KiB}}}"
    return (f"fabric={FABRIC}", f"library=[{LIBRARY}]", f"baseline={LIBRARY}",
            f"library.{LIBRARY}.trigger={TRIGGER[row.issuer]}", f"library.{LIBRARY}.unit_KiB={unit}",
            f"library.{LIBRARY}.p2p_op={OP[row.direction]}",
            *(f"fabric.{k}={v}" for k, v in sorted(knobs.items())))


@functools.lru_cache(maxsize=2048)  # a fit revisits each (row, β) pair
def _call_s(overrides: tuple[str, ...], tier: str, total_bytes: float, streams: int) -> float:
    """Wall time of one call: `streams` P2P ops of total_bytes / streams each, die 0 to the first die
    on `tier`, started together on an idle fabric."""
    from stratacl.comm.library import LibraryModel
    from stratacl.config import TIER_ORDER
    from stratacl.engine.replay import simulate
    from stratacl.machine.fabric import Fabric
    from stratacl.trace import Trace
    from stratacl.validate.operators import compose

    cfg = compose(overrides)
    fab = Fabric(cfg.fabric)
    peer = next(b for b in range(1, fab.world) if int(fab.tier_index(0, b)) == TIER_ORDER.index(tier))
    tr = Trace(world_size=peer + 1)
    ids = [tr.add("p2p", (0, peer), src=(0,), dst=(peer,), nbytes=(total_bytes / streams,), stream=f"s{s}")
           for s in range(streams)]
    res = simulate(tr, LibraryModel(LIBRARY, cfg.library[LIBRARY], fab))
    return float(max(res.end[i] for i in ids) - min(res.start[i] for i in ids))


def harness_GBps(row: P2PRow, knobs: dict[str, float] | None = None) -> float:
    """The row's call in the harness; `knobs` override fabric values (path under `fabric.` -> value)."""
    total = row.total_MiB * 2**20
    return total / _call_s(_overrides(row, knobs or {}), row.tier, total, row.streams) / 1e9


def evaluate(rows: list[P2PRow], knobs: dict[str, float] | None = None) -> list[tuple[P2PRow, float, float]]:
    """(row, harness GB/s, error) per row."""
    out = []
    for r in rows:
        h = harness_GBps(r, knobs)
        out.append((r, h, h / r.measured - 1.0))
    return out


@dataclass(frozen=True)
class TierFit:
    tier: str
    conf_GBps: float  # β in conf/fabric/cloudmatrix384.yaml
    fitted_GBps: float
    rows: int
    rms_log_error: float

    @property
    def sane(self) -> bool:
        return SANE_GBPS[0] <= self.fitted_GBps <= SANE_GBPS[1]

    @property
    def verdict(self) -> str:
        if not self.sane:
            return (f"rejected: outside {SANE_GBPS[0]:.0f}-{SANE_GBPS[1]:.0f} GB/s (2506.12708 Table 1); "
                    "conf keeps its β, the rows are checks")
        if abs(self.fitted_GBps / self.conf_GBps - 1) <= KEEP_WITHIN:
            return f"confirms conf within {KEEP_WITHIN:.0%}: conf keeps its sourced β"
        return "set conf to the fitted β"


def fit(rows: list[P2PRow]) -> list[TierFit]:
    """β of each tier with calibration rows, fitted on those rows only."""
    from scipy.optimize import minimize_scalar

    from stratacl.validate.kernels import fabric_preset

    tiers = dict.fromkeys(r.tier for r in rows if r.role == "calibrate")
    out = []
    for tier in tiers:
        cal = [r for r in rows if r.role == "calibrate" and r.tier == tier]
        fcfg = fabric_preset(FABRIC).cfg
        conf = fcfg.tiers[tier].beta_GBps
        port = fcfg.port_GBps[fcfg.tiers[tier].plane]  # a tier's β cannot exceed its plane's port

        def loss(beta: float, cal: list[P2PRow] = cal, tier: str = tier) -> float:
            return sum(math.log(harness_GBps(r, {f"tiers.{tier}.beta_GBps": round(beta, 2)}) / r.measured) ** 2
                       for r in cal)

        res = minimize_scalar(loss, bounds=(50.0, port), method="bounded", options={"xatol": 0.05})
        out.append(TierFit(tier, conf, float(res.x), len(cal), math.sqrt(float(res.fun) / len(cal))))
    return out


# The per-transfer costs no other source states (data README: CALIBRATED on these rows), each with
# the tier whose calibration rows identify it and its search bounds (µs)
COSTS = {"die.sdma.descriptor_us.aicpu": ("node", (0.1, 5.0)),
         "tiers.node.round_trip_us": ("node", (0.0, 10.0)),
         "tiers.supernode.round_trip_us": ("supernode", (0.0, 10.0))}
PASSES = 2  # coordinate descent: the node costs interact (a small block pays the larger of the two)


@dataclass(frozen=True)
class CostFit:
    knob: str  # path under conf/fabric/cloudmatrix384.yaml
    conf: float
    fitted: float
    rows: int
    rms_log_error: float


def _conf(knob: str) -> float:
    from omegaconf import OmegaConf

    from stratacl.validate.kernels import fabric_preset

    return float(OmegaConf.select(OmegaConf.structured(fabric_preset(FABRIC).cfg), knob))


def fit_costs(rows: list[P2PRow]) -> list[CostFit]:
    """Each cost of COSTS fitted on its tier's calibration rows only (least squares on the log error),
    the others held at their latest value; β stays at conf."""
    from scipy.optimize import minimize_scalar

    knobs = {k: _conf(k) for k in COSTS}
    cal = {t: [r for r in rows if r.role == "calibrate" and r.tier == t] for t in TIERS}
    fun = dict.fromkeys(COSTS, 0.0)
    for _ in range(PASSES):
        for knob, (tier, bounds) in COSTS.items():
            if not cal[tier]:
                continue

            def loss(v: float, knob: str = knob, tier: str = tier) -> float:
                trial = {**knobs, knob: round(v, 3)}
                return sum(math.log(harness_GBps(r, trial) / r.measured) ** 2 for r in cal[tier])

            res = minimize_scalar(loss, bounds=bounds, method="bounded", options={"xatol": 0.005})
            knobs[knob], fun[knob] = round(float(res.x), 3), float(res.fun)
    return [CostFit(k, _conf(k), knobs[k], len(cal[t]), math.sqrt(fun[k] / len(cal[t])))
            for k, (t, _) in COSTS.items() if cal[t]]


def series(results: list[tuple[P2PRow, float, float]]) -> str:
    """One line per (tier, issuer, direction): public / harness GB/s at each block size."""
    keys = list(dict.fromkeys((r.tier, r.issuer, r.direction) for r, _, _ in results))
    blocks = sorted({r.block_KiB for r, _, _ in results})
    lines = [f"{'ub p2p series (public/harness GB/s, * = calibrate)':44s} "
             + " ".join(f"{(str(b) + 'K') if b < 1024 else str(b // 1024) + 'M':>11s}" for b in blocks)]
    for tier, issuer, direction in keys:
        cells = {r.block_KiB: f"{r.measured:.0f}/{h:.0f}{'*' if r.role == 'calibrate' else ' '}"
                 for r, h, _ in results if (r.tier, r.issuer, r.direction) == (tier, issuer, direction)}
        lines.append(f"{tier + ' ' + issuer + ' ' + direction:44s} " + " ".join(f"{cells.get(b, ''):>11s}" for b in blocks))
    return "\n".join(lines)


def main() -> int:
    """`python -m stratacl.validate.p2p`: the calibrated costs, then each tier's β at them (the same
    lines `python -m stratacl.validate --fit` prints among its fits)."""
    from stratacl.validate.kernels import main as validate_main

    return validate_main(["--fit"])


if __name__ == "__main__":
    raise SystemExit(main())
