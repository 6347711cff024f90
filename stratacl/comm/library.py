"""A communication library as a point in the design space (docs/architecture.md), lowered to phases.

`LibraryModel` holds the static choices and prices one collective on one communicator as a list
of phases:

    launch → [registration wait] → [copy in] → sync steps → wire → [copy out]

Each mechanism below is a class in an open registry keyed by name (built-ins by their enum's
value; plugins add more: docs/extending.md), built with its own typed Config (mechanism.py) and
pricing through a `CommContext` (context.py), never through this model.

- data path (datapath.py, one class per `DataPath`): `staged` copies user data into/out of the
  communicator's buffers (HBM traffic) in rounds of the buffer size, each round re-running the
  algorithm's synchronised steps, optionally pipelined in chunks; `jit_register` / `on_alloc`
  register user buffers (registration.py); `pool` neither copies nor registers but holds HBM.
- algorithm family (families.py, one class per `Algorithm`): ring / rhd / mesh / one-step
  full-mesh / pairwise (algorithms.py), HCCL's own selection (hierarchical.py), `auto` = the
  fastest candidate for this size and group on an idle fabric.
- mover (movers.py, one class per `Mover`): `vector_cores` hold `comm_cores` cores for the
  transfer, which cannot finish before the cores' makespan under the partitioning (partition.py);
  `sdma` moves data on DMA engines, cores held only while a device trigger writes descriptors
  (sdma.py). `expansion_mode` (HCCL's AI_CPU / AIV) picks mover and trigger. Staging copies run
  on the op's mover: SDMA memcpy tasks for SDMA movers, the comm kernel's own vector cores
  otherwise; both load HBM.
- stream core limits: a comm kernel on a limited stream holds at most the stream's vector cores.

`LibraryRuntime` carries per-replay state (registrations) so the same trace replays per library.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache
from typing import Any, cast

import numpy as np

from stratacl.comm import algorithms as alg
from stratacl.comm import ep
from stratacl.comm.context import CONCURRENT, CommContext, HcclFacts
from stratacl.comm.datapath import DATA_PATHS
from stratacl.comm.families import FAMILIES, AlgorithmFamily
from stratacl.comm.mechanism import Mechanism, from_library
from stratacl.comm.movers import MOVERS, MoverModel
from stratacl.comm.registration import RegistrationState
from stratacl.config import (
    Algorithm,
    ExpansionMode,
    LibraryConfig,
    MoeLlWindows,
    Mover,
    OneSided,
    Plane,
    RegistrationMechanism,
    resolved_mover,
)
from stratacl.machine.fabric import Fabric, R
from stratacl.machine.lowering import Concurrency, OpInfo
from stratacl.machine.phases import Phase, delay, merge_delays
from stratacl.memory import AllocatorConfig, CachingAllocator, DieMemory, RegistrationCost
from stratacl.memory.communicators import Communicator
from stratacl.trace import Op, Trace

__all__ = ["LibraryModel", "LibraryRuntime"]


class LibraryModel:
    def __init__(self, name: str, cfg: LibraryConfig, fabric: Fabric) -> None:
        self.name = name
        self.cfg = cfg
        self.mover, self.trigger = resolved_mover(cfg)
        # a comm kernel whose vector cores store into the peers' memory moves its bytes at the
        # tiers' store rates (config.validate_expansion refuses put for any other mover)
        stores = cfg.core_access == OneSided.put and self.mover == Mover.vector_cores
        self.fabric = fabric = fabric.storing() if stores else fabric
        path = DATA_PATHS[cfg.data_path]
        self.path = path(self._config(path))  # comm/datapath.py
        # what the mechanisms may know of the library (comm/context.py)
        self.ctx = CommContext(
            fabric=fabric, plane=cfg.plane, launch_us=cfg.launch_us, comm_cores=cfg.comm_cores,
            partitioning=cfg.partitioning, unit_KiB=dict(cfg.unit_KiB), fanout_cap=cfg.fanout_cap,
            refine_units_below=cfg.refine_units_below, min_unit_KiB=cfg.min_unit_KiB,
            hccl=HcclFacts(aiv=cfg.expansion_mode == ExpansionMode.aiv, zerocopy=not self.path.stages,
                           ccl_bytes=self.path.ccl_bytes()),
            copy_overlaps_store=cfg.copy_overlaps_store, posted_flag_writes=cfg.posted_flag_writes)
        self.mover_model = self._mover(self.mover)  # comm/movers.py
        self._core_mover = self._mover(Mover.vector_cores)
        self._families: dict[str, AlgorithmFamily] = {}
        self.family = self._family(cfg.algorithm)  # comm/families.py
        ht = ep.HT_PATHS[cfg.moe_ht_path]
        self.ht_path = ht(self._config(ht))  # HT dispatch/combine across nodes (comm/ep.py)

    def _config(self, mechanism: type[Mechanism]) -> Any:
        """The mechanism's own Config from this library's knobs (comm/mechanism.py)."""
        return from_library(mechanism.Config, self.cfg, str(mechanism.kind), f"library.{self.name}")

    def _mover(self, kind: str) -> MoverModel:
        cls = MOVERS[kind]
        return cls(self.ctx, self.trigger, self._config(cls))

    def _family(self, name: str) -> AlgorithmFamily:
        """The family `name` built with this library's knobs (candidates may be other families)."""
        family = self._families.get(name)
        if family is None:
            cls = FAMILIES[name]
            family = self._families[name] = cls(self._config(cls))
        return family

    def core_limits(self, trace: Trace) -> dict[str, tuple[int, int]]:
        """Per-stream core limits the deployment runs with under this library (the trace's, or none
        when the preset drops the split: `stream_core_split`)."""
        return dict(trace.stream_cores) if self.cfg.stream_core_split else {}

    def op_concurrency(self) -> Concurrency | None:
        """HCCL's expansion modes bound its operators in flight (REFERENCE §3, CANN HCCL docs): AI_CPU
        mode runs at most `aicpu_graphs_per_card` graphs per card (the card's AI CPU cores are
        shared by its dies), AIV mode has no multi-communicator concurrency (one operator per die).
        A custom mover/trigger (StrataCL, NCCL, DeepEP) has no such bound."""
        if self.cfg.expansion_mode == ExpansionMode.ai_cpu:
            return Concurrency(self.cfg.aicpu_graphs_per_card, self.fabric.dies_per_npu, "AI_CPU graphs per card")
        if self.cfg.expansion_mode == ExpansionMode.aiv:
            return Concurrency(1, 1, "AIV operators per die")
        return None

    # ------------------------------------------------------------------ memory
    def comm_memory_bytes(self, communicators: int = 1) -> float:
        """HBM of staging buffers per rank for `communicators` communicators of the default size."""
        return self.path.comm_memory_bytes(communicators)

    def held_memory_bytes(self, communicators: int = 1, context: str = "inference") -> float:
        """HBM per rank the library keeps outside the device allocator: comm buffers of
        `communicators` default-size communicators and the registered pool. The fragmentation its
        allocator setting causes is not here: it emerges from the allocator (`die_memory`).
        `context` is kept for callers that still pass it."""
        del context
        return self.comm_memory_bytes(communicators) + self.pool_bytes

    def communicator_buffer_bytes(self, comms: Sequence[Communicator]) -> float:
        """HBM per rank of the communication buffers of the communicators it is in: a staged
        library holds `comm_buffers` buffers per communicator, each of the size the framework
        configures or of HCCL_BUFFSIZE raised to fit the fused MoE windows (comm/buffers.py)."""
        return self.path.communicator_buffer_bytes(comms)

    @property
    def pool_bytes(self) -> float:
        """The pre-registered pool a pool library carves out of HBM (REFERENCE §3)."""
        return self.path.pool_bytes()

    @property
    def forces_expandable_segments_off(self) -> bool:
        """A pre-registered pool needs PyTorch's expandable segments off (REFERENCE §3)."""
        return self.path.forces_expandable_segments_off

    @property
    def user_buffer_registration(self) -> RegistrationMechanism:
        """How user buffers become remotely accessible: `jit` (at first use, cached by address
        range), `on_alloc` (when the allocator maps them) or `none` (staged copies / the pool)."""
        return self.path.registration

    def registration_cost(self) -> RegistrationCost:
        """Registering one buffer with `peers` peers: base + peers * per-peer mapping."""
        return RegistrationCost(base_us=self.cfg.register_base_us, per_peer_us=self.cfg.register_per_peer_us)

    def die_memory(self, capacity_bytes: float, peers: int, *, expandable_segments: bool = True,
                   va_base: int = 1 << 40) -> DieMemory:
        """One die's device allocator as this library leaves it to the framework: expandable
        segments as the framework sets them unless the library forces them off, with the
        data path's registrar listening to its map/unmap events (a JIT cache matching by
        `jit_cache_match`, registration-on-allocation, or none) for `peers` peers."""
        es = expandable_segments and not self.forces_expandable_segments_off
        alloc = CachingAllocator(AllocatorConfig(int(capacity_bytes), expandable_segments=es, va_base=va_base))
        return DieMemory(alloc, self.path.registrar(self.registration_cost(), peers))

    # ------------------------------------------------------------------ algorithm choice
    def candidates(self, coll: str) -> list[str]:
        """Plans the configured algorithm family may run for `coll` (comm/families.py)."""
        return self.family.candidates(coll)

    def wire_plan(self, coll: str, size: float, group: tuple[int, ...],
                  peer_bytes: tuple[float, ...] = (), algorithm: str | None = None,
                  moe: ep.MoeArgs = None) -> alg.WirePlan:
        """`moe`: the dispatch/combine's shape (`ep.MoeOp`). A node-forwarding library's HT dispatch/combine (comm/ep.py) runs one
        concurrent exchange of its two-hop flows instead of the rank-level matrix."""
        tidx = self.fabric.group_tiers(group)
        algo = algorithm or self.candidates(coll)[0]
        flows = self.ht_path.node_flows(self.ctx, coll, group, peer_bytes, moe)[1]
        if flows:
            plan = self._plan(coll, size, len(group), tidx.tobytes(), flows, Algorithm.fullmesh.value)
            return replace(plan, algorithm=ep.ALGORITHM)
        plan = self._plan(coll, size, len(group), tidx.tobytes(), peer_bytes, algo)
        if moe is not None and plan.peer_work and self.cfg.moe_ll_windows != MoeLlWindows.per_peer:
            per_copy_stores = self.cfg.moe_ll_windows == MoeLlWindows.per_copy
            plan = replace(plan, peer_copies=moe_windows(plan, moe.mode, moe.bytes_per_copy, moe.experts_per_rank,
                                                         per_copy_stores))
        per_copy = self.cfg.moe_copy_us.get(f"{coll}_{moe.mode}", 0.0) if moe is not None else 0.0
        if per_copy > 0 and moe is not None and moe.bytes_per_copy > 0:
            plan = replace(plan, copy_s_per_byte=per_copy * 1e-6 / moe.bytes_per_copy)
        if moe is not None and f"{coll}_{moe.mode}" in self.cfg.posted_store_ops:
            plan = replace(plan, stores_posted=True)
        return plan

    @lru_cache(maxsize=65536)  # noqa: B019 - one model per run
    def _plan(self, coll: str, size: float, n: int, tkey: bytes, peer_bytes: tuple[float, ...],
              algorithm: str) -> alg.WirePlan:
        if n == 1:
            return alg.WirePlan(algorithm=algorithm, steps=0, latency_s=0.0)
        tidx = np.frombuffer(tkey, dtype=np.int64).reshape(n, n)
        return self._family(algorithm).plan(self.ctx, coll, size, tidx, peer_bytes)

    # ------------------------------------------------------------------ pricing
    def collective_phases(self, coll: str, size: float, group: tuple[int, ...],
                          peer_bytes: tuple[float, ...] = (), moe_mode: str = "",
                          cores: int | None = None, moe: ep.MoeArgs = None) -> list[Phase]:
        """Static phases of one collective on one communicator (registration is added at run
        time by the runtime). With algorithm=auto, the fastest candidate on an idle fabric.
        `cores`: vector cores the comm kernel may use (a stream limit; default comm_cores).

        An HT-mode MoE dispatch first exchanges per-peer token counts (DeepEP's notify step, part
        of its dispatch call): receivers need them to lay out a packed receive buffer. LL-mode
        kernels write into fixed per-expert slots and skip it (`moe_layout_exchange` turns the
        step off for a library that derives the layout otherwise).

        `moe` (the op's `ep.MoeOp`, its mode `moe_mode`'s): an LL kernel
        writes each peer's copies into one window per expert hit, each its own start-up
        (`moe_windows`); a node-forwarding HT kernel sends once per (token, node) and forwards inside
        the node, after its layout kernel and a two-hop count exchange (`ep.HT_PATHS`). A library
        that signals completion with remote atomics pays `moe_signal_rtts` round trips; one whose
        operator needs the host first (`host_sync`) pays a device→host copy and host round trip."""
        moe = moe if moe_mode else None
        phases = self._best(coll, size, group, peer_bytes, cores, moe)[1]
        if coll == "dispatch" and moe_mode == "ht" and self.cfg.moe_layout_exchange and len(group) > 1:
            phases = merge_delays([*self.ht_path.notify(self.ctx, self, group, peer_bytes, moe, cores), *phases])
        if coll in ("dispatch", "combine") and self.cfg.moe_signal_rtts > 0 and len(group) > 1:
            far = self.fabric.tier(int(self.fabric.group_tiers(group).max()), self.cfg.plane)
            phases = merge_delays([*phases, *delay("sync", self.cfg.moe_signal_rtts * 2 * far.alpha_s)])
        if self.needs_host(coll, moe_mode) and len(group) > 1:
            phases = merge_delays([*delay("host", self.cfg.host_roundtrip_us * 1e-6), *phases])
        return phases

    def op_phases(self, coll: str, size: float, group: tuple[int, ...], cores: int | None = None) -> list[Phase]:
        """The phases of a plain collective (no peer matrix) as this library runs it: for the HT
        paths' count exchanges (comm/ep.py)."""
        return self._best(coll, size, group, (), cores)[1]

    # ------------------------------------------------------------------ the host in the loop
    def needs_host(self, coll: str, moe_mode: str = "") -> bool:
        """Whether the operator needs the host before it can start (its arguments are host arrays
        or its receive layout is read back by the CPU), per the library's documentation."""
        hs = self.cfg.host_sync
        return coll in hs or (bool(moe_mode) and f"{coll}:{moe_mode}" in hs)

    def step_graph_launch_s(self, host_syncs: int) -> float:
        """Graph launch time of one model step (e.g. a decode iteration) the deployment captures as
        a graph, whose work holds `host_syncs` operators that need the host. A fully device-driven
        step is one captured graph: one launch, the die's `fabric.die.graph_launch_us` (0.6–0.8 ms
        per graph, REFERENCE §2). A host-synchronising operator cannot be captured, so the step
        could only run as host_syncs + 1 graphs, a launch each; the framework runs such a step
        eagerly instead (the cheaper way: kernels launched one by one, asynchronously ahead of the
        device, no graph launch). Not modelled: an eager step whose host launches fall behind the
        device (short kernels)."""
        return self.fabric.graph_launch_s if host_syncs == 0 else 0.0

    @property
    def cost_depends_on_mapping(self) -> bool:
        """Whether remapping a user buffer changes this library's cost: registration-on-allocation
        registers at map time, so a remap just before use can leave registration exposed; staged
        and pooled paths do not register user buffers, and JIT registration pays per new size
        whether or not the memory moved."""
        return self.path.cost_depends_on_mapping

    def chosen_algorithm(self, coll: str, size: float, group: tuple[int, ...],
                         peer_bytes: tuple[float, ...] = (), cores: int | None = None) -> str:
        return self._best(coll, size, group, peer_bytes, cores)[0]

    def op_info(self, coll: str, size: float, group: tuple[int, ...],
                peer_bytes: tuple[float, ...] = (), cores: int | None = None, moe: ep.MoeArgs = None) -> OpInfo:
        """The algorithm that runs and the spread of the comm cores' completion times under the
        library's core partitioning (as a vector-core mover would run this plan). `moe`: as
        `wire_plan`'s (a node-forwarding dispatch reports its own plan)."""
        algo, _, cand = self._best(coll, size, group, peer_bytes, cores, moe)
        if len(group) < 2:
            return OpInfo(algo, 0.0)
        plan = self.wire_plan(coll, size, group, peer_bytes, cand, moe)
        # a staged plan: the stage whose cores take longest decides the spread reported
        sched = max((self.ctx.core_schedule(st, cores) for st in (plan.stages or (plan,))),
                    key=lambda c: c.makespan_s)
        return OpInfo(algo, sched.spread)

    def _best(self, coll: str, size: float, group: tuple[int, ...], peer_bytes: tuple[float, ...],
              cores: int | None = None, moe: ep.MoeArgs = None) -> tuple[str, list[Phase], str]:
        """(algorithm that runs, its phases, the candidate that produced it)."""
        best: tuple[str, list[Phase], str] = ("", [], "")
        best_t = math.inf
        for algo in self.candidates(coll):
            plan = self.wire_plan(coll, size, group, peer_bytes, algo, moe)
            phases = self._phases(coll, size, len(group), plan, cores)
            t = sum(p.standalone_s() for p in phases)
            if t < best_t:
                best, best_t = (plan.algorithm or algo, phases, algo), t
        return best

    def mover_for(self, coll: str, plan: alg.WirePlan) -> MoverModel:
        """What moves this operator's bytes: the library's mover, except that DMA engines which
        cannot reduce (GPU copy engines, REFERENCE §7) leave a reducing plan to the vector cores, as
        they do the collectives the library names in `vector_core_colls`."""
        if self.mover != Mover.sdma:
            return self.mover_model
        reduces = plan.reduce_bytes > 0 or any(st.reduce_bytes > 0 for st in plan.stages)
        if coll in self.cfg.vector_core_colls or (reduces and not self.fabric.sdma_reduces):
            return self._core_mover
        return self.mover_model

    def _phases(self, coll: str, size: float, n: int, plan: alg.WirePlan, cores: int | None = None) -> list[Phase]:
        mover = self.mover_for(coll, plan)
        phases: list[Phase] = delay("launch", self.cfg.launch_us * 1e-6)
        copies = self.path.staging(coll, size, n, self.ctx.kernel_cores(cores))
        if copies.fill_in > 0:  # with pipelining only the first slot's copy is exposed
            phases.append(self._copy_phase(copies.fill_in, n, cores, mover))
        stages = plan.stages or (plan,)  # hierarchical plans: their stages in order
        staged: list[Phase] = []
        for i, st in enumerate(stages):
            sync_s = self.path.sync_s(st.latency_s, copies.rounds)
            if st.wire_s > 0:
                overlapped = (copies.copy_in + copies.copy_out - copies.fill_in - copies.fill_out) / len(stages)
                # one operator, one submitting agent: only the first stage pays the agent's launch
                staged += self._transfer_phases(st, n, overlapped_copy=overlapped, cores=cores, sync_s=sync_s,
                                                agent_running=i > 0, mover=mover)
            else:
                staged += delay("sync", sync_s)
        phases += _fold_stages(staged) if len(stages) > 1 else staged
        if copies.fill_out > 0:
            phases.append(self._copy_phase(copies.fill_out, n, cores, mover))
        return merge_delays(phases)

    def _copy_phase(self, nbytes: float, n: int, cores: int | None = None,
                    mover: MoverModel | None = None) -> Phase:
        """Device-to-device copy between a user buffer and a comm buffer (read + write HBM) on the
        engine that does it: SDMA memcpy tasks for an SDMA mover (HCCL's AI_CPU executor issues
        LocalCopy tasks), the comm kernel's vector cores for a vector-core mover (AIV kernels copy
        in-kernel), which it holds meanwhile."""
        fab = self.fabric
        min_t = self.path.copy_min_s(nbytes)
        extra, holds = (mover or self.mover_model).copy_resources(nbytes, cores)
        return Phase("copy", loads=(("all", R["hbm"], 2 * nbytes / fab.hbm_Bps), *extra), holds=holds,
                     min_time_s=min_t, hbm_bytes=2 * nbytes * n, copy_bytes=nbytes * n)

    def _port_loads(self, plan: alg.WirePlan, n: int) -> tuple[dict[str, float], dict[str, float], float,
                                                               list[tuple[str, int, float]]]:
        """Port seconds per plane (tx, rx), the flows' pace and the switch port-group loads.

        die_ports: the plan's seconds at tier β, no pace. switch: bytes at the port's nominal rate;
        the pace is the slowest flow at its tier β — all peers at once for a one-step exchange, the
        plan's lockstep steps otherwise; a node's uplinks and downlinks carry the inter-node bytes
        of the node's members (the busiest die's, an upper bound for rings)."""
        fab = self.fabric
        if fab.switch is None:
            return plan.tx_s, plan.rx_s, 0.0, []
        tiers = [(b, fab.tier(t, self.cfg.plane)) for b, t in plan.peer_work]
        per_plane: dict[str, float] = {}
        for b, tier in tiers:
            per_plane[tier.plane] = per_plane.get(tier.plane, 0.0) + b
        scale = plan.send_bytes / max(sum(per_plane.values()), 1e-300)  # peer_work of one exchange
        if plan.port_bytes:  # rings: each plane's busiest die
            per_plane, scale = plan.port_bytes, 1.0
        ports = {p: b * scale / fab.port_Bps[cast(Plane, p)] for p, b in per_plane.items()}
        concurrent = plan.algorithm in CONCURRENT
        pace = max((b * scale / t.beta_Bps for b, t in tiers), default=0.0) if concurrent else plan.wire_s
        inter = sum(b * scale for b, t in tiers if t.index >= 2 and t.plane == "ub")
        switch: list[tuple[str, int, float]] = []
        if inter > 0 and fab.switch.blocking:
            up = fab.switch.uplink_seconds(inter, min(n, fab.dies_per_node))
            switch = [("sw", R["l1_up"], up), ("sw", R["l1_down"], up)]
        rx = {p: s * plan.recv_bytes / max(plan.send_bytes, 1e-300) for p, s in ports.items()}
        return ports, rx, pace, switch

    def _transfer_phases(self, plan: alg.WirePlan, n: int, overlapped_copy: float = 0.0,
                         cores: int | None = None, sync_s: float = 0.0, agent_running: bool = False,
                         mover: MoverModel | None = None) -> list[Phase]:
        """[SDMA start] → the algorithm's synchronised steps (`sync_s`) → the wire phase.
        `agent_running`: a later stage of a hierarchical plan, whose submitting agent (the AI CPU
        kernel expanding the whole operator, or the AIV kernel) is already launched."""
        fab = self.fabric
        tx_s, rx_s, pace, switch = self._port_loads(plan, n)
        loads: list[tuple[str, int, float]] = list(switch)
        for p, s in tx_s.items():
            loads.append(("all", R[f"{p}_tx"], s))
        for p, s in rx_s.items():
            loads.append(("all", R[f"{p}_rx"], s))
        # senders read, receivers write, reductions read two operands and write one
        hbm = plan.send_bytes + plan.recv_bytes + 2 * plan.reduce_bytes + 2 * overlapped_copy
        loads.append(("all", R["hbm"], hbm / fab.hbm_Bps))
        phases: list[Phase] = []
        holds, min_t = (mover or self.mover_model).transfer(plan, loads, cores, phases, sync_s, agent_running)
        phases.append(Phase("wire", loads=tuple(loads), holds=holds, min_time_s=max(min_t, pace, plan.floor_s),
                            wire_bytes=plan.group_wire_bytes, hbm_bytes=hbm * n,
                            copy_bytes=overlapped_copy * n))
        return phases

    def p2p_phases(self, tier_index: int, nbytes: float, total_bytes: float,
                   cores: int | None = None, per_node: int = 1) -> list[Phase]:
        """Send/recv of `nbytes` per pair (the slowest pair); staged libraries copy on both ends.
        `per_node`: most pairs whose sender (or receiver) shares a node (switch port groups)."""
        tier = self.fabric.tier(tier_index, self.cfg.plane)
        wire_s: dict[str, float] = {tier.plane: nbytes / tier.beta_Bps}
        plan = alg.WirePlan(algorithm="p2p", steps=1, latency_s=tier.alpha_s + tier.sync_s, tx_s=wire_s,
                            rx_s=dict(wire_s), send_bytes=nbytes, recv_bytes=nbytes, group_wire_bytes=total_bytes,
                            peers=1, peer_work=((nbytes, tier.index),))
        copies = self.path.p2p_staging(nbytes, self.ctx.kernel_cores(cores))
        fill = copies.fill_in
        phases = delay("launch", self.cfg.launch_us * 1e-6)
        if fill > 0:
            phases.append(_p2p_roles(self._copy_phase(fill, 1, cores), 0.0, "src"))
        overlapped = 2 * (copies.copy_in - fill)
        phases += [p if p.is_delay else _p2p_roles(p, total_bytes, copy_bytes=p.copy_bytes / per_node)
                   for p in self._transfer_phases(plan, per_node, overlapped, cores, self.path.sync_s(plan.latency_s, 1))]
        if fill > 0:
            phases.append(_p2p_roles(self._copy_phase(fill, 1, cores), 0.0, "dst"))
        return merge_delays(phases)

    def runtime(self, trace: Trace) -> LibraryRuntime:
        return LibraryRuntime(self, trace)


