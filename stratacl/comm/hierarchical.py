"""HCCL's algorithms as HCCL runs them on Atlas A3 (910_93, CloudMatrix384): hierarchical
collectives, the grouped direct full-mesh all-to-all, and HCCL's selection rules.

A hierarchical plan is a sequence of *stages* (WirePlan.stages) that run one after another, each a
plan over a sub-communicator: level 0 inside a server (the 16 dies of a node), level 1 between
servers (dies with the same local index). Composition (HCCL docs, hierarchical_comm_principle.md
and the 910_93 executors):
  allgather      level 1 AG of the per-rank chunk, then level 0 AG of the server block
                 (coll_all_gather_ring_for_910_93_executor.cc KernelRun: level2 → level1 → level0)
  reducescatter  level 1 RS of the whole buffer, then level 0 RS of the server block
  allreduce      level 0 RS, level 1 AR of 1/k of the buffer, level 0 AG
  broadcast      level 0 scatter, level 1 broadcast of 1/k, level 0 AG
With level-1 `pipeline` the level-0 and level-1 transfers overlap (one phase, shared ports).

Level 0 on A3 is a *double ring* when every die's SIO partner is in the communicator
(alg_configurator.cc SetAlgoLevel0StandardCard: NP_DOUBLE_RING if HCCS_SW links = (d−2)·d and SIO
links = d): ring 0 visits the dies in order, ring 1 in reverse (topo_info_extractor.cc
GetRingsOrderByTopoType), each with half the data, so each die sends one half over its SIO link and
the other over UB. Level 1 is ring, NHR (⌈log2 m⌉ steps, nearest partner carries most data, NHR.md),
NB (Bruck, ⌈log2 m⌉ steps) or RHD.

Sources: HCCL open source. Rules: HongminTan/ACNC2025-HCCL@f85b7e6 (a CANN 2025 snapshot of
cann/hccl), src/domain/collective_communication/algorithm/impl/operator/*_operator.cc
`SelectAlgfor91093`, impl/alg_configurator.cc `GetDefaultAlgoLevel1V1`, pub_inc/hccl_aiv.h and
pub_inc/common.h (thresholds), coll_executor/coll_all_to_all/ (direct full-mesh) and
base/alg_template/temp_alltoallv/alltoallv_direct_fullmesh.cc (rounds of concurrent SDMA peers,
ALLTOALLV_DIRECT_FULLMESH_SDMA_CONCURRENT_SIZE = 8; 16 in CANN 8.0, zhuxy-USTC/HCCL@3a845e5).
Cost models: hicann/hccl docs/zh/user_guide/coll_algo_intro/{Ring,NHR,Mesh,RHD}.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from stratacl.comm import algorithms as alg
from stratacl.config import HcclLevel1, Plane
from stratacl.machine.fabric import Fabric, Tier
from stratacl.memory.allocator import KiB, MiB

# --- HCCL constants (pub_inc/common.h, pub_inc/hccl_aiv.h, ACNC2025-HCCL@f85b7e6) -------------
SMALL_COUNT_256_KB = 256 * KiB
SMALL_COUNT_512_KB = 512 * KiB
SMALL_COUNT_1_MB = 1 * MiB
MEMSIZE_HD_FACTOR = 4
INTER_SERVER_RING_MAX_SERVERS = 8  # HCCL_INTER_SERVER_RING_ALGO_MAX_SUPPORT_SERVER_NUM
AIV_ALL_REDUCE_A3_ENTRY = 1 * MiB
AIV_ALL_GATHER_A3_ENTRY = 512 * KiB
AIV_REDUCE_SCATTER_A3_ENTRY = 1 * MiB
AIV_ALL_TO_ALL_A3_ENTRY = 512 * KiB
# cross-node AIV entry sizes by rank count: (max ranks, max bytes), MAX_BLOCK_DIM = 48 → 1/8, 1/3
AIV_AG_CROSSNODE = ((6, 1 * MiB), (16, 512 * KiB), (10**9, 32 * KiB))
AIV_RS_CROSSNODE = ((6, 1 * MiB), (16, 512 * KiB), (10**9, 128 * KiB))
DIRECT_FULLMESH_CONCURRENT = 8  # SDMA peers per round (alltoallv_direct_fullmesh.cc, 2025)

LEVEL1 = tuple(a.value for a in HcclLevel1 if a not in (HcclLevel1.pairwise, HcclLevel1.auto))


@dataclass(frozen=True, slots=True)
class HcclChoice:
    """What HCCL's selector picks: an executor and the algorithms it runs."""

    executor: str  # HCCL executor name (for the record)
    level0: str = ""  # double_ring | ring | mesh ("" = no server split)
    level1: str = ""  # ring | nhr | nb | rhd | pipeline
    flat: str = ""  # one-level algorithm over all ranks: nhr | rhd | hd_stage | mesh | direct_fullmesh | pairwise

    @property
    def label(self) -> str:
        if self.flat:
            return f"hccl:{self.flat}"
        return f"hccl:{self.level0}+{self.level1}" if self.level1 else f"hccl:{self.level0}"


