"""α–β traffic plans of collective algorithms over a communicator's distance tiers.

A plan says, for the busiest die of the group, how many synchronised steps the algorithm takes,
their total latency, and how many seconds of port time it needs per plane and direction
(bytes / tier β, summed over the peers it talks to). Events scale with ops: a 2(n−1)-step ring is
one latency term plus one bandwidth term, which is exact on an idle fabric because every step of
a ring moves the same chunk over the same hop.

Every synchronised step costs the tier's α plus its flag synchronisation (`sync`), so a ring's
2(n−1) steps show at small sizes while a full-mesh exchange pays one.

Conventions (nccl-tests): S is the op's size per rank — the full buffer for allreduce/alltoall,
the gathered output for allgather, the input for reducescatter, the buffer for broadcast.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from stratacl.config import Plane
from stratacl.machine.fabric import Fabric, Tier

REDUCING = ("allreduce", "reducescatter", "combine")


@dataclass(frozen=True, slots=True, kw_only=True)
class WirePlan:
    algorithm: str
    steps: int  # synchronised logical steps
    latency_s: float  # Σ per-step α (slowest tier in each step)
    tx_s: dict[str, float] = field(default_factory=dict)  # port seconds per plane, busiest die
    rx_s: dict[str, float] = field(default_factory=dict)
    send_bytes: float = 0.0  # bytes the busiest die sends
    recv_bytes: float = 0.0
    group_wire_bytes: float = 0.0  # bytes on the network summed over the group's members
    reduce_bytes: float = 0.0  # bytes the busiest die reduces (reads 2, writes 1)
    peers: int = 0  # distinct peers the busiest die exchanges with
    peer_work: tuple[tuple[float, int], ...] = ()  # busiest die: (bytes, tier index) per peer
    # hierarchical plans: sub-plans run one after another (each its own sync + transfer phase);
    # the fields above then hold their totals
    stages: tuple[WirePlan, ...] = ()
    # MoE: separate windows each peer's payload lands in, aligned with peer_work (LL: one per
    # expert of the peer hit; HT: one packed window); empty = one per peer
    peer_copies: tuple[int, ...] = ()
    # bytes through each plane's port on that plane's busiest die, when peer_work (the flows of
    # one die) does not say it (rings whose dies use different planes); empty = from peer_work
    port_bytes: dict[str, float] = field(default_factory=dict)
    # least wire time on an idle fabric beyond the ports' (NCCL: its tuning model's bandwidth,
    # which carries protocol efficiencies and per-channel caps; comm/nccl.py)
    floor_s: float = 0.0
    # MoE moved by vector cores: each token copy's processing on its core (library moe_copy_us) per
    # byte of the copy
    copy_s_per_byte: float = 0.0
    # MoE moved by vector cores: the data stores are posted, not waited for one by one (library
    # posted_store_ops), so they pay no start-up each on their cores
    stores_posted: bool = False

    @property
    def wire_s(self) -> float:
        return max(list(self.tx_s.values()) + list(self.rx_s.values()) + [0.0])


def _tiers(tidx: np.ndarray, fabric: Fabric, plane: Plane) -> dict[int, Tier]:
    """The tiers a group's members are apart (tier index -> Tier), over `plane`. Only distances that
    occur are looked up, so a fabric without e.g. a scale-out tier serves groups inside it."""
    return {int(t): fabric.tier(int(t), plane) for t in np.unique(tidx)}


def _per_plane(bytes_mat: np.ndarray, tidx: np.ndarray, tiers: dict[int, Tier], axis: int) -> dict[str, float]:
    """Port seconds per plane on the busiest die: Σ_peers bytes/β over that plane's tiers."""
    out: dict[str, float] = {}
    secs_by_plane: dict[str, np.ndarray] = {}
    for t, tier in tiers.items():
        mask = tidx == t
        secs = np.where(mask, bytes_mat, 0.0).sum(axis=axis) / tier.beta_Bps
        secs_by_plane[tier.plane] = secs_by_plane.get(tier.plane, 0.0) + secs
    for plane, secs in secs_by_plane.items():
        out[plane] = float(np.max(secs))
    return out


def peer_matrix(n: int, size: float, peer_bytes: tuple[float, ...]) -> np.ndarray:
    """Bytes each member sends each other member in one full-mesh exchange (row = sender)."""
    if peer_bytes:
        m = np.asarray(peer_bytes, dtype=float).reshape(n, n).copy()
    else:
        m = np.full((n, n), size / n)
    np.fill_diagonal(m, 0.0)
    return m