def _fold_stages(phases: list[Phase]) -> list[Phase]:
    """Events scale with ops: the sync delays and wire transfers of a staged plan's stages fold
    into one delay and one wire activity — loads summed, min time the sum of the stages' own
    times — which is exact on an idle fabric (stages run back to back) and shares the ports in
    proportion under contention. Other activities (SDMA descriptor writes) keep their place."""
    delays = [p for p in phases if p.is_delay]
    wires = [p for p in phases if not p.is_delay and p.category == "wire"]
    others = [p for p in phases if not p.is_delay and p.category != "wire"]
    if len(wires) < 2:
        return phases
    loads: dict[tuple[str, int], float] = {}
    for w in wires:
        for role, r, sec in w.loads:
            loads[(role, r)] = loads.get((role, r), 0.0) + sec
    holds: dict[tuple[str, int], float] = {}
    for w in wires:
        for role, r, h in w.holds:
            holds[(role, r)] = max(holds.get((role, r), 0.0), h)
    wire = Phase("wire", loads=tuple((k[0], k[1], v) for k, v in loads.items()),
                 holds=tuple((k[0], k[1], v) for k, v in holds.items()),
                 min_time_s=sum(w.standalone_s() for w in wires),
                 wire_bytes=sum(w.wire_bytes for w in wires), hbm_bytes=sum(w.hbm_bytes for w in wires),
                 copy_bytes=sum(w.copy_bytes for w in wires))
    return merge_delays([*delays, *others, wire])


