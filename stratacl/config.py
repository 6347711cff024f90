"""Typed config schema (Hydra structured configs) and semantic validation.

The dataclasses are registered with Hydra's ConfigStore, so a wrong type in a YAML file or an
override fails at compose time. `validate_run` then checks meaning (positive bandwidths, layouts
that fit the fabric, known presets) before anything is simulated, naming the field and the fix.
Values live in `conf/`; the defaults here are only shapes, not calibration.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from stratacl.errors import ConfigError

# --------------------------------------------------------------------------- fabric


@dataclass
class TierConfig:
    """One distance tier of the network: latency α and per-die bandwidth β over a plane."""

    alpha_us: float = MISSING
    beta_GBps: float = MISSING
    plane: str = "ub"  # which per-die port the bytes cross: sio | ub | rdma
    sync_us: float = 0.0  # flag write a synchronised algorithm step waits for on this tier


@dataclass
class TopologyConfig:
    dies_per_npu: int = 1
    npus_per_node: int = 8
    nodes: int = 1
    supernodes: int = 1  # nodes are split evenly among supernodes; beyond one is the scale-out tier


@dataclass
class SdmaConfig:
    engines: int = 0  # DMA engines per die
    engine_GBps: float = 0.0  # per-engine copy rate
    launch_us: dict[str, float] = field(default_factory=dict)  # per trigger: host | aicpu | device


@dataclass
class DieConfig:
    cube_cores: int = MISSING
    vector_cores: int = MISSING
    hbm_GB: float = MISSING
    hbm_GBps: float = MISSING
    cube_TFLOPs: float = MISSING  # dense BF16
    vector_TFLOPs: float = MISSING
    vector_core_move_GBps: float = MISSING  # bytes/s one vector core moves to a remote die
    cores_shared: bool = False  # GPUs: SMs do both matmul and communication (holds hit both)
    sdma: SdmaConfig = field(default_factory=SdmaConfig)


@dataclass
class SwitchConfig:
    """A two-tier switched scale-up network (fabric.fidelity=switch): per node `l1_per_node` L1
    chips, one per sub-plane, each with `l2_per_plane` links up to that plane's L2 chips; every L2
    chip has `l2_ports` ports (one per node). 0 L1 chips = no switch model."""

    l1_per_node: int = 0
    l2_per_plane: int = 0
    l2_ports: int = 0
    link_GBps: float = 0.0  # one L1↔L2 link, per direction
    routing: str = "spray"  # spray: a node's inter-node bytes spread over all its uplinks


@dataclass
class FabricConfig:
    name: str = MISSING
    description: str = ""
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    # distance tiers, nearest first; keys: die (same package), node, supernode, scaleout
    tiers: dict[str, TierConfig] = field(default_factory=dict)
    # per-die port rate per direction, by plane: the ceiling of every tier's achievable β on it
    port_GBps: dict[str, float] = field(default_factory=dict)
    die: DieConfig = field(default_factory=DieConfig)
    # die_ports: a die's port carries each tier's bytes at that tier's measured β (fast);
    # switch: ports at their nominal rate shared by all flows, each flow capped at its tier's β,
    # plus the switch's node uplink/downlink port groups (stratacl/fabric_switch.py)
    fidelity: str = "die_ports"
    switch: SwitchConfig = field(default_factory=SwitchConfig)


# --------------------------------------------------------------------------- library


class DataPath(StrEnum):
    staged = "staged"
    jit_register = "jit_register"
    pool = "pool"
    on_alloc = "on_alloc"


class Algorithm(StrEnum):
    ring = "ring"
    mesh = "mesh"
    fullmesh = "fullmesh"
    pairwise = "pairwise"
    rhd = "rhd"
    auto = "auto"
    hccl = "hccl"  # HCCL's own A3 selection: hierarchical / grouped algorithms (comm/hierarchical.py)
    hierarchical = "hierarchical"  # intra-server (double) ring + inter-server level 1, at every size


class Partitioning(StrEnum):
    uniform = "uniform"
    balanced = "balanced"


class Mover(StrEnum):
    vector_cores = "vector_cores"
    sdma = "sdma"


class Trigger(StrEnum):
    host = "host"
    aicpu = "aicpu"
    device = "device"


@dataclass
class LibraryConfig:
    """A communication library as a point in the design space (DESIGN.md §3)."""

    description: str = ""
    data_path: DataPath = DataPath.staged
    algorithm: Algorithm = Algorithm.ring
    auto_candidates: list[str] = field(default_factory=list)  # algorithm=auto chooses among these
    partitioning: Partitioning = Partitioning.uniform
    mover: Mover = Mover.vector_cores
    trigger: Trigger = Trigger.aicpu
    plane: str = "ub"  # ub | rdma: which network plane carries non-die traffic
    comm_cores: int = 24  # vector cores a communication kernel holds
    comm_buffer_MB: float = 200.0  # staged: size of each registered comm buffer (HCCL_BUFFSIZE)
    comm_buffers: int = 2  # staged: buffers per communicator (in + out)
    launch_us: float = 0.0  # fixed per-operator launch overhead on the critical path
    copy_GBps: float = 0.0  # staged: device-to-device copy rate (0 = HBM-bound)
    # memory the library holds per rank besides comm buffers (pool data path)
    pool_GB: float = 0.0  # pre-registered pool
    fragmentation_GB: dict[str, float] = field(default_factory=dict)  # per context: inference | training
    # registration costs (jit_register: on the critical path at first use; on_alloc: asynchronous)
    register_base_us: float = 0.0  # per buffer
    register_per_peer_us: float = 0.0  # per peer mapping (serialised on the page-table lock)
    # core partitioning (balanced): transfer unit per tier and cores one peer may use
    unit_KiB: dict[str, float] = field(default_factory=dict)  # per tier: die | node | supernode | scaleout
    fanout_cap: int = 4
    refine_units_below: float = 0.0  # balanced: halve the units while fewer than this many per core
    min_unit_KiB: float = 4.0  # balanced: the finest unit the policy generator cuts
    pipeline_chunks: int = 1  # staged: >1 overlaps the copies with the transfer in that many chunks
    # fraction of the staging copies a zero-copy path still does per collective (NCCL registration
    # does not remove staging for reducescatter and only partly for ring allreduce)
    stage_anyway: dict[str, float] = field(default_factory=dict)
    moe_layout_exchange: bool = True  # MoE dispatch: exchange per-peer counts first (an extra step)
    # algorithm=hccl: HCCL_ALGO's per-operator level-1 (inter-server) choice, e.g. {allreduce: ring,
    # alltoall: pairwise}; operators not listed use HCCL's adaptive choice
    hccl_algo: dict[str, str] = field(default_factory=dict)
    # the host in the loop: operators ("coll" or "coll:mode") whose arguments the host must read
    # first (host arrays, a CPU wait for received counts): a device→host copy + host round trip
    # each, and a graph split in a captured step
    host_sync: list[str] = field(default_factory=list)
    host_roundtrip_us: float = 0.0  # device→host copy of the counts + host handling + relaunch
    graph_launch_us: float = 0.0  # launching one captured graph (REFERENCE §2: 0.6-0.8 ms)
    moe_signal_rtts: float = 0.0  # dispatch/combine: extra round trips of remote-atomic signalling


# --------------------------------------------------------------------------- workloads


@dataclass
class WorkloadConfig:
    name: str = MISSING


# --------------------------------------------------------------------------- run


@dataclass
class OutputConfig:
    timeline: bool = True  # write timeline.json (turn off for big sweeps)
    timeline_max_ranks: int = 32  # per-rank tracks drawn for at most this many ranks
    utilisation: bool = False  # write utilisation.parquet (resource utilisation of the timeline replays)
    progress: bool = True


@dataclass
class RunConfig:
    workload: Any = MISSING
    fabric: FabricConfig = MISSING
    library: dict[str, LibraryConfig] = field(default_factory=dict)
    baseline: str = "hccl"
    seed: int = 0
    resume: bool = False  # skip the job when its output dir already holds summary.json
    output: OutputConfig = field(default_factory=OutputConfig)


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
    cs.store(group="fabric", name="fabric_schema", node=FabricConfig)


register_configs()

# Workload schemas live one module each in stratacl/schemas/ and register themselves on import.
import stratacl.schemas  # noqa: E402,F401

# --------------------------------------------------------------------------- validation


def _positive(value: float, field_name: str, fix: str = "use a value > 0") -> None:
    if not value > 0:
        raise ConfigError(field_name, f"must be positive, got {value!r}", fix)


def validate_fabric(fab: FabricConfig) -> None:
    topo = fab.topology
    for key in ("dies_per_npu", "npus_per_node", "nodes", "supernodes"):
        _positive(getattr(topo, key), f"fabric.topology.{key}")
    if topo.nodes % topo.supernodes:
        raise ConfigError(
            "fabric.topology.supernodes",
            f"{topo.nodes} nodes do not split evenly into {topo.supernodes} supernodes",
            "choose a divisor of fabric.topology.nodes",
        )
    if not fab.tiers:
        raise ConfigError("fabric.tiers", "no distance tiers defined", "add at least tier 'node'")
    for name, tier in fab.tiers.items():
        if name not in TIER_ORDER:
            raise ConfigError(f"fabric.tiers.{name}", "unknown tier", f"use one of {TIER_ORDER}")
        _positive(tier.beta_GBps, f"fabric.tiers.{name}.beta_GBps")
        if tier.sync_us < 0:
            raise ConfigError(f"fabric.tiers.{name}.sync_us", f"negative {tier.sync_us}", "use ≥ 0")
        if tier.alpha_us < 0:
            raise ConfigError(f"fabric.tiers.{name}.alpha_us", f"negative latency {tier.alpha_us}", "use ≥ 0")
        if tier.plane not in fab.port_GBps:
            raise ConfigError(
                f"fabric.tiers.{name}.plane",
                f"plane '{tier.plane}' has no port rate",
                f"add fabric.port_GBps.{tier.plane} or use one of {sorted(fab.port_GBps)}",
            )
        if tier.beta_GBps > fab.port_GBps[tier.plane]:
            raise ConfigError(f"fabric.tiers.{name}.beta_GBps",
                              f"{tier.beta_GBps} GB/s exceeds the {tier.plane} port rate "
                              f"{fab.port_GBps[tier.plane]} GB/s a die can drive",
                              f"lower it or raise fabric.port_GBps.{tier.plane}")
    for plane, rate in fab.port_GBps.items():
        _positive(rate, f"fabric.port_GBps.{plane}")
    if fab.fidelity not in ("die_ports", "switch"):
        raise ConfigError("fabric.fidelity", f"unknown fidelity '{fab.fidelity}'", "use die_ports or switch")
    sw = fab.switch
    if fab.fidelity == "switch":
        if sw.l1_per_node <= 0 or sw.l2_per_plane <= 0 or not sw.link_GBps > 0:
            raise ConfigError("fabric.switch", f"fabric '{fab.name}' has no switch model",
                              "set fabric.switch.l1_per_node, l2_per_plane, l2_ports, link_GBps "
                              "or use fabric.fidelity=die_ports")
        if sw.l2_ports < topo.nodes // topo.supernodes:
            raise ConfigError("fabric.switch.l2_ports", f"{sw.l2_ports} L2 ports cannot reach "
                              f"{topo.nodes // topo.supernodes} nodes of a supernode",
                              "one L2 port per node of the supernode")
        if sw.routing != "spray":
            raise ConfigError("fabric.switch.routing", f"unknown routing '{sw.routing}'", "use spray")
    die = fab.die
    for key in ("cube_cores", "vector_cores", "hbm_GB", "hbm_GBps", "cube_TFLOPs", "vector_TFLOPs",
                "vector_core_move_GBps"):
        _positive(getattr(die, key), f"fabric.die.{key}")
    if die.sdma.engines < 0:
        raise ConfigError("fabric.die.sdma.engines", "negative engine count", "use ≥ 0")
    if die.sdma.engines and not die.sdma.engine_GBps > 0:
        raise ConfigError("fabric.die.sdma.engine_GBps", "must be positive when engines > 0")


TIER_ORDER = ("die", "node", "supernode", "scaleout")


def validate_library(name: str, lib: LibraryConfig, fab: FabricConfig) -> None:
    where = f"library.{name}"
    if lib.plane not in fab.port_GBps:
        raise ConfigError(f"{where}.plane", f"fabric '{fab.name}' has no plane '{lib.plane}'",
                          f"use one of {sorted(fab.port_GBps)}")
    if not 0 < lib.comm_cores <= fab.die.vector_cores:
        raise ConfigError(f"{where}.comm_cores", f"{lib.comm_cores} is outside 1..{fab.die.vector_cores}",
                          "use at most the die's vector cores")
    if lib.data_path == DataPath.staged:
        _positive(lib.comm_buffer_MB, f"{where}.comm_buffer_MB", "staged libraries need a comm buffer")
    if lib.mover == Mover.sdma and fab.die.sdma.engines <= 0:
        raise ConfigError(f"{where}.mover", f"fabric '{fab.name}' has no SDMA engines",
                          "use mover=vector_cores or a fabric with fabric.die.sdma.engines > 0")
    if lib.mover == Mover.sdma and lib.trigger.value not in fab.die.sdma.launch_us:
        raise ConfigError(f"{where}.trigger", f"no SDMA launch cost for trigger '{lib.trigger.value}'",
                          f"add fabric.die.sdma.launch_us.{lib.trigger.value}")
    for key in ("launch_us", "copy_GBps", "pool_GB", "register_base_us", "register_per_peer_us"):
        if getattr(lib, key) < 0:
            raise ConfigError(f"{where}.{key}", "must be ≥ 0")
    for coll, frac in lib.stage_anyway.items():
        if not 0 <= frac <= 1:
            raise ConfigError(f"{where}.stage_anyway.{coll}", f"fraction {frac} outside 0..1")
    bad = [a for a in lib.auto_candidates if a not in ("ring", "mesh", "fullmesh", "rhd", "hierarchical", "hccl")]
    if bad:
        raise ConfigError(f"{where}.auto_candidates", f"unknown algorithms {bad}",
                          "use ring, mesh, fullmesh, rhd, hierarchical, hccl")
    for key in ("host_roundtrip_us", "graph_launch_us", "moe_signal_rtts"):
        if getattr(lib, key) < 0:
            raise ConfigError(f"{where}.{key}", "must be ≥ 0")
    for entry in lib.host_sync:
        coll, _, mode = entry.partition(":")
        if coll not in ("allreduce", "allgather", "reducescatter", "alltoall", "alltoallv", "broadcast",
                        "dispatch", "combine") or mode not in ("", "ht", "ll"):
            raise ConfigError(f"{where}.host_sync", f"unknown operator '{entry}'",
                              "use a collective name, optionally with :ht or :ll (dispatch:ht)")
    for op, algo in lib.hccl_algo.items():
        if algo not in ("ring", "nhr", "nb", "rhd", "pipeline", "pairwise", "auto"):
            raise ConfigError(f"{where}.hccl_algo.{op}", f"unknown level-1 algorithm '{algo}'",
                              "use ring, nhr, nb, rhd, pipeline (alltoall: pairwise) or auto")
    if lib.fanout_cap < 1:
        raise ConfigError(f"{where}.fanout_cap", f"must be ≥ 1, got {lib.fanout_cap}")
    if lib.refine_units_below < 0 or not lib.min_unit_KiB > 0:
        raise ConfigError(f"{where}.refine_units_below", "need refine_units_below ≥ 0 and min_unit_KiB > 0")
    if lib.pipeline_chunks < 1:
        raise ConfigError(f"{where}.pipeline_chunks", f"must be ≥ 1, got {lib.pipeline_chunks}")
    for tier, kib in lib.unit_KiB.items():
        if tier not in TIER_ORDER or not kib > 0:
            raise ConfigError(f"{where}.unit_KiB.{tier}", f"bad unit {kib!r} for tier '{tier}'",
                              f"positive KiB for tiers {TIER_ORDER}")
    if lib.partitioning == Partitioning.balanced and lib.mover == Mover.vector_cores and not lib.unit_KiB:
        raise ConfigError(f"{where}.unit_KiB", "balanced partitioning needs transfer unit sizes",
                          "e.g. unit_KiB: {die: 256, node: 256, supernode: 512}")


def world_size(fab: FabricConfig) -> int:
    t = fab.topology
    return t.dies_per_npu * t.npus_per_node * t.nodes


def validate_run(cfg: RunConfig) -> None:
    validate_fabric(cfg.fabric)
    if not cfg.library:
        raise ConfigError("library", "no library selected", "e.g. library=[hccl,stratacl]")
    for name, lib in cfg.library.items():
        validate_library(name, lib, cfg.fabric)
    if cfg.baseline not in cfg.library:
        raise ConfigError("baseline", f"'{cfg.baseline}' is not among the selected libraries "
                          f"{list(cfg.library)}", "add it to library=[...] or set baseline= one of them")


def to_object(cfg: DictConfig) -> RunConfig:
    """Resolve a composed DictConfig into typed dataclasses (enums included)."""
    obj = OmegaConf.to_object(cfg)
    assert isinstance(obj, RunConfig)
    return obj
