"""Typed config schema (Hydra structured configs) and semantic validation.

The dataclasses are registered with Hydra's ConfigStore, so a wrong type or an unknown choice
(enums) in a YAML file or an override fails at compose time. Every numeric field declares its range
(`knob(..., gt=0)`, stratacl/workload_config.py); `validate_run` checks those ranges over the whole
tree, then the cross-field meaning (β under the port rate, planes the fabric has, known presets),
before anything is simulated, naming the field and the fix.
Values live in `conf/`; the defaults here are only shapes, not calibration.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf, open_dict

from stratacl import workload_registry
from stratacl.errors import ConfigError
from stratacl.paths import CONF
from stratacl.trace import COLLECTIVES, MOE_MODES
from stratacl.workload_config import check_ranges, knob

# --------------------------------------------------------------------------- fabric


class Plane(StrEnum):
    """Physical network planes a die has ports on (one fluid port resource per plane and direction,
    stratacl.machine.fabric.RESOURCES). A fabric lists the planes it has in `port_GBps`."""

    sio = "sio"  # Ascend die-to-die link inside a package
    ub = "ub"  # Huawei Unified Bus scale-up (CloudMatrix384)
    nvlink = "nvlink"  # NVIDIA NVLink / NVSwitch scale-up
    rdma = "rdma"  # RoCE / InfiniBand scale-out NICs
    pcie = "pcie"  # a GPU's PCIe link to its host CPU (through PCIe switches)
    c2c = "c2c"  # NVLink-C2C between a Grace CPU and its Blackwell GPUs (GB200)


class OneSided(StrEnum):
    """A one-sided transfer writes to the peer's memory (put) or reads from it (get)."""

    put = "put"
    get = "get"


ONE_SIDED = tuple(m.value for m in OneSided)


@dataclass
class TierConfig:
    """One distance tier of the network: latency α and per-die bandwidth β over a plane."""

    alpha_us: float = knob(MISSING, ge=0)
    beta_GBps: float = knob(MISSING, gt=0)
    plane: Plane = Plane.ub  # which per-die port the bytes cross
    sync_us: float = knob(0.0, ge=0)  # flag write a synchronised algorithm step waits for on this tier
    # SDMA transfers one queue keeps outstanding on this tier, by one-sided op (put | get); a
    # capped queue waits `round_trip_us` for a completion per window (stratacl/comm/sdma.py).
    # A missing key or 0 = unbounded.
    in_flight: dict[str, int] = knob(factory=dict, ge=0)
    round_trip_us: float = knob(0.0, ge=0)
    # per-die rate of the vector cores' stores into a peer's memory on this tier (a comm kernel
    # with `library.<name>.core_access: put`); 0 = beta_GBps, as their loads and every DMA transfer
    store_GBps: float = knob(0.0, ge=0)


@dataclass
class TopologyConfig:
    dies_per_npu: int = knob(1, ge=1)
    npus_per_node: int = knob(8, ge=1)
    nodes: int = knob(1, ge=1)
    supernodes: int = knob(1, ge=1)  # nodes are split evenly among supernodes; beyond one is the scale-out tier


@dataclass
class SdmaConfig:
    engines: int = knob(0, ge=0)  # DMA engines per die
    engine_GBps: float = knob(0.0, ge=0)  # per-engine copy rate (> 0 when engines > 0)
    launch_us: dict[str, float] = knob(factory=dict, ge=0)  # per trigger: host | aicpu | device
    descriptor_us: dict[str, float] = knob(factory=dict, ge=0)  # per trigger: time to write one descriptor
    descriptor_KiB: float = knob(1024.0, gt=0)  # most bytes one descriptor moves (larger payloads take several)
    startup_us: float = knob(0.0, ge=0)  # engine start-up from the first doorbell to the first byte moving
    # whether the engines reduce (read two operands, write their sum); false: a reducing operator's
    # transfer runs on the vector cores instead (GPU copy engines cannot reduce, REFERENCE §7)
    reduces: bool = True


@dataclass
class KernelClassConfig:
    """Achieved throughput of one kernel class on a die (stratacl/machine/kernel_model.py). Defaults are the
    ideal kernel (the old roofline): full peak, full HBM rate, no tile effects."""

    # fraction of the die's compute peak the class attains, by the format its matmuls run in
    # (bf16, fp8, int8, ...; "any" = every format not listed; none = 1)
    compute_fraction: dict[str, float] = knob(factory=dict, gt=0, le=1)
    hbm_fraction: float = knob(1.0, gt=0, le=1)  # fraction of the die's HBM rate it attains
    # output tile sizes the kernel chooses from (it takes the pair with the least padded, wave-
    # quantised work, as DeepGEMM's heuristic does); [] = no tile/wave effects
    tile_m: list[int] = knob(factory=list, ge=1)
    tile_n: list[int] = knob(factory=list, ge=1)
    k_fill: float = knob(0.0, ge=0)  # pipeline fill per tile, in elements of k (prologue/epilogue)
    # attention backward: prologue/epilogue of each key block (loading its K/V tiles, writing its
    # dK/dV, the dQ and softmax-statistics passes around the kernel), in query tiles of its walk
    walk_fill: float = knob(0.0, ge=0)
    # ramp of the whole kernel on the device (first loads in flight, last tiles' epilogue): added
    # to its time alone, beside the launch the host pays
    fill_us: float = knob(0.0, ge=0)


