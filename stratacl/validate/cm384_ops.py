"""Every REFERENCE §5 operator row (and §3's two interference rows) as a `RefRow` with a target.

The collective rows are single operators on an idle CloudMatrix384 at REFERENCE §5's microbenchmark
shape (32 ranks = 2 nodes × 8 NPUs × 2 dies unless the row says otherwise; all-gather, the paper's
headline collective), timed by `ascend.collective_s`; a busbw ratio is the inverse time ratio at
equal size. Roles: a row is `calibrate` only when a conf/ parameter was fitted on it (the SDMA and
interference modules say which); every other row is a `check`. Inequalities ("beats by > 30 %",
"leads up to 8 MiB") are rows whose harness value must clear the bound (`RefRow.relation`).

Which libraries stand for the paper's curves (a choice, stated here, not fitted):
- "full-mesh vs ring": HCCL-zerocopy with its algorithm forced to full mesh and to ring (the same
  data path, expansion and cores; only the algorithm differs);
- "StrataCL vs the best baseline": the `stratacl` preset as it chooses, vs the faster of `hccl` and
  `hccl_zerocopy` at each size, the largest ratio over 64 KiB – 16 MiB ("up to 1.6×"); and the same
  lead against `hccl` in AIV expansion mode, since the paper does not say which mode its HCCL ran;
- "full-mesh peak vs ring at scale": StrataCL's faster one-step mesh (full mesh or full mesh with the
  package peer's SIO relay) vs HCCL-zerocopy's own choice at 1 GiB, at 32, 128 and 256 ranks;
- core partitioning: `stratacl_no_partition` (uniform) vs `stratacl_no_sdma` (balanced), full mesh,
  at the paper's policy-generation shape (32-rank 128 MiB all-gather on 24 cores, StrataCL §4.3).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from stratacl.validate import ascend
from stratacl.validate.ascend import MiB, collective_s
from stratacl.validate.reference_rows import TOLERANCE, RefRow

KiB = 1024.0
BASELINES = ("hccl", "hccl_zerocopy")
SMALL_MEDIUM = [64 * KiB * 2**i for i in range(0, 9)]  # 64 KiB .. 16 MiB
MESHES = ("fullmesh", "fullmesh_sio")
SCALES = (32, 128, 256)
LO, HI = -1.0, 1.5  # the figure's error axis


def _ag(lib: str, size: float, algorithm: str = "", ranks: int = ascend.RANKS) -> float:
    return collective_s(lib, "allgather", size, algorithm, ranks)


def _row(rid: str, group: str, target: float, harness: float, what: str, *, relation: str = "=",
         unit: str = "ratio", missing: str = "") -> RefRow:
    return RefRow(rid, group, "check", target, harness, unit, what, missing=missing, relation=relation)


def collective_rows() -> list[RefRow]:
    """REFERENCE §5's collective rows at 32 ranks (and the 32 → 256 scaling row)."""
    out = []
    ring = {s: _ag("hccl_zerocopy", s, "ring") for s in (*SMALL_MEDIUM, 64 * MiB)}
    mesh = {s: _ag("hccl_zerocopy", s, "fullmesh") for s in ring}
    below = [s for s in SMALL_MEDIUM if s < MiB]
    own_mesh = ring[64 * KiB] / _ag("stratacl", 64 * KiB, "fullmesh")
    step_missing = ("the ring's own split is near the paper's (ring_sync_share_64KiB), so the miss is on the mesh "
                    "side: HCCL-zerocopy's full mesh in AI_CPU mode has the AI CPU write ~2 task descriptors per "
                    "peer one after another (~58 µs at the HIXL-calibrated 1.02 µs each), flat up to 8 MiB; "
                    f"against StrataCL's device-driven mesh the same ring reads {own_mesh:.1f}x. Which library "
                    "the paper's mesh curve is, and its per-peer AI CPU cost, are not known")
    out.append(_row("fullmesh_vs_ring_64KiB", "full mesh vs ring", 4.5, ring[64 * KiB] / mesh[64 * KiB],
                    "full-mesh 4.5× ring at 64 KiB (ring synchronisation ≈ 77 % of its time)", missing=step_missing))
    out.append(_row("ring_sync_share_64KiB", "full mesh vs ring", 0.77, ring_sync_share(64 * KiB),
                    "ring synchronisation ≈ 77 % of the ring's time at 64 KiB", unit="fraction"))
    gm = math.exp(sum(math.log(ring[s] / mesh[s]) for s in below) / len(below))
    out.append(_row("fullmesh_vs_ring_below_1MiB", "full mesh vs ring", 2.0, gm,
                    "full-mesh ≈ 2× ring on average below 1 MiB (geometric mean 64-512 KiB)", missing=step_missing))
    out.append(_row("fullmesh_vs_ring_8MiB", "full mesh vs ring", 1.0, ring[8 * MiB] / mesh[8 * MiB],
                    "full-mesh leads up to ≈ 8 MiB", relation=">=",
                    missing="the AI CPU writes the full mesh's per-peer descriptors one after another"))
    out.append(_row("ring_vs_fullmesh_64MiB", "full mesh vs ring", 1.0, mesh[64 * MiB] / ring[64 * MiB],
                    "ring wins above ≈ 16 MiB", relation=">=",
                    missing="HCCL's full mesh at 64 MiB is not port-bound in the harness (per-peer SDMA queues)"))
    lead = max(min(_ag(b, s) for b in BASELINES) / _ag("stratacl", s) for s in SMALL_MEDIUM)
    out.append(_row("stratacl_vs_best_small_medium", "stratacl vs baselines", 1.6, lead,
                    "StrataCL up to 1.6× busbw over the best baseline at small/medium sizes",
                    missing="the best baseline here is HCCL's AllGatherSmallCount (hd_stage: 5 steps of α + flag, "
                            "~4.2 µs each across nodes, after 14 µs of launch); 1.6x would need ~1.6 µs per step, below "
                            "the measured 2.1 µs one-way write, while HCCL's templates ack before each step's data "
                            "(TxAck/RxAck: two one-way latencies) and the ring's sync share is near the paper's. "
                            "Not found on StrataCL's side either: its 14 µs (launch 5 + one α + flag step + descriptor "
                            "writes) has no public absolute figure to check, and pricing its all-gather as pulls "
                            "(REFERENCE §4) moves it < 1 µs under the HIXL get windows"))
    aiv = ("library.hccl.expansion_mode=aiv",)
    aiv_s = ascend.collective_runs("hccl", "allgather", SMALL_MEDIUM, overrides=aiv)
    lead_by_size = {s: t / _ag("stratacl", s) for s, (t, _) in zip(SMALL_MEDIUM, aiv_s, strict=True)}
    lead_aiv = max(lead_by_size.values())
    small_aiv = max(v for s, v in lead_by_size.items() if s < MiB)
    medium_aiv = min(v for s, v in lead_by_size.items() if s >= 2 * MiB)
    out.append(_row("stratacl_vs_hccl_aiv_small_medium", "stratacl vs baselines", 1.6, lead_aiv,
                    "the same lead against HCCL in AIV expansion mode (HCCL_OP_EXPANSION_MODE=AIV: vector cores "
                    "expand and move, no AI CPU descriptor writes), a baseline the paper may have run",
                    missing="which mode the paper's HCCL ran is not stated. Against AIV the lead below 1 MiB is "
                            f"{small_aiv:.2f}x at most (the AI_CPU row's excess there is the AI CPU's serial descriptor "
                            f"writes); from 2 MiB it is {medium_aiv:.1f}x or more in both modes, most of it wire time: HCCL's "
                            "halving-doubling steps (hd_stage) carry every chunk over each die's UB port, StrataCL's one-step "
                            "mesh takes half the remote chunks from its package peer over SIO, so each package's data "
                            "crosses UB once (`workload.breakdown=allgather` prints both). Either that relay saves less "
                            "UB time than priced, or HCCL's medium all-gather shares the package link too; no source "
                            "says which"))
    out.append(_row("zerocopy_vs_stratacl_1GiB", "stratacl vs baselines", 1.06,
                    _ag("stratacl", 1024 * MiB) / _ag("hccl_zerocopy", 1024 * MiB),
                    "at the largest sizes the zerocopy ring is ≈ 6 % ahead of StrataCL"))
    p2p = collective_s("hccl_zerocopy", "p2p", 64 * MiB) / collective_s("stratacl", "p2p", 64 * MiB)
    out.append(_row("p2p_stratacl_vs_zerocopy_64MiB", "stratacl vs baselines", 1.0, p2p,
                    "P2P about equal (64 MiB, 16 inter-node pairs)"))
    for n in SCALES:
        best_mesh = min(_ag("stratacl", 1024 * MiB, m, n) for m in MESHES)
        out.append(_row(f"mesh_vs_ring_peak_{n}ranks", "scaling", 0.9, _ag("hccl_zerocopy", 1024 * MiB, "", n) / best_mesh,
                        f"full-mesh peak within 10 % of ring at {n} ranks (1 GiB all-gather)", relation=">="))
    return out


