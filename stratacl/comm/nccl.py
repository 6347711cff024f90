"""NCCL's algorithms as NCCL runs them on an NVLink + rail-optimised RDMA fabric, and NCCL's choice.

NCCL's "node" is an NVLink domain (the members a communicator reaches without a NIC: an HGX
node, or a whole GB200 NVL72 rack through multi-node NVLink); every GPU has its own NIC (rail i
↔ GPU i, the per-die `rdma` port). Plans (per die of the busiest kind, Simple protocol bytes):

- ring: `channels` rings (one per CTA), each crossing every node once; NCCL's ring search puts
  each channel's inter-node hop on a different NIC (rail), so the C rings exit a node through
  all its NICs: a die's NIC carries ⌈C/p⌉ of them and its NVLink the others' hops
  (src/graph/search.cc, rings per NET device; topo/rings.cc).
- tree (all-reduce): a chain per node (reduce up, broadcast down) and NCCL's double binary tree
  between nodes (src/graph/trees.cc ncclGetDtree: tree 1 mirrors tree 0, or shifts it for an
  odd count), each tree carrying half the data; each die heads 1/p of the channels, so its NIC
  carries 1/p of its node's tree traffic.
- nvls (one node): in-switch reduction (NVLink SHARP): multimem ld_reduce then st — a die sends S
  and receives S/p for the reduction, sends S/p and receives S for the multicast; no reduction on
  the GPU. nvls_tree: that inside each node, and the double binary tree on each die's S/p shard
  over its own NIC.
- exchanges (all-to-all): NCCL's grouped send/recv to every peer at once; a message to another
  node goes through PXN (src/graph/paths.cc, NCCL_PXN_DISABLE=0 and NCCL_P2P_PXN_LEVEL=2 by
  default, search.cc): over NVLink to the local GPU on the destination's rail, then out of that
  GPU's NIC, so each NIC carries its own rail's messages.

Protocols change the bytes on the wire: LL sends 4 bytes of flag with every 4 bytes of data
(union ncclLLFifoLine, src/include/device.h), LL128 one 8-byte flag per 128-byte line
(NCCL_LL128_LINEELEMS / NCCL_LL128_DATAELEMS = 16 / 15, device.h). NCCL picks (algorithm,
protocol) by its tuning model (nccl_tuning.py) fed with each plan's own bandwidth on the fabric;
the chosen plan's wire cannot run faster than the model's bandwidth (`WirePlan.floor_s`, which
carries NCCL's protocol efficiencies and per-channel caps) and pays the model's latency beyond
the library's launch (`launch_us`) as synchronised steps. Sources at
NVIDIA/nccl@5067397c2676d5aed50042fc39e5c8ee96eb0027.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from stratacl.comm import algorithms as alg
from stratacl.comm import nccl_tuning as tune
from stratacl.comm.context import CommContext
from stratacl.config import Plane
from stratacl.machine.fabric import Fabric, Tier
from stratacl.trace import EXCHANGES

PROTO_WIRE = {"LL": 2.0, "LL128": 16 / 15, "Simple": 1.0}  # wire bytes per data byte
RING_BYTES = {"allreduce": 2, "allgather": 1, "reducescatter": 1}  # × (n−1)/n · S per die


@dataclass(frozen=True, slots=True)
class Layout:
    """A communicator as NCCL sees it: NVLink domains of `ppn` members each."""

    n: int
    nodes: int
    ppn: int
    label: np.ndarray  # domain of each member
    local: np.ndarray  # index of each member inside its domain (its rail)
    nvl: Tier  # the slowest NVLink tier inside a domain
    net: Tier | None  # the scale-out tier (None inside one domain)


def layout(tidx: np.ndarray, fabric: Fabric, plane: Plane) -> Layout | None:
    """NVLink domains of a communicator from its tier matrix; None when they hold different
    numbers of members (NCCL then runs what its search finds; the caller falls back to a ring)."""
    n = tidx.shape[0]
    tiers = {int(t): fabric.tier(int(t), plane) for t in np.unique(tidx)}
    net_t = np.array([tiers[int(t)].plane == Plane.rdma for t in tidx.ravel()]).reshape(n, n)
    label = -np.ones(n, dtype=int)
    local = np.zeros(n, dtype=int)
    d = 0
    for i in range(n):
        if label[i] < 0:
            members = np.flatnonzero(~net_t[i])
            label[members] = d
            local[members] = np.arange(len(members))
            d += 1
    sizes = np.bincount(label)
    if len(set(sizes.tolist())) != 1:
        return None
    intra = [t for t in tiers.values() if t.plane != Plane.rdma]
    nvl = min(intra, key=lambda t: t.beta_Bps) if intra else fabric.tier(1, plane)
    net = next((t for t in tiers.values() if t.plane == Plane.rdma), None)
    return Layout(n, d, int(sizes[0]), label, local, nvl, net)


def _wire(name: str, steps: int, lay: Layout, n: int, nvl_tx: float, nvl_rx: float, net_tx: float = 0.0,
          net_rx: float = 0.0, reduce_bytes: float = 0.0) -> alg.WirePlan:
    """A plan from the bytes of the busiest die per plane and direction."""
    tx: dict[str, float] = {}
    rx: dict[str, float] = {}
    ports: dict[str, float] = {}
    work: list[tuple[float, int]] = []
    for tier, t, r in ((lay.nvl, nvl_tx, nvl_rx), (lay.net, net_tx, net_rx)):
        if tier is None or max(t, r) <= 0:
            continue
        tx[tier.plane] = tx.get(tier.plane, 0.0) + t / tier.beta_Bps
        rx[tier.plane] = rx.get(tier.plane, 0.0) + r / tier.beta_Bps
        ports[tier.plane] = ports.get(tier.plane, 0.0) + t
        work.append((t, tier.index))
    send, recv = nvl_tx + net_tx, nvl_rx + net_rx
    return alg.WirePlan(algorithm=name, steps=steps, latency_s=0.0, tx_s=tx, rx_s=rx, send_bytes=send,
                        recv_bytes=recv, group_wire_bytes=send * n, reduce_bytes=reduce_bytes,
                        peers=2, peer_work=tuple(work), port_bytes=ports)


# ------------------------------------------------------------------ plans (Simple protocol bytes)
def rail_rings(coll: str, size: float, lay: Layout, channels: int) -> alg.WirePlan:
    """`channels` rings over the nodes, their inter-node hops spread over the p rails."""
    n, m, p = lay.n, lay.nodes, lay.ppn
    total = size if coll == "broadcast" else RING_BYTES[coll] * (n - 1) / n * size
    if m == 1:
        nvl, net = total, 0.0
    else:  # a die exits ⌈C/p⌉ rings through its NIC and forwards the others over NVLink
        net = math.ceil(channels / p) / channels * total
        nvl = (channels - channels // p) / channels * total if p > 1 else 0.0
    steps = n - 1 if coll != "allreduce" else 2 * (n - 1)
    red = (n - 1) / n * size if coll in alg.REDUCING else 0.0
    return _wire("ring", steps, lay, n, nvl, nvl, net, net, red)


def btree_links(n: int) -> np.ndarray:
    """Links (parent + children) of every rank in NCCL's binary tree (trees.cc ncclGetBtree)."""
    links = np.zeros(n, dtype=int)
    for rank in range(n):
        bit = 1
        while bit < n and not bit & rank:
            bit <<= 1
        if rank == 0:
            links[rank] = 1 if n > 1 else 0
            continue
        kids, low = 0, bit >> 1
        if low:
            kids += 1  # down0 = rank − lowbit, always in range
            while rank + low >= n and low:
                low >>= 1
            kids += 1 if low and rank + low < n else 0
        links[rank] = 1 + kids
    return links