@dataclass
class KernelModelConfig:
    """Kernel-level facts of a die: what stratacl/machine/kernel_model.py prices compute with. The defaults
    are the ideal kernel (100 % of peak, no launch cost, no re-reads)."""

    launch_us: float = knob(0.0, ge=0)  # per kernel, paid once before it runs
    # cube cores (core groups) a kernel needs to reach the die's HBM rate; fewer reach a share
    hbm_saturation_cores: float = knob(1.0, gt=0)
    # on-chip buffer the die shares operand panels through (GPU L2, Ascend L2): GEMM operands are
    # re-read from HBM once per output block whose panels fit in it
    onchip_buffer_MiB: float = knob(1.0e9, gt=0)
    # part of the memory-latency growth u/(1-u) behind communication's HBM traffic (share u of the
    # die's HBM) a kernel does not hide (stratacl/engine/interference.py); 0 = ideal overlap
    comm_hbm_stall: float = knob(0.0, ge=0, le=1)  # a part: at most all of the growth
    # by KernelClass value, plus generic_cube / generic_vector / generic_mixed for kernels whose
    # class is not stated; a class not listed is priced as the ideal kernel
    classes: dict[str, KernelClassConfig] = field(default_factory=dict)


@dataclass
class DieConfig:
    cube_cores: int = knob(MISSING, ge=1)
    vector_cores: int = knob(MISSING, ge=1)
    hbm_GB: float = knob(MISSING, gt=0)
    hbm_GBps: float = knob(MISSING, gt=0)
    cube_TFLOPs: float = knob(MISSING, gt=0)  # dense BF16
    # dense cube peak of other numeric formats (int8, fp8, int4, fp4, fp16); a format not listed
    # runs widened to the next format the die has (stratacl.machine.fabric.FORMAT_FALLBACK)
    cube_TFLOPs_by_format: dict[str, float] = knob(factory=dict, gt=0)
    vector_TFLOPs: float = knob(MISSING, gt=0)
    vector_core_move_GBps: float = knob(MISSING, gt=0)  # bytes/s one vector core moves to a remote die
    cores_shared: bool = False  # GPUs: SMs do both matmul and communication (holds hit both)
    # host launching one captured graph of a model step (ACL graph / CUDA graph): a runtime fact of
    # the die and its driver, paid once per captured step (LibraryModel.step_graph_launch_s)
    graph_launch_us: float = knob(MISSING, ge=0)
    sdma: SdmaConfig = field(default_factory=SdmaConfig)
    kernel: KernelModelConfig = field(default_factory=KernelModelConfig)


class Fidelity(StrEnum):
    """How the network is modelled (FabricConfig.fidelity)."""

    die_ports = "die_ports"  # a die's port carries each tier's bytes at that tier's measured β (fast)
    switch = "switch"  # ports at their nominal rate shared by all flows + the switch's port groups


class Routing(StrEnum):
    """How the switch routes a node's inter-node bytes (SwitchConfig.routing)."""

    spray = "spray"  # spread over all of the node's uplinks


@dataclass
class SwitchConfig:
    """A two-tier switched scale-up network (fabric.fidelity=switch): per node `l1_per_node` L1
    chips, one per sub-plane, each with `l2_per_plane` links up to that plane's L2 chips; every L2
    chip has `l2_ports` ports (one per node). 0 L1 chips = no switch model."""

    l1_per_node: int = knob(0, ge=0)
    l2_per_plane: int = knob(0, ge=0)
    l2_ports: int = knob(0, ge=0)
    link_GBps: float = knob(0.0, ge=0)  # one L1↔L2 link, per direction
    routing: Routing = Routing.spray


class GpuArch(StrEnum):
    """GPU generation, as NCCL's tuning tables index it (src/graph/tuning.cc compCapIndex)."""

    none = "none"  # not an NVIDIA GPU: algorithm=nccl uses the Hopper tables
    volta = "volta"
    ampere = "ampere"
    hopper = "hopper"
    blackwell = "blackwell"


class HostCpu(StrEnum):
    intel = "intel"
    amd = "amd"


@dataclass
class HostConfig:
    """A node's host CPUs as fabric endpoints: their DRAM and their attachment to the
    dies. Host<->device bytes cross the die's `plane` port (shared with that plane's other traffic)
    and the CPU's own `link_GBps` (shared by the dies attached to it). cpus_per_node=0: no host tier."""

    cpus_per_node: int = knob(0, ge=0)
    link_GBps: float = knob(0.0, ge=0)  # one CPU's fabric attachment, per direction
    plane: Plane = Plane.ub  # the die port host bytes cross
    dram_GB: float = knob(0.0, ge=0)  # DRAM per CPU
    # DRAM bandwidth per CPU socket = channels × peak per channel (DDR: MT/s × 8 B), shared by reads
    # and writes and by the dies on that CPU; 0 channels = not modelled (the link alone bounds)
    dram_channels: int = knob(0, ge=0)
    dram_channel_GBps: float = knob(0.0, ge=0)
    # one small (512 B) device op on host memory incl. software: the CPU of the die's own node
    # (local) and a CPU of another node (remote: the DRAM pool)
    read_us: float = knob(0.0, ge=0)
    write_us: float = knob(0.0, ge=0)
    remote_read_us: float = knob(0.0, ge=0)
    remote_write_us: float = knob(0.0, ge=0)