def ring_sync_share(size: float) -> float:
    """Share of HCCL-zerocopy's ring all-gather (32 ranks, idle) spent in its synchronised steps."""
    phases = ascend.library_model("hccl_zerocopy", "ring").collective_phases("allgather", size, tuple(range(ascend.RANKS)))
    sync = sum(sec for p in phases for cat, sec in (p.parts or ((p.category, p.delay_s),)) if cat == "sync")
    return sync / sum(p.standalone_s() for p in phases)


def partition_rows() -> list[RefRow]:
    """Core partitioning: completion spread 43 % → ≤ 5 %, makespan −19 % (32-rank 128 MiB all-gather)."""
    size, g = 128 * MiB, tuple(range(ascend.RANKS))
    uni = ascend.library_model("stratacl_no_partition", "fullmesh")
    bal = ascend.library_model("stratacl_no_sdma", "fullmesh")
    t_uni, t_bal = _ag("stratacl_no_partition", size, "fullmesh"), _ag("stratacl_no_sdma", size, "fullmesh")
    return [
        _row("core_spread_uniform", "core partitioning", 0.43, uni.op_info("allgather", size, g).core_spread,
             "uniform core groups: fastest-to-slowest core completion spread 43 %", unit="fraction",
             missing="the uniform baseline's layout: the harness deals 31 peers whole to 24 cores (7 cores "
                     "carry two), the paper's baseline split is not described"),
        _row("core_spread_balanced", "core partitioning", 0.05, bal.op_info("allgather", size, g).core_spread,
             "balanced partitioning: spread ≤ 5 %", relation="<=", unit="fraction"),
        _row("core_makespan_change", "core partitioning", -0.19, t_bal / t_uni - 1,
             "balanced partitioning: makespan −19 %", unit="fraction",
             missing="follows the uniform baseline's spread (above): a more uneven baseline gains more"),
    ]