def ring(coll: str, n: int, size: float, tidx: np.ndarray, fabric: Fabric, plane: Plane) -> WirePlan:
    tiers = _tiers(tidx, fabric, plane)
    hops = [tiers[int(tidx[i, (i + 1) % n])] for i in range(n)]
    slow = min(hops, key=lambda t: t.beta_Bps)
    step_s = max(h.alpha_s + h.sync_s for h in hops)  # the ring moves in lockstep
    chunk = size / n
    if coll == "allreduce":
        steps, nbytes = 2 * (n - 1), 2 * (n - 1) * chunk
    elif coll in ("allgather", "reducescatter"):
        steps, nbytes = n - 1, (n - 1) * chunk
    elif coll == "broadcast":  # pipelined chain: n-1 hops of latency, the buffer once per link
        steps, nbytes = n - 1, size
    else:
        raise ValueError(f"ring does not implement {coll}")
    red = (n - 1) * chunk if coll in REDUCING else 0.0
    secs = nbytes / slow.beta_Bps
    return WirePlan(algorithm="ring", steps=steps, latency_s=steps * step_s, tx_s={slow.plane: secs},
                    rx_s={slow.plane: secs}, send_bytes=nbytes, recv_bytes=nbytes, group_wire_bytes=nbytes * n,
                    reduce_bytes=red, peers=2 if n > 2 else 1, peer_work=((nbytes, slow.index),))


def fullmesh(coll: str, n: int, size: float, tidx: np.ndarray, fabric: Fabric, plane: Plane,
             peer_bytes: tuple[float, ...] = (), steps_per_exchange: int = 1,
             algorithm: str = "fullmesh") -> WirePlan:
    """One logical step per exchange: every member moves its slices to/from all peers at once.

    allreduce = reduce-scatter exchange + all-gather exchange (two steps). `steps_per_exchange`
    > 1 gives HCCL's multi-step mesh (peers served one after another, a sync each).
    """
    tiers = _tiers(tidx, fabric, plane)
    exchanges = 2 if coll in ("allreduce", "broadcast") else 1
    m = peer_matrix(n, size, peer_bytes)
    off = ~np.eye(n, dtype=bool)
    step_s = max(tiers[int(t)].alpha_s + tiers[int(t)].sync_s for t in np.unique(tidx[off])) if n > 1 else 0.0
    tx = {p: s * exchanges for p, s in _per_plane(m, tidx, tiers, axis=1).items()}
    rx = {p: s * exchanges for p, s in _per_plane(m, tidx, tiers, axis=0).items()}
    send = float(m.sum(axis=1).max()) * exchanges
    recv = float(m.sum(axis=0).max()) * exchanges
    red = recv / exchanges if coll in REDUCING else 0.0
    steps = exchanges * steps_per_exchange
    return WirePlan(algorithm=algorithm, steps=steps, latency_s=steps * step_s, tx_s=tx, rx_s=rx,
                    send_bytes=send, recv_bytes=recv, group_wire_bytes=float(m.sum()) * exchanges,
                    reduce_bytes=red, peers=n - 1, peer_work=_busiest_peer_work(m, tidx, tiers, exchanges))


def pairwise(coll: str, n: int, size: float, tidx: np.ndarray, fabric: Fabric, plane: Plane,
             peer_bytes: tuple[float, ...] = ()) -> WirePlan:
    """n−1 synchronised steps; in step k member i sends its slice to member (i+k) mod n."""
    tiers = _tiers(tidx, fabric, plane)
    m = peer_matrix(n, size, peer_bytes)
    idx = np.arange(n)
    latency = 0.0
    tx: dict[str, float] = {}
    for k in range(1, n):
        dst = (idx + k) % n
        step_tiers = [tiers[int(t)] for t in tidx[idx, dst]]
        latency += max(t.alpha_s + t.sync_s for t in step_tiers)
        secs = np.array([m[i, dst[i]] / step_tiers[i].beta_Bps for i in range(n)])
        worst = int(np.argmax(secs))
        p = step_tiers[worst].plane
        tx[p] = tx.get(p, 0.0) + float(secs[worst])
    send = float(m.sum(axis=1).max())
    recv = float(m.sum(axis=0).max())
    red = recv if coll in REDUCING else 0.0
    return WirePlan(algorithm="pairwise", steps=n - 1, latency_s=latency, tx_s=tx, rx_s=dict(tx),
                    send_bytes=send, recv_bytes=recv, group_wire_bytes=float(m.sum()), reduce_bytes=red,
                    peers=n - 1, peer_work=_busiest_peer_work(m, tidx, tiers, 1))


def _busiest_peer_work(m: np.ndarray, tidx: np.ndarray, tiers: dict[int, Tier],
                       exchanges: int) -> tuple[tuple[float, int], ...]:
    """(bytes, tier) per peer of the member that sends the most (it finishes last)."""
    i = int(np.argmax(m.sum(axis=1)))
    return tuple((float(m[i, j]) * exchanges, tiers[int(tidx[i, j])].index)
                 for j in range(m.shape[0]) if j != i and m[i, j] > 0)