# ---------------------------------------------------------------------------- topology
def split_servers(tidx: np.ndarray) -> tuple[list[list[int]], bool] | None:
    """Group-local members per server (tier ≤ 1 = same node), and whether every member's SIO
    partner (tier 0) is in the group. None when servers hold different numbers of members."""
    n = tidx.shape[0]
    seen = np.zeros(n, dtype=bool)
    servers: list[list[int]] = []
    for i in range(n):
        if not seen[i]:
            members = [int(j) for j in np.flatnonzero(tidx[i] <= 1)]
            seen[members] = True
            servers.append(members)
    if len({len(s) for s in servers}) != 1:
        return None
    paired = bool(all(((tidx[i] == 0).sum() >= 2) for i in range(n)))  # itself + its SIO partner
    return servers, paired


def default_level1(m: int) -> str:
    """GetDefaultAlgoLevel1V1: ≥ 8 servers or a power of two → HD, otherwise ring; HD becomes NHR
    on 910_93 (alg_configurator.cc)."""
    if m >= INTER_SERVER_RING_MAX_SERVERS:
        return "nhr"
    return "ring" if (m & (m - 1)) or m == 1 else "nhr"


# ---------------------------------------------------------------------------- selection

def _aiv_mesh(op: str, aiv: bool, n: int, m: int, chunk: float, crossnode: tuple[tuple[int, int], ...], entry: float) -> HcclChoice | None:
    """AIV one-shot mesh executors of all-gather / reduce-scatter (SelectAlgfor91093): the
    cross-node variant under its (ranks, chunk) table, the single-node one under its entry size."""
    if not aiv:
        return None
    if m > 1 and any(n <= r and chunk <= b for r, b in crossnode):
        return HcclChoice(f"{op}MeshAivFor91093Executor", flat="mesh")
    if m == 1 and chunk <= entry:
        return HcclChoice(f"{op}MeshAivExecutor", flat="mesh")
    return None