def moe_rows(evaluated: list[tuple[ascend.MoeRow, float, float]]) -> list[RefRow]:
    """REFERENCE §5's EP32 MoE table as `ascend.evaluate_moe` ran it, relative error on GB/s."""
    missing = {
        "deepep": "DeepEP's LL per-expert windows over RDMA priced one start-up each, serialised",
        "cann_ep": "HT: a per-token-copy cost of the fused op's AIVs (quantise, pack, weighted sum) that no "
                   "calibrate row sets (moe_copy_us.*_ht = 0); LL: the paper's CANN EP rows and "
                   "sgl-kernel-npu's (calibrate) disagree at the same shape (dispatch 61 vs 49 GB/s)",
        "cann_ep_zerocopy": "as cann_ep: zerocopy HT runs ~0.75 of Table 1's 137 GB/s write rate in the paper "
                            "(106 GB/s), as StrataCL runs ~0.8 of the 164 GB/s read rate (130): a cost of a "
                            "full token all-to-all (per-copy work or every die sending and receiving at once) "
                            "that pairwise transfers do not show",
        "stratacl": "StrataCL's hierarchical MoE partition (token → expert window → peer window) costs not "
                    "priced; its HT runs ~0.8 of the measured read rate in the paper, as zerocopy runs ~0.75 "
                    "of the write rate",
    }
    return [RefRow(r.id, f"moe {r.mode} ep{r.ep}", "check", r.measured, h, "GB/s",
                   f"{r.library} {r.kind} {r.mode.upper()} busbw (DeepEP logical)", missing=missing.get(r.library, ""))
            for r, h, _ in evaluated]


def helper_rows() -> list[RefRow]:
    """The staging, SDMA-offload and interference rows, from their own modules (each with its calibration)."""
    out: list[RefRow] = []
    for name in ("staging_row", "sdma_row", "interference_row"):
        try:
            mod = __import__(f"stratacl.validate.{name}", fromlist=["rows"])
        except ModuleNotFoundError:
            continue
        rows: Callable[[], list[RefRow]] = mod.rows
        out += rows()
    return out


def rows(moe: list[tuple[ascend.MoeRow, float, float]] | None = None) -> list[RefRow]:
    """Every row; `moe`: the MoE table already evaluated (else run here, HT rows included)."""
    moe = ascend.evaluate_moe(ascend.load_moe(every=True)) if moe is None else moe
    return [*collective_rows(), *partition_rows(), *helper_rows(), *moe_rows(moe)]


def figure(refs: list[RefRow], out: Path) -> Path:
    """Each row's error against its tolerance band, grouped; filled = calibrate, hollow = check."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys(r.group for r in refs))
    fig, ax = plt.subplots(figsize=(7.5, max(4.0, 0.22 * len(refs) + 1)))
    ys: list[int] = []
    labels: list[str] = []
    colours: list[str] = []
    for i, r in enumerate(sorted(refs, key=lambda r: (groups.index(r.group), r.role))):
        c = f"C{groups.index(r.group) % 10}"
        # relative error for GB/s rows, absolute for ratios / fractions: both against ±TOLERANCE
        x = min(max(r.error, LO + 0.02), HI - 0.02)  # off the axis: drawn at its edge as a triangle
        marker = "o" if x == r.error else (">" if r.error > 0 else "<")
        ax.scatter([x], [i], marker=marker, color=c if r.role == "calibrate" else "none", edgecolors=c, s=30)
        ys.append(i)
        labels.append(f"{r.id} ({r.relation}{r.target:g})" if r.relation != "=" else r.id)
        colours.append("k" if r.ok else "red")
    ax.axvspan(-TOLERANCE, TOLERANCE, color="0.9", zorder=0)
    ax.axvline(0, color="k", lw=0.6)
    ax.set_yticks(ys, labels, fontsize=6)
    for tick, colour in zip(ax.get_yticklabels(), colours, strict=True):
        tick.set_color(colour)  # red: off its target
    ax.set_xlabel("error: harness − target (ratios) or harness / target − 1 (GB/s, fractions)")
    ax.set_title("REFERENCE §3/§5 operator rows (shaded: ±0.15; filled: calibrate, hollow: check; red: off)",
                 fontsize=8)
    ax.set_xlim(LO, HI)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out