def moe_windows(plan: alg.WirePlan, mode: str, bytes_per_copy: float, experts_per_rank: int,
                per_copy: bool = False) -> tuple[int, ...]:
    """Separate writes each peer's MoE payload lands in. HT (normal kernels): one packed window per
    peer, laid out from the count exchange. LL: fixed per-expert slots, one window per expert of the
    peer that the copies hit — c copies spread over E experts hit E·(1 − (1 − 1/E)^c) of them — or,
    `per_copy`, one store per token copy (c of them) into those slots."""
    if mode != "ll" or bytes_per_copy <= 0:
        return (1,) * len(plan.peer_work)
    e = max(1, experts_per_rank)
    out = []
    for nbytes, _ in plan.peer_work:
        c = nbytes / bytes_per_copy
        hit = round(c) if per_copy else (round(e * (1 - (1 - 1 / e) ** c)) if e > 1 else 1)
        out.append(max(1, hit))
    return tuple(out)


def _p2p_roles(p: Phase, total_bytes: float, only: str = "", copy_bytes: float | None = None) -> Phase:
    """Point-to-point: the sender's tx port, engines and cores; the receiver's rx port; HBM on both
    (or everything on one end with `only`, e.g. a staging copy). `copy_bytes` replaces the phase's.
    (Phases are built directly rather than with dataclasses.replace: p2p sizes vary, so every p2p
    op is lowered afresh and replace() was most of its cost.)"""
    copy = p.copy_bytes if copy_bytes is None else copy_bytes
    if only:
        return Phase(p.category, p.delay_s, tuple((only, r, s) for _, r, s in p.loads),
                     tuple((only, r, h) for _, r, h in p.holds), p.min_time_s, p.wire_bytes, p.hbm_bytes,
                     copy, p.parts)
    loads: list[tuple[str, int, float]] = []
    for _, r, s in p.loads:
        name = _RES_NAME[r]
        if name == "hbm":
            loads += [("src", r, s / 2), ("dst", r, s / 2)]  # the sender reads, the receiver writes
        elif name == "l1_up":
            loads.append(("sw_src", r, s))
        elif name == "l1_down":
            loads.append(("sw_dst", r, s))
        else:
            loads.append(("dst" if name.endswith("_rx") else "src", r, s))
    holds = tuple(("src", r, h) for _, r, h in p.holds)
    return Phase(p.category, p.delay_s, tuple(loads), holds, p.min_time_s, p.wire_bytes,
                 2 * total_bytes if p.hbm_bytes else 0.0, copy, p.parts)