def dtree_links(n: int) -> np.ndarray:
    """Links of every rank summed over NCCL's two trees (ncclGetDtree: mirror, or shift if odd)."""
    t0 = btree_links(n)
    t1 = t0[(np.arange(n) - 1) % n] if n % 2 else t0[n - 1 - np.arange(n)]
    links: np.ndarray = t0 + t1
    return links


def tree(size: float, lay: Layout) -> alg.WirePlan:
    """All-reduce: chains inside the nodes, the double binary tree between them (half the data
    each tree); channel heads rotate over the dies, so a die's NIC carries 1/p of its node's."""
    n, m, p = lay.n, lay.nodes, lay.ppn
    nvl = 2 * size * (p - 1) / p
    net = float(dtree_links(m).max()) * size / 2 / p if m > 1 else 0.0
    steps = 2 * ((p - 1) + max(1, math.ceil(math.log2(m))) * (m > 1))
    return _wire("tree", steps, lay, n, nvl, nvl, net, net, size)


def nvls(coll: str, size: float, lay: Layout) -> alg.WirePlan:
    """In-switch reduction / multicast inside one NVLink domain (p = n)."""
    p = lay.ppn
    tx, rx = {"allreduce": (size + size / p, size / p + size), "allgather": (size / p, size),
              "reducescatter": (size, size / p)}[coll]
    return _wire("nvls", 2 if coll == "allreduce" else 1, lay, lay.n, tx, rx)