@dataclass
class FabricConfig:
    name: str = MISSING
    description: str = ""
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    # distance tiers, nearest first; keys: die (same package), node, supernode, scaleout
    tiers: dict[str, TierConfig] = field(default_factory=dict)
    # per-die port rate per direction, by plane: the ceiling of every tier's achievable β on it
    port_GBps: dict[Plane, float] = knob(factory=dict, gt=0)
    die: DieConfig = field(default_factory=DieConfig)
    # switch: each flow also capped at its tier's β; the port groups in stratacl/machine/switch.py
    fidelity: Fidelity = Fidelity.die_ports
    switch: SwitchConfig = field(default_factory=SwitchConfig)
    # NVIDIA GPU fabrics (read by algorithm=nccl, stratacl/comm/nccl.py): the GPU generation that
    # indexes NCCL's tuning tables, whether the NVLink switches reduce in-switch (NVLS / NVLink
    # SHARP: NVSwitch 3 and later), and the host CPU vendor (NCCL's network overhead and LL caps)
    gpu_arch: GpuArch = GpuArch.none
    nvls: bool = False
    host_cpu: HostCpu = HostCpu.intel
    host: HostConfig = field(default_factory=HostConfig)  # CPUs and DRAM on the fabric


# --------------------------------------------------------------------------- library


class DataPath(StrEnum):
    staged = "staged"
    jit_register = "jit_register"
    pool = "pool"
    on_alloc = "on_alloc"


class RegistrationMechanism(StrEnum):
    """How user buffers become remotely accessible (what a data path implies, comm/datapath.py)."""

    none = "none"  # not at all: staged copies through comm buffers, or a pre-registered pool
    jit = "jit"  # at first use, cached (jit_register)
    on_alloc = "on_alloc"  # when the allocator maps them (on_alloc)


class JitMatch(StrEnum):
    """How a JIT registration cache matches a buffer (stratacl/memory/registration_cache.py)."""

    cover = "cover"  # any registration covering the buffer's pages hits (NCCL's ncclRegFind)
    exact = "exact"  # only the very (address, size) range registered before hits


class Algorithm(StrEnum):
    ring = "ring"
    mesh = "mesh"
    fullmesh = "fullmesh"
    fullmesh_sio = "fullmesh_sio"  # full mesh over UB with the package peer relaying over SIO (algorithms.fullmesh_sio)
    pairwise = "pairwise"
    rhd = "rhd"
    auto = "auto"
    hccl = "hccl"  # HCCL's own A3 selection: hierarchical / grouped algorithms (comm/hierarchical.py)
    hierarchical = "hierarchical"  # intra-server (double) ring + inter-server level 1, at every size
    nccl = "nccl"  # NCCL's own choice: ring / tree / NVLS / NVLS-tree × LL / LL128 / Simple (comm/nccl.py)


class MoeLlWindows(StrEnum):
    """Where a low-latency MoE dispatch/combine lands each peer's tokens on the receiver."""

    # fixed per-expert receive slots: one window (a start-up) per expert of the peer the tokens hit
    # (DeepEP's low-latency kernels, CANN MoeDistributeDispatch)
    per_expert = "per_expert"
    # one packed region per peer at its receive displacement: dispatch lowered onto an
    # all-to-all-v (HcclAlltoAllV rdispls, NCCL grouped send/recv)
    per_peer = "per_peer"
    # per-expert slots, but every token copy its own store (a start-up each): CANN's fused
    # MoeDistributeDispatchV2 / CombineV2 issue one DataCopyPad per token copy into the peer's
    # window (ops-transformer mc2/moe_distribute_dispatch_v2 SendToMoeExpert,
    # moe_distribute_combine_v2 ExpertAlltoAllDispatchCopyAdd)
    per_copy = "per_copy"


class MoeHtPath(StrEnum):
    """How a high-throughput MoE dispatch/combine crosses nodes (stratacl/comm/ep.py)."""

    flat = "flat"  # one copy per destination rank, straight to it (a rank-level full mesh)
    # one copy per destination node over the scale-out plane to the GPU with the same local index,
    # forwarded inside the node over the scale-up links (DeepEP normal kernels, CANN "hierarchy")
    node_forward = "node_forward"


class HcclLevel1(StrEnum):
    """HCCL_ALGO's level-1 (inter-server) algorithm of one operator (hicann/hccl docs/zh/user_guide/
    hccl_env/HCCL_ALGO.md); comm/hierarchical.py runs them."""

    ring = "ring"
    nhr = "nhr"
    nb = "nb"
    rhd = "rhd"
    pipeline = "pipeline"
    pairwise = "pairwise"  # alltoall only
    auto = "auto"  # HCCL's adaptive choice


MOE_COPY_KEYS = ("dispatch_ll", "combine_ll", "dispatch_ht", "combine_ht")


class Partitioning(StrEnum):
    uniform = "uniform"  # each peer a fixed core group (or peers dealt round-robin to cores)
    balanced = "balanced"  # StrataCL §4.3: tier-sized units by LPT
    even = "even"  # token copies dealt evenly over the cores whatever their peer (CANN's fused MoE ops)


class Mover(StrEnum):
    vector_cores = "vector_cores"
    sdma = "sdma"


class Trigger(StrEnum):
    host = "host"
    aicpu = "aicpu"
    device = "device"


class ExpansionMode(StrEnum):
    """HCCL_OP_EXPANSION_MODE: where the algorithm is expanded, which decides the data mover."""

    custom = "custom"  # mover and trigger as configured
    ai_cpu = "ai_cpu"  # AI CPU writes SDMA task descriptors: mover sdma, trigger aicpu, no AI core held
    aiv = "aiv"  # vector cores run the algorithm and move the data: mover vector_cores