def rhd(coll: str, n: int, size: float, tidx: np.ndarray, fabric: Fabric, plane: Plane) -> WirePlan:
    """Recursive halving-doubling (HCCL/MPI RHD; n a power of two): log2(n) exchange steps per
    reduce-scatter / all-gather half, partner = rank XOR 2^k, payload halving from S/2."""
    tiers = _tiers(tidx, fabric, plane)
    logn = n.bit_length() - 1
    idx = np.arange(n)
    halves = {"allreduce": 2, "allgather": 1, "reducescatter": 1}[coll]
    latency, secs, nbytes = 0.0, 0.0, 0.0
    for k in reversed(range(logn)):  # halving: farthest partner first, with half the data
        chunk = size / 2 ** (logn - k)
        step_tiers = [tiers[int(t)] for t in tidx[idx, idx ^ (1 << k)]]
        slow = min(step_tiers, key=lambda t: t.beta_Bps)
        latency += max(t.alpha_s + t.sync_s for t in step_tiers)
        secs += chunk / slow.beta_Bps
        nbytes += chunk
    # the steps run one after another: their port time adds up; it is charged to the plane of the
    # farthest (first) step, as a ring's is to its slowest hop
    far = int(tidx[0, 1 << (logn - 1)]) if logn else 0
    tx: dict[str, float] = {tiers[far].plane: secs * halves}
    red = nbytes if coll in REDUCING else 0.0
    return WirePlan(algorithm="rhd", steps=logn * halves, latency_s=latency * halves, tx_s=tx, rx_s=dict(tx),
                    send_bytes=nbytes * halves, recv_bytes=nbytes * halves, group_wire_bytes=nbytes * halves * n,
                    reduce_bytes=red, peers=logn, peer_work=((nbytes * halves, tiers[far].index),))


def package_colours(tidx: np.ndarray) -> np.ndarray | None:
    """Each member's side of its package (0 or 1, the lower group index 0), or None unless every
    member's package peer (tier 0, over SIO) is in the group exactly once."""
    n = tidx.shape[0]
    colour = np.full(n, -1, dtype=int)
    for i in range(n):
        mates = [int(j) for j in np.flatnonzero(tidx[i] == 0) if j != i]
        if len(mates) != 1:
            return None
        colour[i] = 0 if i < mates[0] else 1
    return colour


def sio_relay_matrix(n: int, size: float, tidx: np.ndarray) -> np.ndarray | None:
    """Bytes per sender→receiver of a full mesh whose package peers share the UB work over SIO.

    All-gather: a die pulls over UB only the chunks of the remote dies on its side of their
    package (P−1 of them, P packages) and gets the other side's from its package peer over SIO,
    which relays them with its own chunk (P chunks). Every receiver still gets n−1 chunks, but
    the UB carries each package's copy once instead of twice, as a double ring's SIO half does.
    Reduce-scatter is the transpose (package peers pre-reduce over SIO, then one UB load per
    remote side), which is the same matrix. None when a member's package peer is missing."""
    colour = package_colours(tidx)
    if colour is None:
        return None
    chunk = size / n
    same_side = colour[:, None] == colour[None, :]
    m = np.where((tidx > 0) & same_side, chunk, 0.0)
    m[tidx == 0] = (n // 2) * chunk  # its own chunk + the P−1 pulled on its side
    np.fill_diagonal(m, 0.0)
    return m


def fullmesh_sio(coll: str, n: int, size: float, tidx: np.ndarray, fabric: Fabric, plane: Plane) -> WirePlan | None:
    """One-step full mesh over UB in parallel with the package peer's SIO link (StrataCL's
    hierarchical candidate): the relay streams unit by unit as the UB pulls land, so the two
    links run as one exchange (the pipeline's one-unit fill is not charged). All-gather,
    reduce-scatter and all-reduce (= both); None for other collectives or groups without every
    package peer."""
    if coll not in ("allgather", "reducescatter", "allreduce") or n < 4:
        return None
    m = sio_relay_matrix(n, size, tidx)
    if m is None:
        return None
    plan = fullmesh(coll, n, size, tidx, fabric, plane, tuple(m.ravel()), algorithm="fullmesh_sio")
    # the relayed slices take a second, dependent hop: one SIO step more per exchange
    sio = fabric.tier(0, plane)
    exchanges = 2 if coll == "allreduce" else 1
    return replace(plan, steps=plan.steps + exchanges, latency_s=plan.latency_s + exchanges * (sio.alpha_s + sio.sync_s))
