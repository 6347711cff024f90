"""NCCL's own tuning model (how NCCL picks an algorithm and a protocol), as NCCL computes it.

Source: NVIDIA/nccl@5067397c2676d5aed50042fc39e5c8ee96eb0027 src/graph/tuning.cc —
`ncclTunerConstantsDefaults` (base latencies, hardware latencies per protocol, per-channel caps),
`ncclTopoTuneModel` (bus bandwidth per algorithm × protocol, its refinements and latencies) and
`ncclTopoGetAlgoTime` (time = latency + bytes / bandwidth, the tree correction factors, the ring
plateau). Every constant below is that file's, at that commit.

One deliberate difference: NCCL gets `nChannels × bw` (bwIntra for ≤ 2 nodes, bwInter beyond)
from its topology search; here the raw bus bandwidth of each algorithm comes from the harness's
own wire plan of it on the fabric (stratacl/comm/nccl.py), so the model and the physics agree
on the fabric's links. The refinements (protocol factors, per-channel caps) are NCCL's.
"""

from __future__ import annotations

from dataclasses import dataclass

ALGOS = ("tree", "ring", "nvls", "nvls_tree")
PROTOS = ("LL", "LL128", "Simple")
ARCHS = ("volta", "ampere", "hopper", "blackwell")  # NCCL_*_COMPCAP_IDX order

# baseLatencies [algo][proto] in µs (Tree, Ring, NVLS, NVLS Tree)
BASE_LAT = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "nvls": (0.0, 0.0, 0.0),
            "nvls_tree": (0.0, 0.0, 0.0)}
# hwLatencies [hw][algo][proto] in µs
HW_LAT = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "nvls": (0.0, 0.0, 25.0),
               "nvls_tree": (0.0, 0.0, 25.0)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "nvls": (0.0, 0.0, 18.0),
            "nvls_tree": (0.0, 0.0, 20.9)},
}
# llMaxBws [index1][nodes index]: single node by GPU arch; multi-node by CPU (0 = Intel, 1 = AMD)
LL_MAX_BW_1NODE = {"volta": 39.0, "ampere": 87.7, "hopper": 141.0, "blackwell": 2 * 141.0}
LL_MAX_BW_NET = {"intel": (39.0, 20.4), "amd": (22.5, 19.0)}  # (N2, N4)
# per-channel caps [arch] -> (N1, N2, N4), GB/s
PER_CH_RING_LL128 = {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0),
                     "hopper": (36.7, 36.7, 36.7), "blackwell": (40.0, 40.0, 40.0)}
PER_CH_TREE_LL128 = {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0),
                     "hopper": (36.7, 36.7, 29.0), "blackwell": (55.6, 31.67, 20.0)}
PER_CH_TREE = {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8),
               "hopper": (38.7, 41.4, 36.0), "blackwell": (70.0, 42.8, 24.0)}
PER_CH_NVLS_TREE = {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8),
                    "hopper": (0.0, 57.7, 45.5), "blackwell": (0.0, 96.0, 80.0)}
NVLS_EFFICIENCY = {"volta": 0.0, "ampere": 0.0, "hopper": 0.85, "blackwell": 0.74}
# treeCorrectionFactor [proto][log2(bytes >> 6)], powers of two 64 B .. 256 MiB
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
}
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0}  # getNetOverhead (x86); ×3 for Simple
RING_PLATEAU = 1.4  # ring Simple all-reduce across nodes, compute capability ≥ 80 (1.9 below)


@dataclass(frozen=True, slots=True)
class Comm:
    """What NCCL's model knows of a communicator."""

    coll: str
    n: int  # ranks
    nodes: int  # NVLink domains (NCCL's nodes)
    channels: int
    arch: str = "hopper"
    cpu: str = "intel"  # ASSUMPTION: x86 Intel hosts (getNetOverhead 1 µs). Knob via the fabric.

    @property
    def ppn(self) -> float:
        return self.n / self.nodes

    @property
    def nsteps(self) -> int:
        return {"allreduce": 2 * (self.n - 1), "allgather": self.n - 1, "reducescatter": self.n - 1}.get(
            self.coll, self.n)

    @property
    def n_idx(self) -> int:
        return min(self.nodes, 3) - 1  # index2: N1 / N2 / N4 (more than two nodes)


def log2i(x: int) -> int:
    """NCCL's log2i: floor(log2 x)."""
    return int(x).bit_length() - 1


def ratio(c: Comm, algo: str) -> float:
    """Bus bandwidth → algorithm bandwidth (tuning.cc 'Convert bus BW to algorithm BW'); 1 for
    non-ring all-gather / reduce-scatter, which NCCL leaves in bus units."""
    if algo != "ring" and c.coll in ("allgather", "reducescatter"):
        return 1.0
    return c.n / c.nsteps if algo in ("ring", "nvls", "nvls_tree") else 0.5