@dataclass
class LibraryConfig:
    """A communication library as a point in the design space (docs/architecture.md)."""

    description: str = ""
    # the mechanisms, by registered name (stratacl/comm/kinds.py): a built-in's enum value below or
    # a plugin's name (RunConfig.plugins)
    data_path: str = DataPath.staged.value
    algorithm: str = Algorithm.ring.value
    auto_candidates: list[Algorithm] = field(default_factory=list)  # algorithm=auto chooses among these
    partitioning: Partitioning = Partitioning.uniform
    mover: str = Mover.vector_cores.value
    trigger: Trigger = Trigger.aicpu
    # the scale-up plane it uses beyond the die (ub on Ascend, nvlink on NVIDIA), or rdma: everything
    # beyond the node over the NICs (DeepEP-style)
    plane: Plane = Plane.ub
    comm_cores: int = knob(24, ge=1)  # vector cores a communication kernel holds
    comm_buffer_MiB: float = knob(200.0, ge=0)  # staged: size of each comm buffer in MiB (HCCL_BUFFSIZE / NCCL_BUFFSIZE)
    comm_buffers: int = knob(2, ge=0)  # staged: buffers per communicator (in + out)
    launch_us: float = knob(0.0, ge=0)  # fixed per-operator launch overhead on the critical path
    copy_GBps: float = knob(0.0, ge=0)  # staged: device-to-device copy rate (0 = HBM-bound)
    # memory the library holds per rank besides comm buffers (pool data path); the fragmentation
    # its setting of the device allocator causes emerges from the allocator model (stratacl/memory)
    pool_GB: float = knob(0.0, ge=0)  # pre-registered pool
    # registration costs (jit_register: on the critical path at first use; on_alloc: asynchronous)
    register_base_us: float = knob(0.0, ge=0)  # per buffer
    register_per_peer_us: float = knob(0.0, ge=0)  # per peer mapping (serialised on the page-table lock)
    jit_cache_match: JitMatch = JitMatch.exact  # jit_register: how the registration cache matches buffers
    # core partitioning (balanced): transfer unit per tier and cores one peer may use
    unit_KiB: dict[str, float] = knob(factory=dict, gt=0)  # per tier: die | node | supernode | scaleout
    fanout_cap: int = knob(4, ge=1)
    refine_units_below: float = knob(0.0, ge=0)  # balanced: halve the units while fewer than this many per core
    min_unit_KiB: float = knob(4.0, gt=0)  # balanced: the finest unit the policy generator cuts
    pipeline_chunks: int = knob(1, ge=1)  # staged: >1 overlaps the copies with the transfer in that many chunks
    # fraction of the staging copies a zero-copy path still does per collective (NCCL registration
    # does not remove staging for reducescatter and only partly for ring allreduce)
    stage_anyway: dict[str, float] = knob(factory=dict, ge=0, le=1)
    moe_layout_exchange: bool = True  # MoE dispatch: exchange per-peer counts first (an extra step)
    moe_ht_path: str = MoeHtPath.flat.value  # HT dispatch/combine across nodes (comm/ep.py)
    moe_ll_windows: MoeLlWindows = MoeLlWindows.per_expert  # LL dispatch/combine: receive windows per peer
    expansion_mode: ExpansionMode = ExpansionMode.custom  # HCCL-style mode; not custom: sets mover/trigger
    # expansion_mode=ai_cpu: operators (graphs) the card's AI CPU cores run at once; later ones wait
    # (REFERENCE §3, CANN HCCL docs); aiv mode runs one operator per die (no multi-communicator concurrency)
    aicpu_graphs_per_card: int = knob(6, ge=1)
    sdma_submit_cores: int = knob(1, ge=1)  # device-triggered SDMA: vector cores that write the descriptors
    # mover=sdma: collectives the vector cores move instead (e.g. routing-dependent exchanges whose
    # sizes a host-launched engine would need on the host first)
    vector_core_colls: list[str] = field(default_factory=list)
    # the workload's per-stream core limits (llm_infer's decode split): every preset keeps them;
    # False is a scenario of its own (conf/library/stratacl_whole_die.yaml): every kernel on all cores
    stream_core_split: bool = True
    # mover=sdma: whether the library's point-to-point transfer writes the peer's memory (put) or
    # reads it (get: HIXL's rD2D rows); collectives always put
    p2p_op: OneSided = OneSided.put
    # mover=vector_cores: whether the comm kernel's cores store into the peers' memory (put, at each
    # tier's `store_GBps` where the fabric gives one) or load from it (get, at the tier's beta)
    core_access: OneSided = OneSided.get
    # algorithm=hccl: HCCL_ALGO's per-operator level-1 (inter-server) choice, e.g. {allreduce: ring,
    # alltoall: pairwise}; operators not listed use HCCL's adaptive choice
    hccl_algo: dict[str, HcclLevel1] = field(default_factory=dict)
    # algorithm=nccl: the algorithms / protocols NCCL may choose among, as NCCL_ALGO / NCCL_PROTO
    # restrict them (empty = NCCL's defaults): ring, tree, nvls, nvls_tree / LL, LL128, Simple
    nccl_algos: list[str] = field(default_factory=list)
    nccl_protos: list[str] = field(default_factory=list)
    # the host in the loop: operators ("coll" or "coll:mode") whose arguments the host must read
    # first (host arrays, a CPU wait for received counts): a device→host copy + host round trip
    # each, and a graph split in a captured step
    host_sync: list[str] = field(default_factory=list)
    host_roundtrip_us: float = knob(0.0, ge=0)  # device→host copy of the counts + host handling + relaunch
    moe_signal_rtts: float = knob(0.0, ge=0)  # dispatch/combine: extra round trips of remote-atomic signalling
    # dispatch/combine moved by the vector cores: each token copy's own processing on the core that
    # sends it (a fused op's quantisation and per-expert packing, its weighted sum), µs per copy,
    # per op and kernel family: dispatch_ll | combine_ll | dispatch_ht | combine_ht
    # at most 1 ms: no kernel spends longer on one token copy (the fitted CANN values are ~0.1-2 µs)
    moe_copy_us: dict[str, float] = knob(factory=dict, ge=0, le=1000)
    # dispatch/combine moved by the vector cores (partitioning even): a token copy's processing runs
    # while the previous copy's store is in flight (double-buffered UB queues), so it hides behind
    # the stores instead of adding to them (comm/partition.py even)
    copy_overlaps_store: bool = False
    # one-step exchanges: the completion flags are issued back to back and waited for once, so they
    # pay no start-up each (False: each flag a write with its own start-up on its core)
    posted_flag_writes: bool = False
    # dispatch/combine moved by the vector cores (partitioning even), per op and kernel family
    # (dispatch_ll | combine_ll | ...): ops whose data stores are issued without waiting for each one
    # to complete, so each pays no start-up of its own (the others wait for every store)
    posted_store_ops: list[str] = field(default_factory=list)
    # a plugin mechanism's own knobs by mechanism name, checked against its Config (comm/mechanism.py)
    options: dict[str, dict[str, Any]] = field(default_factory=dict)