_RES_NAME = {v: k for k, v in R.items()}


class LibraryRuntime:
    """Per-replay state of one library (the engine's `CommRuntime`): lowers collectives and p2p to
    phases, memoising the static part by op shape, and adds registration waits at run time."""

    def __init__(self, model: LibraryModel, trace: Trace) -> None:
        self.model = model
        self.trace = trace
        self.fabric = model.fabric
        self.registration = RegistrationState(model.path.registrar(model.registration_cost(), 0), trace.buffers)
        self._cache: dict[tuple[Any, ...], tuple[list[Phase], int, OpInfo]] = {}
        self._limits = model.core_limits(trace)
        self._p2p_ends: dict[tuple[Any, ...], tuple[np.ndarray, tuple[float, ...], int]] = {}  # (src, dst) -> tiers, β, per node

    def cores(self, op: Op) -> int | None:
        """Vector cores the op's comm kernel may use: its stream's AIV limit (None: no limit)."""
        lim = self._limits.get(op.stream)
        return lim[1] if lim else None

    def observe_start(self, op: Op, now: float) -> None:
        self.registration.note_start(op.id, now)

    def lower_with_info(self, op: Op, now: float) -> tuple[list[Phase], OpInfo]:
        phases, peers, info = self._static(op)
        if op.buffer and peers:
            wait = self.registration.exposed_cost_s(op.buffer, max(op.nbytes), peers, now)
            if wait > 0:
                return merge_delays([Phase("register", delay_s=wait), *phases]), info
        return phases, info

    def _static(self, op: Op) -> tuple[list[Phase], int, OpInfo]:
        key = (op.kind, op.coll, op.comm, op.ranks, op.nbytes, op.peer_bytes, op.src, op.dst, op.moe_mode,
               op.group_tokens, self.cores(op))
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._lower_p2p(op) if op.kind == "p2p" else self._lower_collective(op)
        return hit

    def _lower_collective(self, op: Op) -> tuple[list[Phase], int, OpInfo]:
        """Phases, the number of peers a rank maps (for registration) and the choices made."""
        groups = self.trace.op_groups(op)
        size = max(op.nbytes)
        cores = self.cores(op)
        # groups of a family usually share a shape; price each distinct shape, keep the slowest
        best: list[Phase] = []
        best_t, best_group = -1.0, groups[0]
        seen: set[bytes] = set()
        for g in groups:
            key = self.fabric.group_tiers(g).tobytes()
            if key in seen:
                continue
            seen.add(key)
            phases = self.model.collective_phases(op.coll, size, g, op.peer_bytes, op.moe_mode, cores,
                                                  self._moe_op(op))
            t = sum(p.standalone_s() for p in phases)
            if t > best_t:
                best, best_t, best_group = phases, t, g
        moe = self._moe_op(op)  # an HT op may run the node-forwarding plan: report that one
        info = self.model.op_info(op.coll, size, tuple(best_group), op.peer_bytes, cores,
                                  moe if op.moe_mode == "ht" else None)
        # accounting fields count bytes over the whole op (all groups)
        return [_scale_accounting(p, len(groups)) for p in best], len(groups[0]) - 1, info

    def _moe_op(self, op: Op) -> ep.MoeOp | None:
        """A dispatch/combine op's shape: the trace's `MoeShape` and the op's `group_tokens`."""
        shape = self.trace.moe if op.moe_mode else None
        if shape is None:
            return None
        return ep.MoeOp(op.moe_mode, shape.bytes_per_copy(op.coll), shape.experts_per_rank, shape.top_k,
                        op.group_tokens)

    def _lower_p2p(self, op: Op) -> tuple[list[Phase], int, OpInfo]:
        fab = self.fabric
        ends = self._p2p_ends.get((op.src, op.dst))
        if ends is None:  # the pairs' tiers and port groups depend on the ends only (p2p sizes vary)
            plane = self.model.cfg.plane
            tiers = fab.tier_index(np.asarray(op.src), np.asarray(op.dst))
            beta = tuple(fab.tier(int(t), plane).beta_Bps for t in tiers)
            dpn = fab.dies_per_node
            per_node = max(int(np.bincount(np.asarray(e) // dpn).max()) for e in (op.src, op.dst))
            ends = self._p2p_ends[(op.src, op.dst)] = (tiers, beta, per_node)
        tiers, beta, per_node = ends
        sizes = np.asarray(op.nbytes, dtype=float)
        sizes = np.full(len(op.src), sizes[0]) if sizes.size == 1 else sizes
        # the slowest pair paces the SPMD op
        worst = max(range(len(sizes)), key=lambda i: sizes[i] / beta[i])
        phases = self.model.p2p_phases(int(tiers[worst]), float(sizes[worst]), float(sizes.sum()),
                                       self.cores(op), per_node)
        return phases, 1, OpInfo(algorithm="p2p", core_spread=0.0)


def _scale_accounting(p: Phase, groups: int) -> Phase:
    if groups == 1:
        return p
    return replace(p, wire_bytes=p.wire_bytes * groups, hbm_bytes=p.hbm_bytes * groups,
                   copy_bytes=p.copy_bytes * groups)