def select(coll: str, size: float, n: int, servers: int, per_server: int, paired: bool,
           aiv: bool = False, zerocopy: bool = False, configured: str = "auto",
           ccl_bytes: float = 200 * MiB, rules: bool = True) -> HcclChoice:
    """HCCL's choice for one op inside one supernode (SelectAlgfor91093, op-base mode).

    `size` is the nccl-tests size S; HCCL's `dataSize` is count × type: the per-rank chunk S/n for
    allgather / reducescatter / alltoall, the buffer S for allreduce / broadcast. `configured` is
    HCCL_ALGO's level-1 choice for this op ("auto" = adaptive; "pairwise" for alltoall).
    """
    m, d = servers, per_server
    l0 = "double_ring" if paired and d > 1 else "ring"
    level1 = configured if configured in LEVEL1 else default_level1(m)
    if level1 == "rhd" and coll in ("allreduce", "allgather", "reducescatter"):
        level1 = "nhr"  # 910_93 supports ring, NB and NHR between servers (operator warnings)
    if coll in ("broadcast",) and level1 not in ("nhr", "nb"):
        level1 = "nhr"  # broadcast_operator.cc: scatter/broadcast support only NHR/NB
    chunk = size / n
    if not rules:
        return HcclChoice("hierarchical", level0=l0, level1=level1 if m > 1 else "")
    if coll in ("alltoall", "alltoallv", "dispatch", "combine"):
        if aiv and ((m == 1 and chunk <= AIV_ALL_TO_ALL_A3_ENTRY) or m > 1):
            return HcclChoice("AlltoAllMeshAivExecutor", flat="mesh")  # IsSatisfyAlltoAllAivCondition
        if configured == "pairwise":
            return HcclChoice("RunAlltoAllVStaged", flat="pairwise")
        return HcclChoice("RunAlltoAllDirectFullmesh", flat="direct_fullmesh")
    if coll == "allgather":
        choice = _aiv_mesh("AllGather", aiv, n, m, chunk, AIV_AG_CROSSNODE, AIV_ALL_GATHER_A3_ENTRY)
        if choice:
            return choice
        dma_limit = ccl_bytes * 4 < size  # SmallCountOptimMultiServer: d % 4 == 0 case
        if (m == 1 and chunk <= SMALL_COUNT_512_KB and d > 2) or (
                m > 1 and d > 2 and d % 4 == 0 and chunk * m <= SMALL_COUNT_1_MB and not dma_limit) or (
                m > 1 and d > 2 and d % 4 != 0 and chunk * m <= SMALL_COUNT_512_KB and not dma_limit):
            return HcclChoice("AllGatherSmallCount", flat="hd_stage")
    elif coll == "allreduce":
        if aiv and m == 1 and size / d <= AIV_ALL_REDUCE_A3_ENTRY:
            return HcclChoice("AllReduceMeshAivExecutor", flat="mesh")
        if m > 1 and d > 2 and size <= SMALL_COUNT_1_MB * d:
            return HcclChoice("AllReduceComm", flat="nhr")  # smallCountOptimMultiServer: NHR over all
        if m == 1 and d > 2 and size <= SMALL_COUNT_512_KB * n and size <= ccl_bytes / MEMSIZE_HD_FACTOR:
            return HcclChoice("AllReduceMeshSmallCountExecutor", level0="mesh")
    elif coll == "reducescatter":
        choice = _aiv_mesh("ReduceScatter", aiv, n, m, chunk, AIV_RS_CROSSNODE, AIV_REDUCE_SCATTER_A3_ENTRY)
        if choice:
            return choice
        pow2 = n & (n - 1) == 0
        dma_limit = pow2 and ccl_bytes * 2 < size
        if m > 1 and d > 2 and not pow2 and chunk <= SMALL_COUNT_256_KB:
            return HcclChoice("ReduceScatterComm", flat="rhd")
        if (m == 1 and d > 2 and chunk <= SMALL_COUNT_512_KB and not dma_limit) or (
                m > 1 and d > 2 and pow2 and chunk * m <= SMALL_COUNT_1_MB and not dma_limit):
            return HcclChoice("ReduceScatterDeterExecutor", flat="hd_stage")
    names = {"allgather": "AllGather", "allreduce": "AllReduce", "reducescatter": "ReduceScatter",
             "broadcast": "BroadCast"}
    base = names.get(coll, coll)
    if zerocopy and coll in ("allgather", "allreduce", "reducescatter"):
        executor = f"{base}RingZerocopyExecutor"
    elif l0 == "double_ring" and coll != "broadcast":
        executor = f"Aligned{base}DoubleRingFor91093Executor"
    else:
        executor = f"{base}RingFor91093Executor"
    return HcclChoice(executor, level0=l0, level1=level1 if m > 1 else "")


