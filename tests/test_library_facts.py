"""Library facts live in the library: MoE layout exchange in dispatch lowering, remap sensitivity,
and the prefill → decode KV transfer as p2p ops the engine replays."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import compose_run, make_library

from stratacl.config import DataPath
from stratacl.engine.replay import simulate
from stratacl.machine.fabric import Fabric
from stratacl.trace import Trace


@pytest.fixture(scope="module")
def fab() -> Fabric:
    return Fabric(compose_run().fabric)


def _standalone(phases) -> float:  # noqa: ANN001
    return sum(p.standalone_s() for p in phases)


@pytest.mark.parametrize("preset", ["hccl", "stratacl", "deepep"])
def test_ht_dispatch_adds_the_count_exchange_and_ll_does_not(fab: Fabric, preset: str) -> None:
    lib = make_library(fab, preset)
    n = 16
    group = tuple(range(n))
    peer = tuple(float(x) for x in np.full(n * n, 4096.0))
    size = 4096.0 * n
    plain = _standalone(lib.collective_phases("dispatch", size, group, peer, "ll"))
    counts = _standalone(lib.collective_phases("alltoall", 4 * n, group))  # one int32 count per peer
    ht = _standalone(lib.collective_phases("dispatch", size, group, peer, "ht"))
    # DeepEP's HT dispatch also waits on the host for the received counts (README): its 25 µs host
    # round trip (conf/library/deepep.yaml); HCCL's all-to-all-v waits on the host in both modes and
    # StrataCL in neither, so HT adds none there
    host = {"deepep": 25e-6}.get(preset, 0.0)
    assert ht == pytest.approx(plain + counts + host)
    assert counts > 0
    off = make_library(fab, preset, moe_layout_exchange=False)
    assert _standalone(off.collective_phases("dispatch", size, group, peer, "ht")) == pytest.approx(plain + host)
    # combine never exchanges counts: the layout is the dispatch's, reversed
    assert _standalone(lib.collective_phases("combine", size, group, peer, "ht")) == pytest.approx(
        _standalone(lib.collective_phases("combine", size, group, peer, "ll")))


def test_only_registration_on_allocation_cares_about_remaps(fab: Fabric) -> None:
    for path in DataPath:
        lib = make_library(fab, "hccl", data_path=path)
        assert lib.cost_depends_on_mapping == (path == DataPath.on_alloc)


@pytest.mark.parametrize("launch_us", [0.0, 700.0, 1e6])
def test_the_die_states_the_graph_launch_every_library_pays(launch_us: float) -> None:
    """A captured step's graph launch is the die's (fabric.die.graph_launch_us), the same under
    every library: a device-driven MoE step pays one; a step holding H host-synchronising operators
    runs eagerly (H + 1 split graphs would cost more): no launch, H round trips."""
    fab = Fabric(compose_run([f"fabric.die.graph_launch_us={launch_us}"]).fabric)
    device, host = make_library(fab, "stratacl"), make_library(fab, "hccl")
    syncs = {name: 61 * sum(lib.needs_host(c, "ll") for c in ("dispatch", "combine"))
             for name, lib in (("device", device), ("host", host))}
    assert syncs == {"device": 0, "host": 2 * 61}  # HCCL's all-to-all-v dispatch and combine need the host
    assert device.step_graph_launch_s(syncs["device"]) == pytest.approx(launch_us * 1e-6)
    assert host.step_graph_launch_s(syncs["host"]) == 0.0
    assert host.cfg.host_roundtrip_us == 25.0  # each of those operators' round trip (hccl.yaml), in its phases


def test_trace_rejects_moe_mode_on_other_collectives() -> None:
    tr = Trace(world_size=2)
    tr.add_family("w", [range(2)])
    tr.collective("allreduce", "w", 1024, moe_mode="ht")
    with pytest.raises(Exception, match="moe_mode"):
        tr.validate()


def test_kv_transfer_is_replayed_on_the_tier_placement_gives(fab: Fabric) -> None:
    """A prefill die sends to a decode die on another node: the p2p runs at the inter-node tier
    (α + sync + bytes/β); on the same node it is faster. No tier is hard-coded in the workload.
    conf/fabric/cloudmatrix384.yaml: node tier α 0.7 + sync 1.3 µs at 170 GB/s, inter-node 2.1 +
    2.1 µs at 150 GB/s; stratacl launches in 5 µs and its device-triggered SDMA starts after one
    descriptor write and the engine's start-up (die.sdma, calibrated)."""
    lib = make_library(fab, "stratacl")
    nbytes = 64 << 20

    def kv_time(dst: int) -> float:
        tr = Trace(world_size=dst + 1)
        tr.add("p2p", [0, dst], src=[0], dst=[dst], nbytes=nbytes)
        return simulate(tr, lib).makespan_s

    far, near = kv_time(fab.dies_per_node * 4), kv_time(2)  # die 64: node 4; die 2: die 0's node
    fixed = 5e-6 + fab.sdma_descriptor_s["device"] + fab.sdma_startup_s  # launch + first descriptor + start-up
    assert far == pytest.approx(fixed + 2.1e-6 + 2.1e-6 + nbytes / 150e9, rel=1e-9)
    assert near == pytest.approx(fixed + 0.7e-6 + 1.3e-6 + nbytes / 170e9, rel=1e-9)


def test_prefill_trace_carries_layer_wise_kv_sends_that_conserve_bytes() -> None:
    from test_llm_infer import OVERRIDES

    from stratacl.comm.library import LibraryModel
    from stratacl.workload_api import RunContext
    from workloads.common.model import model_costs
    from workloads.llm_infer.costs import ServingCosts
    from workloads.llm_infer.iteration import IterationModel

    cfg = compose_run([*OVERRIDES[:-1], "library=[stratacl]", "baseline=stratacl", "workload.scheduler.tbo=false",
                       "workload.scheduler.mtp=false", "workload.skew=uniform"])
    fab = Fabric(cfg.fabric)
    ctx = RunContext(cfg, fab, {"stratacl": LibraryModel("stratacl", cfg.library["stratacl"], fab)},
                     "stratacl", 0)
    mc = model_costs(cfg.workload.model, "")
    costs = ServingCosts(mc, 4, 4, 1024)
    # MLA caches the compressed KV (kv_lora_rank 64) and the RoPE key (qk_rope_head_dim 16) per layer
    # in bf16: 3 layers × (64 + 16) × 2 B (test_llm_infer.TINY)
    kv_tok = 3 * (64 + 16) * 2.0
    assert mc.kv_bytes_per_token() == kv_tok
    decode = (32, 33)
    it = IterationModel(ctx, costs, cfg.workload, kv_bytes_per_token=kv_tok, decode_dies=decode)
    tokens = 1024
    tr = it.trace("prefill", tokens, 0)
    kv = [op for op in tr.ops if op.stream == "kv"]
    assert kv and all(set(op.dst) <= set(decode) and set(op.src) <= set(range(4)) for op in kv)
    sent = sum(op.nbytes[0] * len(op.src) for op in kv)
    assert sent == pytest.approx(4 * tokens * kv_tok)  # every prefill die ships its tokens' KV
    st = it.prefill("stratacl", tokens)
    assert st.kv_ready_s >= st.time_s - 1e-12
    # without destinations there is nothing to send, and the iteration itself is unchanged
    bare = IterationModel(ctx, costs, cfg.workload)
    assert not [op for op in bare.trace("prefill", tokens, 0).ops if op.stream == "kv"]
    assert bare.prefill("stratacl", tokens).time_s == pytest.approx(st.time_s, rel=0.05)