def nvls_tree(size: float, lay: Layout) -> alg.WirePlan:
    """NVLS reduce-scatter and multicast inside each node, the double binary tree on each die's
    S/p shard over its own NIC."""
    p, m = lay.ppn, lay.nodes
    net = float(dtree_links(m).max()) * size / p / 2
    steps = 2 + 2 * max(1, math.ceil(math.log2(m)))
    return _wire("nvls_tree", steps, lay, lay.n, size + size / p, size / p + size, net, net, size / p)


def pxn_exchange(size: float, lay: Layout, peer_bytes: tuple[float, ...]) -> alg.WirePlan:
    """Every member sends its part to every peer at once; a message to another node goes over
    NVLink to the local member on the destination's rail (PXN) and out of that member's NIC."""
    n = lay.n
    m = alg.peer_matrix(n, size, peer_bytes)
    same = lay.label[:, None] == lay.label[None, :]
    nvl_tx = np.where(same, m, 0.0).sum(axis=1)
    nvl_rx = np.where(same, m, 0.0).sum(axis=0)
    net_tx = np.zeros(n)
    net_rx = np.where(same, 0.0, m).sum(axis=0)
    relay = {(int(d), int(li)): i for i, (d, li) in enumerate(zip(lay.label, lay.local, strict=True))}
    for i, j in zip(*np.nonzero(~same & (m > 0)), strict=True):
        r = relay[(int(lay.label[i]), int(lay.local[j]))]
        net_tx[r] += m[i, j]
        if r != i:
            nvl_tx[i] += m[i, j]
            nvl_rx[r] += m[i, j]
    busiest = int(np.argmax(nvl_tx / lay.nvl.beta_Bps + (net_tx / lay.net.beta_Bps if lay.net else 0.0)))
    plan = _wire("pxn" if lay.nodes > 1 else "p2p", 1, lay, n, float(nvl_tx.max()), float(nvl_rx.max()),
                 float(net_tx.max()), float(net_rx.max()))
    far = lay.net or lay.nvl  # (messages that leave a domain exist only beside a net tier)
    peers = tuple((float(m[busiest, j]), (far if not same[busiest, j] else lay.nvl).index)
                  for j in range(n) if j != busiest and m[busiest, j] > 0)
    return replace(plan, peers=n - 1, peer_work=peers, group_wire_bytes=float(m.sum()))


# ------------------------------------------------------------------ NCCL's choice
@dataclass(frozen=True, slots=True)
class Choice:
    algo: str
    proto: str
    latency_us: float
    alg_bw_GBps: float  # the model's algorithm bandwidth (tree correction included)
    plan: alg.WirePlan


def physical(coll: str, algo: str, size: float, lay: Layout, channels: int) -> alg.WirePlan:
    if algo == "ring":
        return rail_rings(coll, size, lay, channels)
    if algo == "tree":
        return tree(size, lay)
    if algo == "nvls":
        return nvls(coll, size, lay)
    return nvls_tree(size, lay)