# ---------------------------------------------------------------------------- level plans
def rings(coll: str, n: int, size: float, tidx: np.ndarray, fabric: Fabric, plane: Plane,
          orders: list[list[int]], name: str) -> alg.WirePlan:
    """Several lockstep rings at once, each moving an equal share of the data; ring r paces at its
    slowest hop, and a die's port carries, per ring, its own hop's share at that pace."""
    share = size / len(orders)
    chunk = share / n
    if coll == "allreduce":
        steps, nbytes = 2 * (n - 1), 2 * (n - 1) * chunk
    elif coll in ("allgather", "reducescatter", "scatter"):
        steps, nbytes = n - 1, (n - 1) * chunk
    elif coll == "broadcast":
        steps, nbytes = n - 1, share
    else:
        raise ValueError(f"ring does not implement {coll}")
    load = np.zeros((n, 4))  # per member, per tier index: port seconds at the ring's pace
    moved = np.zeros((n, 4))  # per member, per tier index: bytes
    step_s = 0.0
    work: list[tuple[float, int]] = []  # a die's flows: one per ring, over member 0's hop
    for order in orders:
        hops = [fabric.tier(int(tidx[order[i], order[(i + 1) % n]]), plane) for i in range(n)]
        slow = min(hops, key=lambda t: t.beta_Bps)
        step_s = max(step_s, max(h.alpha_s + h.sync_s for h in hops))
        for i in range(n):
            load[order[i], hops[i].index] += nbytes / slow.beta_Bps
            moved[order[i], hops[i].index] += nbytes
        work.append((nbytes, hops[order.index(0)].index))
    tx = _plane_max(load, fabric, plane)
    ports = _plane_max(moved, fabric, plane)
    red = (n - 1) * chunk * len(orders) if coll in alg.REDUCING else 0.0
    total = nbytes * len(orders)
    return alg.WirePlan(algorithm=name, steps=steps, latency_s=steps * step_s, tx_s=tx, rx_s=dict(tx),
                        send_bytes=total, recv_bytes=total, group_wire_bytes=total * n, reduce_bytes=red,
                        peers=2 * len(orders) if n > 2 else 1, peer_work=tuple(work), port_bytes=ports)


def _plane_max(load: np.ndarray, fabric: Fabric, plane: Plane) -> dict[str, float]:
    out: dict[str, float] = {}
    per_plane: dict[str, np.ndarray] = {}
    for t in range(load.shape[1]):
        if load[:, t].any():
            p: str = fabric.tier(t, plane).plane
            per_plane[p] = per_plane.get(p, 0.0) + load[:, t]
    for p, secs in per_plane.items():
        out[p] = float(np.max(secs))
    return out


def log_steps(coll: str, n: int, size: float, tidx: np.ndarray, fabric: Fabric, plane: Plane,
              name: str) -> alg.WirePlan:
    """NHR / NB / HD-stage / RHD on any n: ⌈log2 n⌉ steps per reduce-scatter or all-gather half,
    (n−1)/n of the buffer in all (NHR.md table 1); step s exchanges with the partner at distance
    2^s, the nearest partner carrying the largest share (NHR concentrates traffic between near
    nodes). RHD on a non-power-of-two n first folds the excess ranks onto partners: an extra step
    with the whole buffer per half (RHD.md: extra traffic off powers of two)."""
    steps = max(1, math.ceil(math.log2(n)))
    halves = 2 if coll in ("allreduce", "broadcast") else 1
    fracs = np.array([2.0 ** -(s + 1) for s in range(steps)])
    fracs *= (n - 1) / n / fracs.sum()
    idx = np.arange(n)
    latency, nbytes = 0.0, 0.0
    load = np.zeros(4)
    work: dict[int, float] = {}

    def step(tiers: list[Tier], b: float, times: int) -> None:
        nonlocal latency, nbytes
        slow = min(tiers, key=lambda t: t.beta_Bps)
        latency += times * max(t.alpha_s + t.sync_s for t in tiers)
        load[slow.index] += times * b / slow.beta_Bps
        work[slow.index] = work.get(slow.index, 0.0) + times * b
        nbytes += times * b

    for s in range(steps):
        step([fabric.tier(int(t), plane) for t in tidx[idx, (idx + (1 << s)) % n]], fracs[s] * size, halves)
    extra = halves if name == "rhd" and n & (n - 1) else 0
    if extra:
        step([fabric.tier(int(tidx.max()), plane)], size, extra)
    tx: dict[str, float] = {}
    for t in range(4):
        if load[t]:
            p = fabric.tier(t, plane).plane
            tx[p] = tx.get(p, 0.0) + load[t]
    red = nbytes / halves if coll in alg.REDUCING else 0.0
    return alg.WirePlan(algorithm=name, steps=steps * halves + extra, latency_s=latency, tx_s=tx,
                        rx_s=dict(tx), send_bytes=nbytes, recv_bytes=nbytes, group_wire_bytes=nbytes * n,
                        reduce_bytes=red, peers=steps, peer_work=tuple((b, t) for t, b in work.items()))