# knobs that moved, named in the compose-time error of an old override (stratacl/run/precheck.py)
RENAMED_KNOBS = {
    "comm_buffer_MB": "library.<name>.comm_buffer_MiB (the same number: HCCL_BUFFSIZE counts MiB)",
    "graph_launch_us": "fabric.die.graph_launch_us (a runtime fact of the die, not of the library)",
}


# --------------------------------------------------------------------------- run


@dataclass
class OutputConfig:
    timeline: bool = True  # write timeline.json (turn off for big sweeps)
    timeline_max_ranks: int = knob(32, ge=1)  # per-rank tracks drawn for at most this many ranks
    utilisation: bool = False  # write utilisation.parquet (resource utilisation of the timeline replays)
    progress: bool = True
    trace: bool = False  # write traces/: every trace the run replays, with its replay times (run_traces.py)
    # split each measured step or iteration by counterfactual replays (comm at zero cost, comm as
    # plain delays: stratacl/engine/counterfactual.py); two more replays per trace and library
    counterfactual: bool = True


@dataclass
class LimitsConfig:
    """Run-size budgets checked from the config before any work starts (stratacl/limits.py).
    Defaults fit the 2-core, 24 GiB machines this project targets; raise them on a bigger one."""

    max_trace_ops: int = knob(2_000_000, ge=1)  # ops of the largest single trace (≈ 4 KB each in memory)
    max_replayed_ops: int = knob(20_000_000, ge=1)  # op replays summed over traces and libraries (time)
    max_requests: int = knob(2_000_000, ge=1)  # serving requests summed over the run's request sets