def refine(c: Comm, algo: str, proto: str, bus_bw: float) -> float:
    """ncclTopoTuneModel's refinements of a bus bandwidth `bus_bw` (GB/s, nChannels × bw)."""
    ch, i = c.channels, c.n_idx
    if c.nodes == 1:
        ll_max = LL_MAX_BW_1NODE[c.arch]
    else:
        ll_max = LL_MAX_BW_NET[c.cpu][0 if c.nodes <= 2 else 1]
    if algo == "ring" and proto == "LL":
        bus_bw = min(ll_max, bus_bw * .5)
    if algo == "ring" and proto == "LL128":
        bus_bw = min(bus_bw * 0.92, ch * PER_CH_RING_LL128[c.arch][i])
    if algo == "tree" and c.coll == "allreduce":
        bus_bw = min(bus_bw * .92, ch * PER_CH_TREE[c.arch][i])
    if algo == "tree" and proto == "LL":
        bus_bw = min(bus_bw / 3.8, ll_max)
    if algo == "tree" and proto == "LL128":
        bus_bw = min(bus_bw * (7.0 / 9.0 if c.nodes == 1 else 120.0 / 128.0), ch * PER_CH_TREE_LL128[c.arch][i])
    return bus_bw


def latency_us(c: Comm, algo: str, proto: str) -> float:
    """comm->latencies[coll][algo][proto] (intra-node links are NVLink)."""
    p = PROTOS.index(proto)
    intra = HW_LAT["nvlink"][algo][p]
    inter = HW_LAT["net"]["tree" if c.ppn == 1 else algo][p]  # graphs[a]->latencyInter = 0
    lat = BASE_LAT[algo][p]
    if algo == "ring":
        if c.coll == "broadcast":
            return lat + HW_LAT["net" if c.nodes > 1 else "nvlink"]["ring"][p]  # sameChannels
        over = NET_OVERHEAD_US[c.cpu] * (3 if proto == "Simple" else 1) if c.nodes > 1 else 0.0
        intra = max(intra, over)
        inter_steps = 0 if c.nodes == 1 else (2 if c.coll == "allreduce" else 1) * (c.nodes - 1)
        return lat + (c.nsteps - inter_steps) * intra + inter_steps * inter
    if algo == "tree":
        return lat + 2 * ((c.n // c.nodes - 1) * intra + log2i(c.nodes) * inter)
    if algo == "nvls":
        return intra + (inter if c.nodes > 1 else 0.0)
    return lat + intra + 2 * log2i(c.nodes) * inter  # nvls_tree


def enabled(c: Comm, algo: str, proto: str, nvls: bool) -> bool:
    """The (algorithm, protocol) pairs ncclTopoTuneModel prices for this collective with
    NCCL's defaults (no NCCL_ALGO / NCCL_PROTO, CollNet off, PAT not modelled)."""
    if algo in ("nvls", "nvls_tree") and (proto != "Simple" or not nvls or c.channels < 2
                                           or NVLS_EFFICIENCY[c.arch] == 0):
        return False
    if c.coll == "broadcast":
        return algo == "ring"
    if c.coll in ("allgather", "reducescatter"):
        return algo == "ring" or (algo == "nvls" and c.nodes == 1)  # NVLS across nodes needs CollNet
    if c.coll != "allreduce":
        return False
    if algo == "nvls":  # 'Disable ... NVLS && nNodes > 1' without CollNet
        return c.nodes == 1
    if algo == "nvls_tree":  # 'Disable NVLS Tree on a single node'
        return c.nodes > 1
    return True


def time_parts(c: Comm, algo: str, proto: str, nbytes: float, alg_bw: float) -> tuple[float, float]:
    """ncclTopoGetAlgoTime's two terms: (latency µs, algorithm bandwidth GB/s) with the tree
    correction factor and the ring plateau applied; time = latency + bytes / (1000 × bw)."""
    lat = latency_us(c, algo, proto)
    log_size = int(nbytes) >> 6
    log_size = log_size.bit_length() - 1 if log_size else -1  # log2i
    if algo == "tree" and c.coll == "allreduce" and 0 <= log_size < 23:
        alg_bw *= TREE_CORRECTION[proto][log_size]
    if algo == "nvls_tree" and c.coll == "allreduce" and c.arch == "blackwell" and 0 <= log_size < 24:
        alg_bw *= TREE_CORRECTION[proto][log_size]  # compute capability ≥ 100 on x86 hosts
    if algo == "ring" and proto == "Simple" and c.nodes > 1 and c.coll == "allreduce" \
            and nbytes / (c.channels * c.n) >= 64:
        lat *= RING_PLATEAU
    return lat, alg_bw