def choices(coll: str, size: float, lay: Layout, channels: int, arch: str, nvls_ok: bool,
            cpu: str = "intel", algos: tuple[str, ...] = (), protos: tuple[str, ...] = ()) -> list[Choice]:
    """Every (algorithm, protocol) NCCL prices for this op, with its modelled latency and
    bandwidth: the plan's own bandwidth on the fabric as NCCL's `nChannels × bw`, then NCCL's
    refinements."""
    c = tune.Comm(coll, lay.n, lay.nodes, channels, arch, cpu)
    out: list[Choice] = []
    for algo in algos or tune.ALGOS:
        if not any(tune.enabled(c, algo, p, nvls_ok) for p in protos or tune.PROTOS):
            continue
        plan = physical(coll, algo, size, lay, channels)
        phys_alg = size / plan.wire_s / 1e9  # GB/s
        r = tune.ratio(c, algo)
        for proto in protos or tune.PROTOS:
            if not tune.enabled(c, algo, proto, nvls_ok):
                continue
            if algo in ("nvls", "nvls_tree"):  # nvlsEfficiency and one channel short, as tuning.cc
                bw = phys_alg * tune.NVLS_EFFICIENCY[arch] * (channels - 1) / channels
                if algo == "nvls_tree":
                    bw = min(bw, channels * tune.PER_CH_NVLS_TREE[arch][c.n_idx] * r)
            else:
                bw = tune.refine(c, algo, proto, phys_alg / r) * r
            lat, bw = tune.time_parts(c, algo, proto, size, bw)
            out.append(Choice(algo, proto, lat, bw, plan))
    return out


@dataclass(frozen=True)
class NcclKnobs:
    """NCCL_ALGO / NCCL_PROTO: the algorithms and protocols NCCL may choose among (empty: its defaults)."""

    nccl_algos: tuple[str, ...]
    nccl_protos: tuple[str, ...]


def nccl_plan(ctx: CommContext, knobs: NcclKnobs, coll: str, size: float, tidx: np.ndarray,
              peer_bytes: tuple[float, ...]) -> alg.WirePlan:
    """The plan NCCL runs for `coll`: exchanges through PXN, the others as its tuning model picks."""
    fab, plane, channels = ctx.fabric, ctx.plane, ctx.comm_cores
    lay = layout(tidx, fab, plane)
    n = tidx.shape[0]
    if coll in EXCHANGES:
        if lay is None:
            return alg.fullmesh(coll, n, size, tidx, fab, plane, peer_bytes, algorithm="nccl:p2p")
        plan = pxn_exchange(size, lay, peer_bytes)
        return replace(plan, algorithm=f"nccl:{plan.algorithm}", latency_s=_p2p_latency(lay))
    if lay is None:
        return replace(alg.ring(coll, n, size, tidx, fab, plane), algorithm="nccl:ring")
    found = choices(coll, size, lay, channels, fab.gpu_arch, fab.nvls, fab.host_cpu,
                    knobs.nccl_algos, knobs.nccl_protos)
    if not found:  # NCCL_ALGO / NCCL_PROTO leave nothing for this collective: NCCL falls back to ring
        found = choices(coll, size, lay, channels, fab.gpu_arch, fab.nvls, fab.host_cpu, ("ring",))
    best = min(found, key=lambda ch: ch.latency_us + size / (1000.0 * ch.alg_bw_GBps))
    return chosen_plan(best, size, ctx.launch_us, channels)


def chosen_plan(ch: Choice, size: float, launch_us: float, channels: int) -> alg.WirePlan:
    """The chosen plan with its protocol's wire bytes, NCCL's latency beyond the launch as its
    synchronised steps, and the model's bandwidth as the least wire time. Each channel (one CTA,
    one comm core) moves an equal slice of the data over all the plan's hops, so the cores' work
    is `channels` equal shares (not one core group per peer)."""
    w = PROTO_WIRE[ch.proto]
    p = ch.plan
    far = max(t for _, t in p.peer_work)
    work = ((p.send_bytes * w / channels, far),) * channels
    return replace(p, algorithm=f"nccl:{ch.algo}/{ch.proto}", latency_s=max(0.0, ch.latency_us - launch_us) * 1e-6,
                   tx_s={k: v * w for k, v in p.tx_s.items()}, rx_s={k: v * w for k, v in p.rx_s.items()},
                   send_bytes=p.send_bytes * w, recv_bytes=p.recv_bytes * w,
                   group_wire_bytes=p.group_wire_bytes * w, port_bytes={k: v * w for k, v in p.port_bytes.items()},
                   peer_work=work, floor_s=size / (ch.alg_bw_GBps * 1e9))


def _p2p_latency(lay: Layout) -> float:
    """One step of concurrent sends: the farthest tier's α and flag (NCCL's tuning model has no
    send/recv latency)."""
    far = lay.net or lay.nvl
    return far.alpha_s + far.sync_s