@dataclass
class RunConfig:
    workload: Any = MISSING
    fabric: FabricConfig = MISSING
    library: dict[str, LibraryConfig] = field(default_factory=dict)
    # modules imported before libraries are built: they register mechanisms of their own
    # (docs/extending.md), looked up from the working directory and the Python path
    plugins: list[str] = field(default_factory=list)
    baseline: str = "hccl"
    seed: int = knob(0, ge=0)  # numpy seeds are non-negative
    resume: bool = False  # skip the job when its output dir already holds summary.json
    output: OutputConfig = field(default_factory=OutputConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    # published values a named experiment reproduces (conf/experiment/*.yaml): printed beside the
    # harness's values by stratacl/report/text.py, display only — nothing computes with them
    reference: dict[str, Any] = field(default_factory=dict)


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
    cs.store(group="fabric", name="fabric_schema", node=FabricConfig)
    workload_registry.specs()  # every workload package's schema (workload/<name>_schema)


register_configs()

# --------------------------------------------------------------------------- validation
# Ranges of single fields are declared on the dataclasses (knob) and checked by check_ranges; the
# checks below relate several fields.

TIER_ORDER = ("die", "node", "supernode", "scaleout")


def validate_fabric(fab: FabricConfig) -> None:
    check_ranges(fab, "fabric")
    topo = fab.topology
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
        if tier.plane not in fab.port_GBps:
            raise ConfigError(
                f"fabric.tiers.{name}.plane",
                f"plane '{tier.plane}' has no port rate",
                f"add fabric.port_GBps.{tier.plane} or use one of {_names(fab.port_GBps)}",
            )
        if set(tier.in_flight) - set(ONE_SIDED):
            raise ConfigError(f"fabric.tiers.{name}.in_flight", f"unknown ops {sorted(set(tier.in_flight) - set(ONE_SIDED))}",
                              f"use keys of {list(ONE_SIDED)}")
        if tier.beta_GBps > fab.port_GBps[tier.plane]:
            raise ConfigError(f"fabric.tiers.{name}.beta_GBps",
                              f"{tier.beta_GBps} GB/s exceeds the {tier.plane} port rate "
                              f"{fab.port_GBps[tier.plane]} GB/s a die can drive",
                              f"lower it or raise fabric.port_GBps.{tier.plane}")
        if tier.store_GBps > fab.port_GBps[tier.plane]:
            raise ConfigError(f"fabric.tiers.{name}.store_GBps",
                              f"{tier.store_GBps} GB/s exceeds the {tier.plane} port rate "
                              f"{fab.port_GBps[tier.plane]} GB/s a die can drive",
                              f"lower it (0 = stores at beta_GBps) or raise fabric.port_GBps.{tier.plane}")
    sw = fab.switch
    if fab.fidelity == Fidelity.switch:
        if sw.l1_per_node <= 0 or sw.l2_per_plane <= 0 or not sw.link_GBps > 0:
            raise ConfigError("fabric.switch", f"fabric '{fab.name}' has no switch model",
                              "set fabric.switch.l1_per_node, l2_per_plane, l2_ports, link_GBps "
                              "or use fabric.fidelity=die_ports")
        if sw.l2_ports < topo.nodes // topo.supernodes:
            raise ConfigError("fabric.switch.l2_ports", f"{sw.l2_ports} L2 ports cannot reach "
                              f"{topo.nodes // topo.supernodes} nodes of a supernode",
                              "one L2 port per node of the supernode")
    _validate_host(fab)
    if fab.die.kernel.hbm_saturation_cores > fab.die.cube_cores:
        raise ConfigError("fabric.die.kernel.hbm_saturation_cores",
                          f"{fab.die.kernel.hbm_saturation_cores:g} core groups to draw the die's HBM rate, but the "
                          f"die has {fab.die.cube_cores}: no kernel could ever reach it",
                          f"a value in (0, {fab.die.cube_cores}]")
    if fab.die.sdma.engines and not fab.die.sdma.engine_GBps > 0:
        raise ConfigError("fabric.die.sdma.engine_GBps", "must be positive when engines > 0")


def _validate_host(fab: FabricConfig) -> None:
    host, dpn = fab.host, fab.topology.dies_per_npu * fab.topology.npus_per_node
    if not host.cpus_per_node:
        return
    if dpn % host.cpus_per_node:
        raise ConfigError("fabric.host.cpus_per_node", f"{host.cpus_per_node} CPUs do not split the "
                          f"{dpn} dies of a node evenly", f"use a divisor of {dpn}")
    if not host.link_GBps > 0:
        raise ConfigError("fabric.host.link_GBps", "must be positive when the node has CPUs",
                          "set the CPU's fabric bandwidth per direction (GB/s)")
    if host.dram_channels and not host.dram_channel_GBps > 0:
        raise ConfigError("fabric.host.dram_channel_GBps", "must be positive when dram_channels > 0",
                          "set the peak per memory channel (GB/s; DDR: MT/s x 8 B), or dram_channels: 0")
    if host.plane not in fab.port_GBps:
        raise ConfigError("fabric.host.plane", f"plane '{host.plane}' has no port rate",
                          f"add fabric.port_GBps.{host.plane} or use one of {_names(fab.port_GBps)}")


def _names(planes: Iterable[Plane]) -> list[str]:
    return sorted(map(str, planes))


def beyond_die_planes(fab: FabricConfig) -> list[str]:
    """Planes the fabric's node, supernode and scale-out tiers run on: what a library can choose."""
    return _names({t.plane for name, t in fab.tiers.items() if name != "die"})


def preset_plane(name: str) -> str | None:
    """The `plane` of library preset `name` in conf/library (own or inherited from a
    `<parent>@_here_` default); None when no such preset file exists."""
    path = CONF / "library" / f"{name}.yaml"
    if not path.is_file():
        return None
    raw = yaml.safe_load(path.read_text()) or {}
    if "plane" in raw:
        return str(raw["plane"])
    parents = [d.removesuffix("@_here_") for d in raw.get("defaults", [])
               if isinstance(d, str) and d.endswith("@_here_")]
    return preset_plane(parents[0]) if parents else str(LibraryConfig.plane)


def presets_on_planes(planes: Iterable[str]) -> list[str]:
    """The library presets in conf/library whose `plane` is one of `planes`: the presets a fabric
    with those planes can run."""
    wanted = set(planes)
    return [p.stem for p in sorted((CONF / "library").glob("*.yaml")) if preset_plane(p.stem) in wanted]


def moved_preset_notes(libraries: dict[str, LibraryConfig], fab: FabricConfig) -> list[str]:
    """A note per preset whose plane was overridden onto a fabric its own plane is not on: its other
    knobs (movers, launch costs, core counts) are still facts of the machine it was made for."""
    planes = beyond_die_planes(fab)
    notes = []
    for name, lib in libraries.items():
        own = preset_plane(name)
        if own is not None and own != lib.plane and own not in planes:
            notes.append(f"library '{name}' is a preset for '{own}' fabrics run on {fab.name} with "
                         f"plane={lib.plane}: its other knobs are not {fab.name} facts; presets made "
                         f"for {lib.plane}: {', '.join(presets_on_planes([lib.plane]))}")
    return notes


def load_plugins(modules: Iterable[str]) -> None:
    """Import the run's plugin modules, which register their mechanisms on import."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is None or not (module == exc.name or module.startswith(f"{exc.name}.")):
                raise  # the plugin itself imports something missing: its own traceback says what
            raise ConfigError("plugins", f"no module '{module}' to import",
                              f"put {module.replace('.', '/')}.py in the directory you run from (or on "
                              "PYTHONPATH), or drop it from plugins") from None


def validate_library(name: str, lib: LibraryConfig, fab: FabricConfig) -> None:
    where = f"library.{name}"
    check_ranges(lib, where)
    # the registries live with the mechanisms, which import this module
    from stratacl.comm.kinds import check_library

    check_library(where, lib)
    for op in lib.moe_copy_us:
        if op not in MOE_COPY_KEYS:
            raise ConfigError(f"{where}.moe_copy_us.{op}", "not an operator and kernel family that moves token copies",
                              f"use one of {list(MOE_COPY_KEYS)}")
    for op in lib.posted_store_ops:
        if op not in MOE_COPY_KEYS:
            raise ConfigError(f"{where}.posted_store_ops", f"'{op}' is not an operator and kernel family that "
                              "moves token copies", f"use some of {list(MOE_COPY_KEYS)}")
    if lib.posted_store_ops and lib.partitioning != Partitioning.even:
        raise ConfigError(f"{where}.posted_store_ops", "posted stores are priced for the fused ops' even token "
                          f"split, not partitioning '{lib.partitioning}'",
                          "set partitioning: even, or posted_store_ops: []")
    planes = beyond_die_planes(fab)
    if lib.plane not in planes:
        # name the presets of the fabric's scale-up plane (nvlink on NVIDIA, ub on Ascend)
        up = _names({t.plane for n, t in fab.tiers.items() if n in ("node", "supernode")}) or planes
        raise ConfigError(f"{where}.plane", f"preset '{name}' runs on plane '{lib.plane}', which fabric "
                          f"'{fab.name}' lacks (its planes beyond the die: {planes})",
                          f"select presets made for its {'/'.join(up)} plane: library=[...] and baseline= "
                          f"from {', '.join(presets_on_planes(up))}")
    if lib.comm_cores > fab.die.vector_cores:
        raise ConfigError(f"{where}.comm_cores", f"{lib.comm_cores} is outside 1..{fab.die.vector_cores}",
                          "use at most the die's vector cores")
    if lib.data_path == DataPath.staged and not lib.comm_buffer_MiB > 0:
        raise ConfigError(f"{where}.comm_buffer_MiB", f"must be positive, got {lib.comm_buffer_MiB}",
                          "staged libraries need a comm buffer")
    bad = [str(a) for a in lib.auto_candidates if a in (Algorithm.auto, Algorithm.pairwise)]
    if bad:
        raise ConfigError(f"{where}.auto_candidates", f"{bad} cannot be auto candidates",
                          "use ring, mesh, fullmesh, fullmesh_sio, rhd, hierarchical, hccl")
    _check_names(f"{where}.nccl_algos", lib.nccl_algos, ("ring", "tree", "nvls", "nvls_tree"))
    _check_names(f"{where}.nccl_protos", lib.nccl_protos, ("LL", "LL128", "Simple"))
    validate_expansion(name, lib, fab)
    bad = [c for c in lib.vector_core_colls if c not in COLLECTIVES]
    if bad:
        raise ConfigError(f"{where}.vector_core_colls", f"unknown collectives {bad}", f"use some of {list(COLLECTIVES)}")
    for entry in lib.host_sync:
        coll, _, mode = entry.partition(":")
        if coll not in COLLECTIVES or mode not in MOE_MODES:
            raise ConfigError(f"{where}.host_sync", f"unknown operator '{entry}'",
                              "use a collective name, optionally with :ht or :ll (dispatch:ht)")
    for tier in lib.unit_KiB:
        if tier not in TIER_ORDER:
            raise ConfigError(f"{where}.unit_KiB.{tier}", f"unknown tier '{tier}'", f"use tiers {TIER_ORDER}")
    if lib.copy_overlaps_store and lib.partitioning != Partitioning.even:
        raise ConfigError(f"{where}.copy_overlaps_store", "the overlapped copy loop is priced for the fused "
                          f"ops' even token split, not partitioning '{lib.partitioning}'",
                          "set partitioning: even, or copy_overlaps_store: false")
    # the mover the expansion mode resolves to (ai_cpu moves with SDMA whatever `mover` reads)
    if lib.partitioning == Partitioning.balanced and resolved_mover(lib)[0] == Mover.vector_cores and not lib.unit_KiB:
        raise ConfigError(f"{where}.unit_KiB", "balanced partitioning needs transfer unit sizes",
                          "e.g. unit_KiB: {die: 256, node: 256, supernode: 512}")


def _check_names(where: str, names: list[str], allowed: tuple[str, ...]) -> None:
    bad = [a for a in names if a not in allowed]
    if bad:
        raise ConfigError(where, f"unknown {bad}", f"use some of {list(allowed)} (empty = NCCL's defaults)")


def resolved_mover(lib: LibraryConfig) -> tuple[str, Trigger]:
    """The data mover and trigger an expansion mode implies (custom: as configured).

    HCCL documentation (HCCL_OP_EXPANSION_MODE; architecture brief §2.4 in the HCCL repository):
    AI_CPU mode runs the algorithm on the AI CPU, which submits task descriptors the scheduler runs
    on the communication hardware (SDMA inside a supernode), holding no compute core; AIV mode runs
    and moves on the vector cores.
    """
    if lib.expansion_mode == ExpansionMode.ai_cpu:
        return Mover.sdma, Trigger.aicpu
    if lib.expansion_mode == ExpansionMode.aiv:
        return Mover.vector_cores, Trigger.device
    return lib.mover, lib.trigger


def validate_expansion(name: str, lib: LibraryConfig, fab: FabricConfig) -> None:
    where = f"library.{name}"
    mode = lib.expansion_mode
    defaults = LibraryConfig()
    mover, trigger = resolved_mover(lib)
    if mode != ExpansionMode.custom:
        # an explicitly set mover/trigger that contradicts the mode is a mistake, not a preference
        for key, want in (("mover", mover), ("trigger", trigger)):
            got = getattr(lib, key)
            if got != want and got != getattr(defaults, key):
                raise ConfigError(f"{where}.{key}", f"{key}={got} contradicts expansion_mode={mode.value} "
                                  f"(which moves with {mover}, trigger {trigger.value})",
                                  f"drop {where}.{key} or set {where}.expansion_mode=custom")
    if mover == Mover.sdma and fab.die.sdma.engines <= 0:
        key = "mover" if mode == ExpansionMode.custom else "expansion_mode"  # whichever chose SDMA
        raise ConfigError(f"{where}.{key}", f"{key}={getattr(lib, key)} moves data with SDMA but "
                          f"fabric '{fab.name}' has no SDMA engines",
                          "use mover=vector_cores (expansion_mode=aiv) or a fabric with fabric.die.sdma.engines > 0")
    if mover == Mover.sdma and trigger.value not in fab.die.sdma.launch_us:
        raise ConfigError(f"{where}.trigger", f"no SDMA launch cost for trigger '{trigger.value}'",
                          f"add fabric.die.sdma.launch_us.{trigger.value}")
    if mover == Mover.sdma and trigger.value not in fab.die.sdma.descriptor_us:
        raise ConfigError(f"{where}.trigger", f"no SDMA descriptor cost for trigger '{trigger.value}'",
                          f"add fabric.die.sdma.descriptor_us.{trigger.value}")
    if lib.core_access == OneSided.put and mover != Mover.vector_cores:
        raise ConfigError(f"{where}.core_access", f"core_access=put prices the vector cores' remote stores, but "
                          f"this library moves data with {mover}",
                          f"drop {where}.core_access, or use mover=vector_cores (expansion_mode=aiv)")
    if lib.sdma_submit_cores > fab.die.vector_cores:
        raise ConfigError(f"{where}.sdma_submit_cores", f"{lib.sdma_submit_cores} is outside "
                          f"1..{fab.die.vector_cores}", "use at most the die's vector cores")


def world_size(fab: FabricConfig) -> int:
    t = fab.topology
    return t.dies_per_npu * t.npus_per_node * t.nodes


def validate_run(cfg: RunConfig) -> None:
    """Everything checkable before a simulation: every field's range, then cross-field meaning."""
    check_ranges(cfg)
    cfg.workload.check()  # the workload schema's cross-field checks (e.g. measurement windows)
    cfg.workload.check_inputs()  # inputs the workload loads (a model config), before any work
    validate_fabric(cfg.fabric)
    if not cfg.library:
        raise ConfigError("library", "no library selected", "e.g. library=[hccl,stratacl]")
    for name, lib in cfg.library.items():
        validate_library(name, lib, cfg.fabric)
    if cfg.baseline not in cfg.library:
        raise ConfigError("baseline", f"'{cfg.baseline}' is not among the selected libraries "
                          f"{list(cfg.library)}", "add it to library=[...] or set baseline= one of them")
    check_run = getattr(cfg.workload, "check_run", None)  # checks that need the run (e.g. the fabric)
    if callable(check_run):
        check_run(cfg)


def selected_libraries(cfg: DictConfig) -> list[str]:
    """The libraries a composed config selects. An experiment may set knobs of the libraries it
    selects (`library: {hccl: {plane: nvlink}}`); when the user picks a subset (`library=[...]`),
    those lines alone would create the others from schema defaults. Every preset in conf/library
    has a description, so an entry without one was composed from no preset: it is not selected.

    Coupling: this reads a preset's `description` as "a preset composed me". It holds while every
    preset has one (tests/test_llm_train_deepseek.py) and no experiment sets a description; tests/
    test_config_validation.py checks every experiment's library knobs against it. Hydra keeps no
    record of a list-valued group choice (`hydra.runtime.choices` lacks `library` for
    `library=[...]` and `override /library: [...]`). Reading the selection from the defaults list
    (`ConfigLoader.compute_defaults_list`) costs a second defaults-tree pass, about half a
    composition, needs an initialised GlobalHydra and the overrides at every `to_object` caller,
    and still drops entries after composition: the marker is kept."""
    return [name for name, lib in cfg.library.items() if lib.get("description")]


def to_object(cfg: DictConfig) -> RunConfig:
    """Resolve a composed DictConfig into typed dataclasses (enums included); libraries that are
    not selected (`selected_libraries`) are dropped. The run's plugins are imported first."""
    load_plugins(cfg.get("plugins", []))
    stray = set(cfg.library) - set(selected_libraries(cfg))
    if stray:
        cfg = cfg.copy()
        with open_dict(cfg):
            for name in stray:
                del cfg.library[name]
    obj = OmegaConf.to_object(cfg)
    assert isinstance(obj, RunConfig)
    return obj
