"""The fabric (docs/architecture.md): dies with cores, HBM and DMA engines, distance tiers, placement.

Placement is contiguous: rank r runs on die r; die -> NPU -> node -> supernode by integer division.
Every die has the same per-die resources; the engine keeps one fluid resource per (die, kind) and
measures loads in *seconds at the die's full capacity* so all resources have capacity 1.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from stratacl.config import TIER_ORDER, FabricConfig, Fidelity, Plane, validate_fabric, world_size
from stratacl.errors import ConfigError
from stratacl.machine.switch import SwitchModel
from stratacl.vocab import NumericFormat

if TYPE_CHECKING:
    from stratacl.machine.kernel_model import KernelModel

# Per-die fluid resources. Ports are per direction and per plane (every plane of the Plane enum,
# whether or not a fabric uses it: an unused port is never loaded); cores and DMA engines are held
# or shared; HBM is shared bandwidth.
PORTS = tuple(f"{plane}_{way}" for plane in Plane for way in ("tx", "rx"))
# last two: a node's switch uplinks / downlinks (fidelity=switch), loaded by role "sw"
# "submit": the host path that writes SDMA descriptors for a host trigger, shared by its streams
RESOURCES = (*PORTS, "hbm", "vec", "cube", "sdma", "submit", "l1_up", "l1_down")
R = {name: i for i, name in enumerate(RESOURCES)}
# A matmul format the die has no cube peak for runs as the hardware would: its operands are
# widened to the next wider format (fp4 -> fp8 -> bf16, int4 -> int8 -> bf16), e.g. FP8 weights
# on the 910C, which has no FP8 cube format, are dequantised to bf16.
_F = NumericFormat
FORMAT_FALLBACK = {k.value: v.value for k, v in {_F.fp4: _F.fp8, _F.fp8: _F.bf16, _F.int4: _F.int8, _F.int8: _F.bf16,
                                                 _F.fp16: _F.bf16, _F.fp32: _F.bf16}.items()}


@dataclass(frozen=True, slots=True)
class HostFacts:
    """A node's host CPUs on the fabric (fabric.host, conf `fabric.host`): die d sits on CPU
    `cpu_of(d)` of its node (ASSUMPTION: consecutive dies share a CPU, as processes bind to the
    nearest socket); host bytes cross the die's `plane` port, the CPU's link (per direction) and
    its DRAM (`dram_Bps`: reads and writes share it)."""

    cpus_per_node: int
    link_Bps: float  # one CPU's fabric attachment, per direction
    plane: Plane
    dram_bytes: float  # per CPU
    read_s: float  # small op latencies incl. software: own node
    write_s: float
    remote_read_s: float  # another node's CPU (the DRAM pool)
    remote_write_s: float
    dies_per_node: int
    dram_Bps: float = 0.0  # one CPU's DRAM bandwidth, reads + writes together (0: not modelled)

    @property
    def dies_per_cpu(self) -> int:
        return self.dies_per_node // self.cpus_per_node if self.cpus_per_node else 0

    def cpu_of(self, die: int) -> int:
        """Global index of the CPU die `die` is attached to."""
        node, local = divmod(int(die), self.dies_per_node)
        return node * self.cpus_per_node + local // self.dies_per_cpu

    def cpus(self, ranks: tuple[int, ...], pool: bool) -> tuple[int, ...]:
        """The CPUs an op's host bytes pass: each rank's own CPU, or (pool) every CPU of the nodes
        from the op's first rank's to its last rank's (the DRAM pool stripes over them)."""
        if not pool:
            return tuple(sorted({self.cpu_of(r) for r in ranks}))
        nodes = range(min(ranks) // self.dies_per_node, max(ranks) // self.dies_per_node + 1)
        return tuple(n * self.cpus_per_node + c for n in nodes for c in range(self.cpus_per_node))


@dataclass(frozen=True, slots=True)
class Tier:
    index: int  # 0 = die (same package) … 3 = scale-out
    name: str
    alpha_s: float
    beta_Bps: float
    plane: Plane
    sync_s: float = 0.0  # flag write a synchronised step waits for
    put_in_flight: int = 0  # SDMA puts / gets one queue keeps outstanding (0 = unbounded)
    get_in_flight: int = 0
    round_trip_s: float = 0.0  # a capped queue's wait for a completion
    store_Bps: float = 0.0  # the vector cores' remote stores (0 = beta_Bps)


class Fabric:
    """A validated, numeric view of a FabricConfig."""

    def __init__(self, cfg: FabricConfig) -> None:
        validate_fabric(cfg)
        self.cfg = cfg
        self.name = cfg.name
        topo = cfg.topology
        self.world = world_size(cfg)
        self.dies_per_npu = topo.dies_per_npu
        self.dies_per_node = topo.dies_per_npu * topo.npus_per_node
        self.dies_per_supernode = self.dies_per_node * (topo.nodes // topo.supernodes)
        self.tiers: dict[str, Tier] = {}
        for i, name in enumerate(TIER_ORDER):
            tc = cfg.tiers.get(name)
            if tc is None:
                continue
            self.tiers[name] = Tier(i, name, tc.alpha_us * 1e-6, tc.beta_GBps * 1e9, tc.plane,
                                    tc.sync_us * 1e-6, tc.in_flight.get("put", 0), tc.in_flight.get("get", 0),
                                    tc.round_trip_us * 1e-6, tc.store_GBps * 1e9)
        if self.dies_per_npu > 1 and "die" not in self.tiers:
            raise ConfigError("fabric.tiers.die", "NPUs have several dies but no 'die' tier",
                              "add fabric.tiers.die")
        if "node" not in self.tiers:
            raise ConfigError("fabric.tiers.node", "missing", "add fabric.tiers.node")
        if topo.nodes // topo.supernodes > 1 and "supernode" not in self.tiers:
            raise ConfigError("fabric.tiers.supernode", "several nodes but no 'supernode' tier",
                              "add fabric.tiers.supernode")
        if topo.supernodes > 1 and "scaleout" not in self.tiers:
            raise ConfigError("fabric.tiers.scaleout", "several supernodes but no 'scaleout' tier",
                              "add fabric.tiers.scaleout")
        self.tier_list = [self.tiers.get(n) for n in TIER_ORDER]
        die = cfg.die
        self.hbm_Bps = die.hbm_GBps * 1e9
        self.hbm_bytes = die.hbm_GB * 1e9
        self.cube_flops = die.cube_TFLOPs * 1e12
        self.cube_flops_by_format = {"bf16": self.cube_flops,
                                     **{k: v * 1e12 for k, v in die.cube_TFLOPs_by_format.items()}}
        bad = set(self.cube_flops_by_format) - set(FORMAT_FALLBACK) - {"bf16"}
        if bad:
            raise ConfigError("fabric.die.cube_TFLOPs_by_format", f"unknown formats {sorted(bad)}",
                              f"use keys of {sorted(FORMAT_FALLBACK)}")
        self.vector_flops = die.vector_TFLOPs * 1e12
        self.vector_cores = die.vector_cores
        self.cube_cores = die.cube_cores
        self.core_move_Bps = die.vector_core_move_GBps * 1e9
        self.cores_shared = die.cores_shared
        self.graph_launch_s = die.graph_launch_us * 1e-6  # one captured graph's launch by the host
        self.sdma_Bps = die.sdma.engines * die.sdma.engine_GBps * 1e9
        self.port_Bps = {p: r * 1e9 for p, r in cfg.port_GBps.items()}
        self.fidelity = cfg.fidelity
        # NCCL's tuning tables (stratacl/comm/nccl.py)
        self.gpu_arch = "hopper" if cfg.gpu_arch == "none" else str(cfg.gpu_arch)
        self.nvls = bool(cfg.nvls)
        self.host_cpu = str(cfg.host_cpu)
        h = cfg.host
        self.host = HostFacts(h.cpus_per_node, h.link_GBps * 1e9, h.plane, h.dram_GB * 1e9,
                              h.read_us * 1e-6, h.write_us * 1e-6, h.remote_read_us * 1e-6,
                              h.remote_write_us * 1e-6, self.dies_per_node,
                              h.dram_channels * h.dram_channel_GBps * 1e9)
        # the host tier as flat attributes (contract: Fabric.host_*); DRAM per CPU / per die
        self.host_cpus_per_node, self.host_link_Bps = self.host.cpus_per_node, self.host.link_Bps
        self.host_dram_bytes = self.host.dram_bytes
        self.host_dram_bytes_per_die = self.host.dram_bytes / self.host.dies_per_cpu if h.cpus_per_node else 0.0
        self.host_read_s, self.host_write_s = self.host.read_s, self.host.write_s
        self.switch = SwitchModel(cfg.switch, self.dies_per_node, self.port_Bps.get(Plane.ub, 0.0)) \
            if cfg.fidelity == Fidelity.switch else None
        self.sdma_launch_s = {k: v * 1e-6 for k, v in die.sdma.launch_us.items()}
        # SDMA submission: seconds to write one descriptor per trigger, bytes one descriptor moves,
        # engine start-up after the first doorbell (stratacl/comm/sdma.py)
        self.sdma_descriptor_s = {k: v * 1e-6 for k, v in die.sdma.descriptor_us.items()}
        self.sdma_descriptor_bytes = die.sdma.descriptor_KiB * 1024
        self.sdma_startup_s = die.sdma.startup_us * 1e-6
        self.sdma_reduces = bool(die.sdma.reduces)  # false: reducing transfers run on the cores
        # a core group (Ascend split architecture: 1 AIC + 2 AIV on a 910C die) is what a mixed
        # kernel's block runs on
        self.aiv_per_group = die.vector_cores / die.cube_cores
        self._kernel_model: KernelModel | None = None  # stratacl.machine.kernel_model.kernel_model builds it once

    def cube_format(self, fmt: str) -> str:
        """The format a matmul in `fmt` actually runs in on this die (itself, or widened)."""
        fmt = fmt or "bf16"
        while fmt not in self.cube_flops_by_format:
            fmt = FORMAT_FALLBACK.get(fmt, "bf16")
        return fmt

    def cube_peak(self, fmt: str) -> float:
        """Dense cube FLOP/s of a matmul in `fmt` ("" = bf16)."""
        return self.cube_flops_by_format[self.cube_format(fmt)]

    # ------------------------------------------------------------------ placement
    def check_ranks(self, n: int, field: str) -> None:
        if not 0 < n <= self.world:
            raise ConfigError(field, f"{n} ranks do not fit fabric '{self.name}' with {self.world} dies",
                              f"use 1..{self.world} ranks or a larger fabric")

    def tier_index(self, a: np.ndarray | int, b: np.ndarray | int) -> np.ndarray:
        """Distance tier between dies a and b (vectorised): 0 die, 1 node, 2 supernode, 3 scale-out."""
        a = np.asarray(a)
        b = np.asarray(b)
        same_npu = a // self.dies_per_npu == b // self.dies_per_npu
        same_node = a // self.dies_per_node == b // self.dies_per_node
        same_sn = a // self.dies_per_supernode == b // self.dies_per_supernode
        return np.where(same_npu, 0, np.where(same_node, 1, np.where(same_sn, 2, 3)))

    def storing(self) -> Fabric:
        """This fabric as a comm kernel whose vector cores store into the peers' memory sees it:
        every tier with a `store_GBps` carries its bytes at that rate (REFERENCE §1: the measured
        NPU-to-NPU writes run below the reads). The same object when no tier sets one."""
        if not any(t.store_Bps > 0 for t in self.tiers.values()):
            return self
        view = copy.copy(self)
        view.tiers = {n: replace(t, beta_Bps=t.store_Bps) if t.store_Bps > 0 else t for n, t in self.tiers.items()}
        view.tier_list = [view.tiers.get(n) for n in TIER_ORDER]
        return view

    def tier(self, index: int, plane: Plane = Plane.ub) -> Tier:
        """The tier at a distance, for a library using `plane` for inter-node traffic.

        A library on the RDMA plane (DeepEP-style) keeps intra-node traffic on the scale-up links
        and sends everything beyond the node over RoCE; on any other plane each tier's own plane is used.
        """
        if plane == Plane.rdma and index >= 2 and "scaleout" in self.tiers:
            return self.tiers["scaleout"]
        t = self.tier_list[index]
        if t is None:  # e.g. single-die NPUs have no die tier: fall back to the next one out
            return self.tier(index + 1, plane)
        return t

    @lru_cache(maxsize=4096)  # noqa: B019 - fabric objects live for a whole run
    def group_tiers(self, group: tuple[int, ...]) -> np.ndarray:
        """n×n matrix of distance tiers between the members of a communicator."""
        g = np.asarray(group)
        return self.tier_index(g[:, None], g[None, :])