def grouped_fullmesh(coll: str, n: int, size: float, tidx: np.ndarray, fabric: Fabric, plane: Plane,
                     peer_bytes: tuple[float, ...], concurrent: int) -> alg.WirePlan:
    """HCCL's direct full-mesh all-to-all(v) on A3: peers served in rounds of `concurrent` SDMA
    streams, nearest first (half to the left, half to the right of the rank), a notify/wait
    synchronisation per round; every byte still crosses the rank's port once."""
    base = alg.fullmesh(coll, n, size, tidx, fabric, plane, peer_bytes, algorithm="direct_fullmesh")
    rounds = max(1, math.ceil((n - 1) / concurrent))
    latency = 0.0
    for r in range(rounds):
        dist = [d for d in range(r * concurrent // 2 + 1, (r + 1) * concurrent // 2 + 1) if d < n]
        peers = {(0 + d) % n for d in dist} | {(0 - d) % n for d in dist}
        peers.discard(0)
        ts = [fabric.tier(int(tidx[0, p]), plane) for p in peers] or [fabric.tier(int(tidx[0, 1]), plane)]
        latency += max(t.alpha_s + t.sync_s for t in ts)
    return replace(base, steps=rounds, latency_s=latency)


def _sub(tidx: np.ndarray, members: list[int]) -> np.ndarray:
    return tidx[np.ix_(members, members)]


def level0_plan(kind: str, coll: str, k: int, size: float, tidx0: np.ndarray, fabric: Fabric,
                plane: Plane) -> alg.WirePlan:
    if kind == "double_ring":
        return rings(coll, k, size, tidx0, fabric, plane, [list(range(k)), [0, *range(k - 1, 0, -1)]],
                     "double_ring")
    if kind == "mesh":
        c = "allgather" if coll == "scatter" else coll
        return alg.fullmesh(c, k, size, tidx0, fabric, plane)  # one-shot mesh inside the server
    return rings(coll, k, size, tidx0, fabric, plane, [list(range(k))], "ring")


def level1_plan(kind: str, coll: str, m: int, size: float, tidx1: np.ndarray, fabric: Fabric,
                plane: Plane) -> alg.WirePlan:
    if kind in ("ring", "pipeline"):
        return rings(coll, m, size, tidx1, fabric, plane, [list(range(m))], "ring")
    if kind == "rhd" and m & (m - 1) == 0 and coll in ("allreduce", "allgather", "reducescatter"):
        return alg.rhd(coll, m, size, tidx1, fabric, plane)
    return log_steps(coll, m, size, tidx1, fabric, plane, kind)


def hierarchical(coll: str, size: float, tidx: np.ndarray, servers: list[list[int]], level0: str,
                 level1: str, fabric: Fabric, plane: Plane) -> alg.WirePlan:
    """Stages of a two-level collective; each stage is a plan for the busiest die of its level."""
    m, k = len(servers), len(servers[0])
    t0 = _sub(tidx, servers[0])
    t1 = _sub(tidx, [s[0] for s in servers])

    def l0(c: str, s: float) -> alg.WirePlan:
        return _scaled(level0_plan(level0, c, k, s, t0, fabric, plane), m)

    def l1(c: str, s: float) -> alg.WirePlan:
        return _scaled(level1_plan(level1, c, m, s, t1, fabric, plane), k)

    if m == 1:
        stages = [l0(coll, size)]
    elif k == 1:
        stages = [l1(coll, size)]
    elif coll == "allgather":
        stages = [l1("allgather", size / k), l0("allgather", size)]
    elif coll == "reducescatter":
        stages = [l1("reducescatter", size), l0("reducescatter", size / m)]
    elif coll == "allreduce":
        stages = [l0("reducescatter", size), l1("allreduce", size / k), l0("allgather", size)]
    elif coll == "broadcast":
        stages = [l0("scatter", size), l1("broadcast", size / k), l0("allgather", size)]
    else:
        raise ValueError(f"no hierarchical {coll}")
    name = f"{level0}+{level1}" if m > 1 else level0
    return combine_stages(name, stages, overlap=(level1 == "pipeline"))


def _scaled(plan: alg.WirePlan, groups: int) -> alg.WirePlan:
    """A level plan runs in `groups` sub-communicators at once: the op's wire bytes add up."""
    return replace(plan, group_wire_bytes=plan.group_wire_bytes * groups)


def combine_stages(name: str, stages: list[alg.WirePlan], overlap: bool = False) -> alg.WirePlan:
    """One plan of stages run in order (or overlapped: one transfer sharing the ports, as HCCL's
    pipeline overlaps the intra- and inter-server links)."""
    tx: dict[str, float] = {}
    rx: dict[str, float] = {}
    for st in stages:
        for p, s in st.tx_s.items():
            tx[p] = tx.get(p, 0.0) + s
        for p, s in st.rx_s.items():
            rx[p] = rx.get(p, 0.0) + s
    work: dict[int, float] = {}
    for st in stages:
        for b, t in st.peer_work:
            work[t] = work.get(t, 0.0) + b
    return alg.WirePlan(
        algorithm=name, steps=sum(s.steps for s in stages), latency_s=sum(s.latency_s for s in stages),
        tx_s=tx, rx_s=rx, send_bytes=sum(s.send_bytes for s in stages),
        recv_bytes=sum(s.recv_bytes for s in stages),
        group_wire_bytes=sum(s.group_wire_bytes for s in stages),
        reduce_bytes=sum(s.reduce_bytes for s in stages),
        peers=max(s.peers for s in stages), peer_work=tuple((b, t) for t, b in work.items()),
        stages=() if overlap else tuple(stages))


def hccl_plan(choice: HcclChoice, coll: str, size: float, tidx: np.ndarray, fabric: Fabric, plane: Plane,
              peer_bytes: tuple[float, ...] = ()) -> alg.WirePlan:
    """The wire plan of an HCCL choice on a communicator's tier matrix."""
    n = tidx.shape[0]
    if choice.flat == "direct_fullmesh":
        plan = grouped_fullmesh(coll, n, size, tidx, fabric, plane, peer_bytes, DIRECT_FULLMESH_CONCURRENT)
    elif choice.flat == "pairwise":
        plan = alg.pairwise(coll, n, size, tidx, fabric, plane, peer_bytes)
    elif choice.flat == "mesh":
        plan = alg.fullmesh(coll, n, size, tidx, fabric, plane, peer_bytes, algorithm="mesh_aiv")
    elif choice.flat in ("nhr", "rhd", "hd_stage"):
        if choice.flat == "rhd" and n & (n - 1) == 0:
            plan = alg.rhd(coll, n, size, tidx, fabric, plane)
        else:
            plan = log_steps(coll, n, size, tidx, fabric, plane, choice.flat)
    else:
        split = split_servers(tidx)
        if split is None:  # uneven servers: HCCL's AllReduceComm-style flat ring
            plan = rings(coll, n, size, tidx, fabric, plane, [list(range(n))], "ring")
        else:
            plan = hierarchical(coll, size, tidx, split[0], choice.level0, choice.level1 or "ring", fabric, plane)
    return replace(plan, algorithm=choice.label)
